"""The benchmark suite (``losslens bench``); each module prints its rows and can write them as JSON."""

from __future__ import annotations

import json
from pathlib import Path


def emit(rows: list[dict], json_path: str | None = None) -> list[dict]:
    """Print each row as one JSON line and, with ``json_path``, write them all to that file."""
    for r in rows:
        print(json.dumps(r, default=str))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    return rows


def show_table(text: str, markdown_path: str | Path | None = None) -> str:
    """Print a Markdown table and, with ``markdown_path``, write it to that file."""
    print(text)
    if markdown_path:
        Path(markdown_path).write_text(text + "\n")
    return text
