"""The server's defences, under the page: what a request may send and the ASGI guard that holds
every request to it before Gradio reads it (`limits`, `bodies`, `guard`), each upload a path of
its own (`uploads`), who a visitor is (`visitors`), the device line a run waits in with its Stops
(`line`), and what the server keeps of each session (`sessions`). No page, no model: the page
(`app.ui`, `app.handlers`) wires these in.

Gradio internals these rely on (pinned to gradio 6.31.0; an upgrade that breaks them fails the
test named):
- `App.get_blocks()`, to find the page's `Guard` for each request, and `App.uploaded_file_dir`
  and `Blocks.upload_file_set`, where uploads land and which ones Gradio's sweep deletes
  (`guard`, `uploads`): `tests/test_limits.py` (each address's budget, the room on disk, two
  visitors' same file);
- `Blocks._queue.pending_messages_per_session`, `.event_ids_to_events` and
  `.pending_event_ids_session`, to find an event stream's session (`guard`): `tests/test_limits.py`
  (`test_polls_of_unknown_sessions_are_answered_in_one_line_and_log_nothing`),
  `tests/test_sessions.py` (`test_a_run_whose_client_never_listens_is_dropped_and_never_holds_the_device`)
  and the plain-HTTP runs of `tests/test_app_e2e.py` (`raw_run`);
- `StateHolder.lock`, `.time_last_used`, `.session_data` and `.delete_state`, to forget idle
  sessions (`sessions.forget_idle`): `tests/test_sessions.py`
  (`test_a_session_idle_past_its_time_is_forgotten_and_a_recent_one_kept`,
  `test_the_servers_memory_stays_flat_over_200_runs_from_new_sessions`);
- `gradio.utils.get_upload_folder`, the upload folder outside a served app (`guard`; `app.replay`
  too): `tests/test_open_paths.py`.
(`app.ui.refusing_short_calls` patches `Blocks.validate_inputs` on the instance: `tests/test_app_e2e.py`.)
The public API covers none of these: `state_session_capacity` bounds sessions by count, not by
idle time; `gr.State(time_to_live=...)` frees a session's values but keeps its copy of the
page's config (the 90 kB `sessions` is about); `demo.unload` fires when a browser tab closes,
never for an API script's session. So the sweep stays.
"""
