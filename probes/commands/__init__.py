"""CLI commands. Each command is a plain module-level function (callable from Python and from tests,
e.g. ``probes.commands.sharpness.sharpness("ckpt", as_json=True)``); a module that has commands
defines ``register(app: typer.Typer) -> None``, which :mod:`probes.cli` calls for every module of
this package, so rooms add commands without editing a shared file. Options several commands share
are option groups declared once in :mod:`probes.commands._shared` (:mod:`probes.commands._options`
expands them into a command's CLI signature)."""
