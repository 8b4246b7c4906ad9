"""CLI commands. Each command is a plain module-level function (callable from Python and from tests,
e.g. ``losslens.cli.sharpness_command.sharpness("ckpt", as_json=True)``); a module that has commands
defines ``register(app: typer.Typer) -> None``, which :mod:`losslens.cli.app` calls for every module of
this package, so rooms add commands without editing a shared file. Options several commands share
are option groups declared once in :mod:`losslens.cli.option_groups` (:mod:`losslens.cli.option_parsing`
expands them into a command's CLI signature)."""
