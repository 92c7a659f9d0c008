"""Launch the PPSD demo: `python app.py [--host H] [--port P]` (also GRADIO_SERVER_NAME /
GRADIO_SERVER_PORT). The composition root: reads arguments and the environment, nothing else."""

from __future__ import annotations

import argparse
import os

from app import create_demo, launch_kwargs
from app.ui import QUEUE_SIZE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    args = parser.parse_args(argv)
    demo = create_demo()
    demo.queue(max_size=QUEUE_SIZE)
    demo.launch(server_name=args.host, server_port=args.port, **launch_kwargs())


if __name__ == "__main__":
    main()
