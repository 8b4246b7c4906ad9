"""Every backend name and every probe name is written once (issue #46).

Each backend class carries its name (:mod:`losslens.geometry.operators.names` builds the rest from the
classes) and each probe module its probe's name (:mod:`losslens.measure.probes.registry`); every other
module asks those. This test reads the library's string constants with :mod:`ast` (docstrings and
comments left out) and checks that each name occurs as a whole string literal in its home module and
in no other, apart from the modules listed below, where the same word means something else (a
vectorize mode, a surface column, an explain factor, ...) or that another engineer still has to move
(:data:`NOT_YET`: prune it as those modules move).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from losslens.geometry.operators.names import BACKEND_CLASSES
from losslens.measure.probes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]

#: (name, module) -> why the literal there is not the backend's or the probe's name.
OTHER_MEANINGS = {
    ("auto", "geometry/estimators/density.py"): "reorth='auto'",
    ("auto", "geometry/operators/reverse.py"): "vectorize='auto'",
    ("auto", "probes/lm/models/miniature.py"): "the second-order check's precision='auto'",
    ("auto", "probes/lm/models/second_order.py"): "the second-order check's precision='auto'",
    ("auto", "probes/lm/models/lm_setup.py"): "the second-order check's precision='auto'",
    ("auto", "probes/cli/sweep_command.py"): "--threads' default: the cores shared out between workers",
    ("auto", "probes/study/report/explain_figures.py"): "plotly tickmode='auto'",
    ("auto", "probes/study/report/figure_parts.py"): "plotly tickmode='auto'",
    ("auto", "probes/study/report/figures.py"): "plotly tickmode='auto'",
    ("difference", "probes/study/bench_suite.py"): "the benchmark called 'difference'",
    ("loss", "geometry/estimators/attribution.py"): "a factor of the quadratic attribution",
    ("loss", "geometry/estimators/directional.py"): "a directional estimate's field",
    ("loss", "geometry/surfaces/resume.py"): "a loss surface's column",
    ("loss", "geometry/surfaces/surface.py"): "a loss surface's column",
    ("loss", "probes/lm/checkpoints/records.py"): "a checkpoint record's field",
    ("loss", "probes/measure/explain/explanation.py"): "an explain factor (FACTOR_METRICS)",
    ("loss", "probes/study/analysis/explain_shares.py"): "an explain factor (FACTOR_METRICS)",
    ("loss", "probes/study/analysis/phases.py"): "the series key of the FP loss metric",
    ("loss", "probes/study/report/explain_figures.py"): "an explain factor (FACTOR_METRICS)",
    ("loss", "probes/study/report/landscape_figures.py"): "a loss surface's column",
    ("loss", "probes/study/report/pages.py"): "a loss surface's column",
    ("loss", "probes/study/report/surface_figures.py"): "a loss surface's column",
    ("trace", "geometry/estimators/attribution.py"): "a factor of the quadratic attribution",
    ("trace", "probes/measure/explain/direction.py"): "an explain factor (FACTOR_METRICS)",
    ("trace", "probes/measure/explain/explanation.py"): "an explain factor (FACTOR_METRICS)",
    ("trace", "probes/measure/sharpness.py"): "a section of `losslens sharpness`'s result",
    ("trace", "probes/study/analysis/explain_shares.py"): "an explain factor (FACTOR_METRICS)",
    ("trace", "probes/study/report/explain_figures.py"): "an explain factor (FACTOR_METRICS)",
    ("eigen", "probes/measure/sharpness.py"): "a section of `losslens sharpness`'s result",
    ("trace", "probes/cli/sharpness_command.py"): "a section of `losslens sharpness`'s result (printed)",
    ("eigen", "probes/cli/sharpness_command.py"): "a section of `losslens sharpness`'s result (printed)",
    ("explain", "probes/__init__.py"): "the function losslens.explain (lazy exports)",
    ("accuracy", "probes/__init__.py"): "the function losslens.accuracy (lazy exports)",
    (
        "accuracy",
        "probes/measure/accuracy/checkpoint_accuracy.py",
    ): "the function accuracy's name (keywords) and __all__",
    ("accuracy", "probes/measure/accuracy/variants.py"): "the progress label of `losslens accuracy`",
    ("loss", "probes/study/report/labels.py"): "the checkpoint record's loss column, given its human label",
    ("explain", "probes/measure/explain/__init__.py"): "the function explain in __all__",
    ("explain", "probes/measure/explain/explanation.py"): "the function explain in __all__",
    ("explain", "probes/measure/checkpoint_explanation.py"): "the function losslens.explain and its __all__",
    ("loss", "probes/measure/probes/directional.py"): "the loss at the quantized point (a row's extra)",
    ("loss", "probes/measure/probes/grad_norm.py"): "grad_norm's metric: the loss where the gradient is taken",
    ("trace", "probes/measure/probes/block_trace.py"): "block_trace's metric: one block's trace",
    ("kurtosis", "probes/measure/checkpoint_quantization.py"): "the quantization error's kurtosis (a result key)",
    ("kurtosis", "probes/cli/quantize_command.py"): "the quantization error's kurtosis (a table column)",
    ("loss", "probes/study/monitor/hf.py"): "transformers.Trainer's log_history key of the training loss",
    ("loss", "probes/study/monitor/monitor.py"): "the monitor's logged value of the FP loss (stored_values' key)",
    ("loss", "probes/study/monitor/monitor_rows.py"): "the monitor's logged value of the FP loss (stored_values' key)",
    ("trace", "probes/study/monitor/monitor_rows.py"): "the monitor's logged value of the trace (stored_values' key)",
    ("trace", "probes/study/monitor/memory.py"): "a section of the monitor's memory plan: the trace estimator's",
    ("eigen", "probes/study/monitor/memory.py"): "a section of the monitor's memory plan: the eigen estimator's",
    ("trace", "probes/study/demo/demo_study.py"): "a column of the demo's final table (printed, and in summary.json)",
    ("accuracy", "probes/study/demo/demo_study.py"): "a key of the demo's summary.json (the accuracy verdict's text)",
}

#: (name, module) -> the work left: modules other engineers own right now that still spell the name.
NOT_YET = {
    ("reverse", "probes/lm/shared_settings.py"): "torch-free settings module: needs a torch-free DEFAULT_BACKEND",
}


def _literals(path: Path) -> set[str]:
    """The string constants of ``path`` that are not docstrings (nor bare string statements)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare
    }


