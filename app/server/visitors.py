"""Who a visitor is, for the device line's fairness: an address, not a name the client picks.

A Gradio session (`session_hash`) is chosen by the client, so one script with many sessions
would be many visitors. The address is harder to multiply: locally it is the TCP peer; on a
Space, whose proxy is the peer of every request, it is the address that proxy reports, the entry
it appends to `X-Forwarded-For` (`proxy_hops` from the right: entries further left were sent by
the client and prove nothing). uvicorn by default believes `X-Forwarded-For` from 127.0.0.1 and
rewrites the peer with it, so a local script could name itself anything:
`distrust_forwarded_headers` turns that off before the server starts.

Plain functions over a request's peer and headers; no Gradio state, no line.
"""

from __future__ import annotations

import os
from typing import Any

FORWARDED = "x-forwarded-for"


def proxy_hops_from_environment() -> int:
    """How many proxies in front of this server append to `X-Forwarded-For`: PPSD_PROXY_HOPS,
    else 1 on a Hugging Face Space (SPACE_ID is set: its proxy), else 0 (a visitor's own address
    is the peer). ValueError names a setting that is not a whole number >= 0."""
    setting = os.environ.get("PPSD_PROXY_HOPS", "").strip()
    if not setting:
        return 1 if os.environ.get("SPACE_ID") else 0
    if not (setting.isascii() and setting.isdigit()):  # "²" is a digit to isdigit(), not to int()
        raise ValueError(f"PPSD_PROXY_HOPS={ascii(setting)}: give how many proxies stand in front of the server "
                         "and append to X-Forwarded-For, as a whole number (0, 1, ...)")
    return int(setting)


def distrust_forwarded_headers() -> None:
    """Make uvicorn keep the TCP peer as the request's client, whatever `X-Forwarded-For` says
    (it trusts the header from 127.0.0.1 unless FORWARDED_ALLOW_IPS says otherwise). An owner who
    set FORWARDED_ALLOW_IPS keeps that setting. Call before the server starts."""
    os.environ.setdefault("FORWARDED_ALLOW_IPS", "")


def visitor(request: Any, proxy_hops: int = 0) -> str:
    """The address a request counts under: the peer, or with `proxy_hops` proxies in front, the
    entry the outermost of them appended to `X-Forwarded-For` (the peer if the header has fewer).
    `request` is a `gr.Request` or anything with `.client.host` and `.headers`; "unknown" when
    there is no request (a direct call)."""
    client = getattr(request, "client", None)
    peer = str(getattr(client, "host", "") or "unknown")
    if proxy_hops <= 0 or request is None:
        return peer
    headers = getattr(request, "headers", None) or {}
    values = [headers.get(FORWARDED, "")] if not hasattr(headers, "getlist") else headers.getlist(FORWARDED)
    entries = [e.strip() for value in values for e in str(value).split(",") if e.strip()]
    return entries[-proxy_hops] if len(entries) >= proxy_hops else peer
