"""The server's defences, under the page: what a request may send and the ASGI guard that holds
every request to it before Gradio reads it (`limits`, `bodies`, `guard`), each upload a path of
its own (`uploads`), who a visitor is (`visitors`), the device line a run waits in with its Stops
(`line`), and what the server keeps of each session (`sessions`). No page, no model: the page
(`app.ui`, `app.handlers`) wires these in.

Gradio internals these rely on (pinned to gradio 6.31.0; an upgrade that breaks them fails the
test named):
- `Blocks._queue.pending_messages_per_session` and `.event_ids_to_events`, to find an event
  stream's session (`guard`): `tests/test_sessions.py`
  (`test_a_run_whose_client_never_listens_is_dropped_and_never_holds_the_device`) and
  `tests/test_limits.py`;
- `StateHolder.lock`, `.time_last_used`, `.session_data` and `.delete_state`, to forget idle
  sessions (`sessions.forget_idle`): `tests/test_sessions.py`
  (`test_a_session_idle_past_its_time_is_forgotten_and_a_recent_one_kept`,
  `test_the_servers_memory_stays_flat_over_200_runs_from_new_sessions`);
- `gradio.utils.get_upload_folder`, where uploads are kept (`guard`; `app.replay` too): `tests/test_limits.py`.
(`app.ui.refusing_short_calls` patches `Blocks.validate_inputs` on the instance: `tests/test_app_e2e.py`.)
Gradio's public `state_session_capacity` bounds sessions by count, not by idle time, so the
sweep stays.
"""
