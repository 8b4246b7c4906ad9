"""``python -m probes.sweep ARGS`` = ``losslens ARGS`` (e.g.
``python -m probes.sweep sweep runs/wsd --out r.sqlite``)."""

from probes.cli import app

if __name__ == "__main__":  # pragma: no cover - exercised by the subprocess tests
    app(prog_name="losslens")