@pytest.fixture(scope="module")
def library() -> dict[str, set[str]]:
    files = sorted(p for folder in ("probes", "geometry") for p in (ROOT / folder).rglob("*.py"))
    return {p.relative_to(ROOT).as_posix(): _literals(p) for p in files}


def _file_of(module: str) -> str:
    """``losslens.geometry.x.y`` -> ``geometry/x/y.py``; ``losslens.a.b`` -> ``probes/a/b.py``."""
    parts = module.split(".")[1:]
    if parts[0] == "geometry":
        return "/".join(parts) + ".py"
    return "probes/" + "/".join(parts) + ".py"


HOMES = {cls.name: _file_of(cls.__module__) for cls in BACKEND_CLASSES} | {
    p.name: _file_of(p.run.__module__) for p in REGISTRY
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_name_is_written_in_its_home_module_only(library, name):
    holders = {module for module, literals in library.items() if name in literals}
    assert HOMES[name] in holders, f"{name!r} is not a string literal of its home {HOMES[name]}"
    listed = {m for (n, m) in (*OTHER_MEANINGS, *NOT_YET) if n == name}
    extra = sorted(holders - listed - {HOMES[name]})
    assert not extra, (
        f"{name!r} is written as a string literal in {extra}: ask its class / probe "
        f"({HOMES[name]}) for it instead, or list the module in OTHER_MEANINGS with the word's other meaning"
    )


def test_every_name_has_a_home():
    assert set(HOMES) >= {"reverse", "forward", "difference", "auto", "loss", "trace", "eigen", "quant"}


def test_every_listed_module_still_spells_the_name(library):
    """A module in OTHER_MEANINGS or NOT_YET that no longer writes the name is a stale entry: prune it."""
    stale = sorted((n, m) for (n, m) in (*OTHER_MEANINGS, *NOT_YET) if n not in library.get(m, set()))
    assert not stale, f"listed but no longer written there (remove these entries): {stale}"
