"""``python -m losslens ARGS`` = ``losslens ARGS`` (e.g.
``python -m losslens sweep runs/wsd --out r.sqlite``)."""

from losslens.cli.app import app

if __name__ == "__main__":  # pragma: no cover - exercised by the subprocess tests
    app(prog_name="losslens")
