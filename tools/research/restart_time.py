"""How long a restart takes to have its captured steps ready: `python tools/research/restart_time.py
[--port 7993]`, from the repository root, with the model converted and (for a restart) the compile
kept under PPSD_CACHE.

Starts `python app.py` as a user would, stamps each line it prints with the seconds since launch,
and stops the server (and its workers, by process group) at "The captured steps ready" or after
`--limit` seconds. The last line gives the ready line's time, the captured steps' and the gap
between them: the restart goal of issue 50, whose numbers are in docs/engine.md ("Each step kept
whole").
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7993)
    parser.add_argument("--limit", type=float, default=900.0, help="seconds before giving up")
    args = parser.parse_args()
    began = time.monotonic()
    server = subprocess.Popen([sys.executable, "-u", "app.py", "--port", str(args.port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ready = None
    try:
        for line in server.stdout:
            now = time.monotonic() - began
            print(f"{now:6.1f} s  {line.rstrip()}", flush=True)
            if "PPSD demo ready" in line:
                ready = now
            if "steps ready" in line and ready is not None:
                print(f"ready line {ready:.1f} s, captured steps ready {now:.1f} s, gap {now - ready:.1f} s")
                return
            if now > args.limit:
                sys.exit(f"no 'captured steps ready' within {args.limit:g} s")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
