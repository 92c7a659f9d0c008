"""Where the repository's assets live (embedded tiny model, shipped exit heads, prompt sets)."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
