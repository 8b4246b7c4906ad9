"""One base class for the errors a user can cause (issue #36): every exception class of geometry/ and
probes/ derives from :class:`losslens.geometry.base.errors.LosslensError`, and the CLI prints any of them as
one ``error: …`` line with exit status 2 — no list of names to forget one in."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from typer.testing import CliRunner

import losslens
import losslens.geometry
from losslens.geometry.base.errors import LosslensError
from losslens.cli.app import EXIT_INTERNAL, EXIT_USAGE, app

# Optional dependencies (pyproject extras) a module may import at its top: a module that fails to import
# only because one of these is missing is skipped by name; any other import failure fails the test.
OPTIONAL = {"ray", "accelerate", "lightning", "bitsandbytes", "lm_eval", "kaleido", "gptqmodel"}

# Exception classes that are not errors a user can cause. Each needs a reason.
NOT_USER_ERRORS = {
    # a control-flow signal of the sequential quantizer: raised and caught inside one function, never
    # seen outside it
    "losslens.lm.quant.sequential._Stop",
}


def _modules():
    for pkg in (losslens, losslens.geometry):  # geometry/ is mapped into losslens, not below probes/
        yield pkg.__name__
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            yield info.name


def _exception_classes() -> list[type[BaseException]]:
    found, skipped = [], []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] not in OPTIONAL:
                raise
            skipped.append(name)
            continue
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                found.append(obj)
    return found


CLASSES = _exception_classes()
# warnings (UserWarning subclasses) are emitted with warnings.warn, never raised as errors
ERRORS = [c for c in CLASSES if not issubclass(c, Warning)]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_walk_finds_the_error_classes_of_every_room():
    names = {_name(c) for c in ERRORS}
    for expected in (
        "losslens.lm.models.sharding.ShardingError",
        "losslens.measure.explain.direction.ExplainError",
        "losslens.measure.explain.blocks.BlockError",
        "losslens.lm.core.distributed.DistributedError",
        "losslens.geometry.memory.budget.MemoryBudgetError",
        "losslens.geometry.surfaces.planes.PlaneError",
        "losslens.study.sweep.lock.StoreLockedError",
        "losslens.lm.checkpoints.errors.MissingWeightsError",
    ):
        assert expected in names
    assert len(ERRORS) >= 40, len(ERRORS)
    assert NOT_USER_ERRORS <= {_name(c) for c in CLASSES}, "an allow-listed class no longer exists: drop it"


def test_every_exception_class_of_geometry_and_probes_is_a_losslens_error():
    outside = sorted(_name(c) for c in ERRORS if not issubclass(c, LosslensError) and _name(c) not in NOT_USER_ERRORS)
    assert outside == [], (
        f"derive these from losslens.geometry.base.errors.LosslensError (or allow-list a bug class): {outside}"
    )


def test_the_specific_classes_keep_their_builtin_bases():
    from losslens.geometry.memory.budget import MemoryBudgetError
    from losslens.lm.checkpoints.errors import CheckpointError, MissingWeightsError
    from losslens.lm.models.sharding import ShardingError

    assert issubclass(ShardingError, ValueError) and issubclass(MemoryBudgetError, ValueError)
    assert issubclass(CheckpointError, RuntimeError) and issubclass(MissingWeightsError, FileNotFoundError)


def test_the_base_class_is_a_public_name_of_both_packages():
    assert losslens.geometry.LosslensError is LosslensError and "LosslensError" in losslens.geometry.__all__
    assert losslens.LosslensError is LosslensError and "LosslensError" in losslens.__all__


def test_the_cli_keeps_no_list_of_error_names():
    import losslens.cli.app as cli

    assert not hasattr(cli, "_USER_ERRORS")
    assert LosslensError in cli.user_errors()


def _planted(monkeypatch, exc: BaseException):
    """``losslens sharpness`` with its checkpoint opener replaced by one that raises ``exc`` (in every
    loaded probes module that holds it, wherever the command imports it from)."""
    import sys

    import losslens.lm.checkpoints  # noqa: F401

    def opener(*args, **kwargs):
        raise exc

    for name, module in list(sys.modules.items()):
        if name.startswith("losslens.") and callable(getattr(module, "open_checkpoint", None)):
            monkeypatch.setattr(module, "open_checkpoint", opener)
    return CliRunner().invoke(app, ["sharpness", "nowhere", "--num-matvecs", "3"])


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def test_a_planted_sharding_error_exits_2_with_one_line(monkeypatch):
    from losslens.lm.models.sharding import ShardingError

    r = _planted(monkeypatch, ShardingError("no decoder blocks found in LlamaForCausalLM\npass a model with layers"))
    assert r.exit_code == EXIT_USAGE, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    assert _error_lines(r.output) == ["error: no decoder blocks found in LlamaForCausalLM; pass a model with layers"]


@pytest.mark.parametrize("cls", [c for c in ERRORS if issubclass(c, LosslensError)], ids=_name)
def test_every_losslens_error_is_one_line_and_exit_2(monkeypatch, cls):
    r = _planted(monkeypatch, cls("planted by the test"))
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = _error_lines(r.output)
    assert line.startswith("error:") and "planted by the test" in line and "internal error" not in line


def test_an_error_outside_the_base_is_still_reported_as_a_bug(monkeypatch):
    r = _planted(monkeypatch, ValueError("not a user's error"))
    assert r.exit_code == EXIT_INTERNAL, r.output
    (line,) = _error_lines(r.output)
    assert "internal error ValueError" in line and "--debug" in line
