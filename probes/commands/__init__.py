"""CLI command groups. Each module here defines ``register(app: typer.Typer) -> None``;
:mod:`probes.cli` imports every module of this package and calls it, so rooms add commands
without editing a shared file."""
