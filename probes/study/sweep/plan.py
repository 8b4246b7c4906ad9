"""Sweep plans: which probes run on which checkpoints, with which data and seeds.

A :class:`Plan` is plain, frozen data. It is declared in Python::

    Plan(quant=("rtn:3", "rtn:4", "gptq:3"), trace=TraceProbe("hutch++", 100), eigen=EigenProbe(k=1),
         kurtosis=True, directional=("rtn:4",), lawa=(4,))

or in a TOML / YAML / JSON file (:meth:`Plan.from_file`)::

    name = "wsd-study"
    seed = 0
    lawa = [4]                      # derived checkpoints: LAWA of the last k checkpoints
    curvature_params = ["*layers*"] # parameter globs for every curvature probe (default: all)

    [data]                          # token sets: (n_batches, batch, seq) each, built once per study
    source = "embedded"             # or a text file path
    seed = 0
    eval = [8, 4, 64]
    calibration = [4, 4, 64]
    curvature = [2, 4, 64]

    [probes]
    loss = true
    quant = ["rtn:3", "rtn:4", "int8", "gptq:3", "gptq:4"]
    trace = { method = "hutch++", num_matvecs = 100 }
    eigen = { k = 1, method = "power" }
    block_trace = { groups = "module", num_matvecs = 50 }
    directional = ["rtn:4"]
    kurtosis = true
    explain = { specs = ["rtn:4", "gptq:4"], blocks = ["layer", "kind"], trace_matvecs = 30 }
    accuracy = { tasks = ["embedded"], specs = ["rtn:4"], limit = 200 }

Validation happens at construction: an unknown probe, option, trace method or quantizer spec
raises :class:`PlanError` naming the valid choices. :attr:`Plan.hash` is a SHA-256 of the
canonical JSON of everything that changes a number (the ``name`` is excluded), stored in the
results store's metadata so a store is never silently mixed with another plan's rows.

A plan expands into :class:`Task` s, one per stored row key ``(probe, spec)`` per checkpoint, in
execution order (cheap probes first). Each task carries a ``config_hash`` of exactly the settings
that produce its numbers, so resuming a store reuses a row only when it was computed the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from losslens.geometry.operators.names import DEFAULT_BACKEND
from losslens.measure.probes.registry import PROBES, REGISTRY
from losslens.measure.probes.tasks import Task
from losslens.measure.probes.validation import PlanError, canonical_spec, settings_from_table as _build

DATA_SETS = ("eval", "calibration", "curvature")


@dataclass(frozen=True)
class DataSpec:
    """The three token sets of a study (docs/science.md §1): shapes ``(n_batches, batch, seq)``.

    ``source``: 'embedded' (the held-out part of the package's corpus) or a path to a text file /
    folder. ``files``: optional ``{set_name: path}`` of saved :class:`TokenSet` files that replace
    building. ``fit_context``: cap each built set's seq at the model's ``max_position_embeddings``
    (the data hash records the shapes actually used).
    """

    eval: tuple[int, int, int] = (8, 4, 64)
    calibration: tuple[int, int, int] = (4, 4, 64)
    curvature: tuple[int, int, int] = (2, 4, 64)
    seed: int = 0
    source: str = "embedded"
    files: tuple[tuple[str, str], ...] = ()
    fit_context: bool = True

    def __post_init__(self):
        for name in DATA_SETS:
            shape = getattr(self, name)
            if not (
                isinstance(shape, (tuple, list))
                and len(shape) == 3
                and all(isinstance(x, int) and x > 0 for x in shape)
            ):
                raise PlanError(f"data.{name} must be three positive integers (n_batches, batch, seq), got {shape!r}")
            object.__setattr__(self, name, tuple(int(x) for x in shape))
        files = self.files
        if isinstance(files, Mapping):
            files = tuple(sorted((str(k), str(v)) for k, v in files.items()))
        for k, _ in files:
            if k not in DATA_SETS:
                raise PlanError(f"data.files key {k!r} is unknown; valid: {', '.join(DATA_SETS)}")
        object.__setattr__(self, "files", tuple(files))

    @property
    def shapes(self) -> dict[str, tuple[int, int, int]]:
        return {n: getattr(self, n) for n in DATA_SETS}


# --------------------------------------------------------------------------- the plan
def _with_probe_fields(cls):
    """Add one field per registered probe (its settings, default off) to the shared fields, then make
    ``cls`` a frozen dataclass: a new probe needs no edit here."""
    annotations = cls.__dict__.get("__annotations__", {})
    for p in REGISTRY:
        annotations[p.name] = p.annotation
        setattr(cls, p.name, p.default)
    cls.__annotations__ = annotations
    return dataclass(frozen=True)(cls)


@_with_probe_fields
class Plan:
    """What a sweep measures. See the module docstring for the file format.

    Shared fields: ``data`` (:class:`DataSpec`), ``curvature_params`` (parameter globs of every
    curvature probe; default all), ``quant_modules`` (module globs to quantize; default every Linear
    in the decoder blocks), ``lawa`` (k values: one derived LAWA checkpoint of the last k
    checkpoints each), ``checkpoints`` (labels to keep; default all), ``seed`` (estimator seed),
    ``name``, ``max_memory`` (bytes or ``"8GB"`` each curvature estimator may allocate beyond the
    model; None: losslens.geometry.memory.model's default), ``backend`` (the HVP backend of every curvature
    probe: reverse, forward, difference, auto), ``compute_dtype`` (the dtype their products run in:
    float32, bfloat16, float16, float64; None: float32 for half-precision weights, their dtype
    otherwise: :mod:`losslens.geometry.operators.precision`).

    Then one field per probe of :data:`losslens.measure.probes.registry.REGISTRY`, holding its settings
    (each probe's module says what they are): ``loss`` (on by default), ``kurtosis``, ``quant`` and
    ``directional`` (quantizer specs), ``trace``, ``eigen``, ``block_trace``, ``explain``,
    ``accuracy`` (a settings class or None).
    """

    data: DataSpec = field(default_factory=DataSpec)
    curvature_params: tuple[str, ...] | None = None
    quant_modules: tuple[str, ...] | None = None
    lawa: tuple[int, ...] = ()
    checkpoints: tuple[str, ...] | None = None
    seed: int = 0
    name: str = "sweep"
    max_memory: int | str | None = None
    backend: str = DEFAULT_BACKEND
    compute_dtype: str | None = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        for p in REGISTRY:
            set_(p.name, p.settings(getattr(self, p.name)))
        if isinstance(self.data, Mapping):
            set_("data", _build(DataSpec, self.data, "data"))
        elif not isinstance(self.data, DataSpec):
            raise PlanError(f"data must be a DataSpec or a table, got {self.data!r}")
        for name in ("curvature_params", "quant_modules", "checkpoints"):
            v = getattr(self, name)
            if v is None:
                continue
            v = (v,) if isinstance(v, str) else tuple(v)
            if not v or not all(isinstance(x, str) and x for x in v):
                raise PlanError(f"{name} must be a non-empty list of strings, got {getattr(self, name)!r}")
            set_(name, v)
        lawa = (self.lawa,) if isinstance(self.lawa, int) else tuple(self.lawa)
        for k in lawa:
            if not isinstance(k, int) or isinstance(k, bool) or k < 2:
                raise PlanError(f"lawa entries are k >= 2 (average of the last k checkpoints), got {k!r}")
        set_("lawa", lawa)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise PlanError(f"seed must be an integer, got {self.seed!r}")
        if self.max_memory is not None:
            from losslens.geometry.memory.budget import MemoryBudgetError, parse_bytes

            try:
                parse_bytes(self.max_memory)
            except MemoryBudgetError as exc:
                raise PlanError(f"max_memory: {exc}") from exc
        from losslens.geometry.operators.names import BACKENDS

        if self.backend not in BACKENDS:
            raise PlanError(f"backend {self.backend!r} is unknown; valid: {', '.join(BACKENDS)}")
        from losslens.geometry.operators.precision import COMPUTE_DTYPES

        if self.compute_dtype is not None and self.compute_dtype not in COMPUTE_DTYPES:
            raise PlanError(f"compute_dtype {self.compute_dtype!r} is unknown; valid: {', '.join(COMPUTE_DTYPES)}")
        if not self.tasks():
            raise PlanError("the plan has no probe; enable at least one of: " + ", ".join(PROBES))

    # ----------------------------------------------------------------- construction
    @classmethod
    def default(cls, quick: bool = False, **overrides) -> "Plan":
        """The plan for the embedded trajectory: loss, RTN 3/4 (g128), INT8, GPTQ 3/4 (g128),
        Hutch++ with 100 HVPs, λ_max by Lanczos (tol 1e-3, ≤ 100 steps), kurtosis, directional
        curvature along RTN-4; the curvature set is one batch of 8 × 64 tokens.
        ``quick`` shrinks the data and HVP budget for smoke tests.

        Since issue #14 (a new plan hash: stores of the earlier default need ``allow_mixed`` or a
        new file) λ_max is found by Lanczos instead of power iteration, and the curvature set's
        8 sequences form one batch instead of two of 4 (the same tokens, so the same Hessian: the
        numbers move by rounding only, and an HVP costs ~10% less, measured 22 vs 24 ms on the
        0.17M model and 91 vs 100 ms on the 1.06M model of benchmarks/sweep.py, 1 thread). Accuracy,
        measured on checkpoints of both models against Lanczos at tol 1e-7:

        - trace: unchanged (same tokens, probes and budget): Hutch++ relative standard error
          1.0–1.4%, its spread over 8 probe seeds 0.7–1.1%. Halving the budget would give 1.5%.
          The curvature set itself moves the trace far more: 9–11% between 5 disjoint sets of the
          same size, so the trace's error bars describe the probes only.
        - λ_max: relative error ≤ 1.3e-6 and residual ‖Hv − λv‖/λ ≤ 1e-3 in 8–23 HVPs (Lanczos,
          converged flag checked on the true residual); power iteration took 6–16 HVPs for a
          relative error of 2e-5–3e-3, residuals 0.3–2%, and once stopped 11% low while reporting
          convergence (its test, the Rayleigh quotient changing by < 1e-3, can stall).
        """
        kw: dict[str, Any] = dict(
            loss=True,
            quant=("rtn:3", "rtn:4", "int8", "gptq:3", "gptq:4"),
            trace={"method": "hutch++", "num_matvecs": 30 if quick else 100},
            eigen={"k": 1, "method": "lanczos", "tol": 1e-3, "max_iter": 20 if quick else 100},
            directional=("rtn:4",),
            kurtosis=True,
            name="default",
            data=DataSpec(curvature=(1, 8, 64)),
        )
        if quick:
            kw["data"] = DataSpec(eval=(4, 4, 64), calibration=(2, 4, 64), curvature=(1, 4, 64))
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        """Build from a nested mapping (the parsed TOML/YAML/JSON). Probes may sit under a
        ``[probes]`` table or at top level. Unknown keys raise :class:`PlanError` listing valid ones."""
        if not isinstance(d, Mapping):
            raise PlanError(f"a plan must be a table/mapping, got {type(d).__name__}")
        d = dict(d)
        probes = d.pop("probes", {}) or {}
        if not isinstance(probes, Mapping):
            raise PlanError("[probes] must be a table mapping probe names to their settings")
        unknown = [k for k in probes if k not in PROBES]
        if unknown:
            raise PlanError(f"unknown probe(s) {unknown}; valid probes: {', '.join(PROBES)}")
        valid_top = {f.name for f in fields(cls)}
        unknown = [k for k in d if k not in valid_top]
        if unknown:
            raise PlanError(f"unknown plan key(s) {unknown}; valid keys: probes, {', '.join(sorted(valid_top))}")
        both = [k for k in probes if k in d]
        if both:
            raise PlanError(f"probe(s) {both} given both at top level and under [probes]")
        kw = {**d, **probes}
        # An unlisted probe is off (the ones on by default included) when a [probes] table is given.
        if probes:
            kw.update({p.name: False for p in REGISTRY if p.default is True and p.name not in kw})
        return cls(**kw)

    @classmethod
    def from_file(cls, path: str | Path) -> "Plan":
        """Read a plan from ``.toml`` (tomllib), ``.yaml``/``.yml`` (PyYAML) or ``.json``."""
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"no plan file at {path}")
        text = path.read_text(encoding="utf-8")
        suffix = path.suffix.lower()
        try:
            if suffix == ".toml":
                try:
                    import tomllib
                except ModuleNotFoundError:  # pragma: no cover - python 3.10
                    import tomli as tomllib
                d = tomllib.loads(text)
            elif suffix in (".yaml", ".yml"):
                import yaml

                d = yaml.safe_load(text) or {}
            elif suffix == ".json":
                d = json.loads(text)
            else:
                raise PlanError(f"{path}: plan files are .toml, .yaml/.yml or .json")
        except PlanError:
            raise
        except Exception as exc:
            raise PlanError(f"{path} is not a valid {suffix[1:]} file: {exc}") from exc
        data = d.get("data") if isinstance(d, Mapping) else None
        if isinstance(data, Mapping):  # relative data paths are relative to the plan file
            data = dict(data)
            base = path.resolve().parent
            if isinstance(data.get("files"), Mapping):
                data["files"] = {
                    k: str(base / v) if not Path(str(v)).expanduser().is_absolute() else str(Path(str(v)).expanduser())
                    for k, v in data["files"].items()
                }
            src = data.get("source")
            if (
                isinstance(src, str)
                and src != "embedded"
                and ":" not in src
                and not Path(src).expanduser().is_absolute()
            ):
                data["source"] = str(base / src)
            d = {**d, "data": data}
        return cls.from_dict(d)

    # ----------------------------------------------------------------- identity
    def to_dict(self) -> dict:
        """Canonical plain-data form (JSON-serialisable; ``from_dict(to_dict())`` round-trips): the
        shared fields, and under ``probes`` each probe's settings that are on."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in PROBES}
        d["data"] = {
            **asdict(self.data),
            "files": dict(self.data.files),
            **{k: list(getattr(self.data, k)) for k in DATA_SETS},
        }
        d["lawa"] = list(self.lawa)
        for k in ("curvature_params", "quant_modules", "checkpoints"):
            if d[k] is not None:
                d[k] = list(d[k])
        probes = {p.name: p.to_dict(getattr(self, p.name)) for p in REGISTRY}
        d["probes"] = {k: v for k, v in probes.items() if v not in (None, False, [], ())}
        if d["max_memory"] is None:  # absent, so plans of the first release keep their hash
            d.pop("max_memory")
        from losslens.geometry.operators.names import is_default_backend

        if is_default_backend(d["backend"]):  # absent by default, so earlier plans keep their hash
            d.pop("backend")
        if d["compute_dtype"] is None:  # absent by default, so earlier plans keep their hash
            d.pop("compute_dtype")
        return d

    @property
    def hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of the plan without its ``name``."""
        d = self.to_dict()
        d.pop("name", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def replace(self, **kw) -> "Plan":
        return replace(self, **kw)

    # ----------------------------------------------------------------- expansion
    def tasks(self) -> list[Task]:
        """Row keys per checkpoint, in execution order: each registered probe's tasks in turn (loss,
        kurtosis, quant…, directional…, trace, eigen, block_trace, explain…, accuracy…)."""
        return [t for p in REGISTRY for t in p.tasks(self)]

    @property
    def needs_curvature(self) -> bool:
        return any(t.curvature for t in self.tasks())


# --------------------------------------------------------------------------- helpers
def load_plan(plan: "Plan | str | Path | Mapping | None", quick: bool = False) -> Plan:
    """A :class:`Plan` from a Plan, a file path, a mapping, or None (the default plan)."""
    if plan is None:
        return Plan.default(quick=quick)
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mapping):
        return Plan.from_dict(plan)
    if isinstance(plan, (str, Path)):
        return Plan.from_file(plan)
    raise PlanError(f"cannot make a plan from {type(plan).__name__}")


__all__ = [
    "Plan",
    "PlanError",
    "DataSpec",
    "Task",
    "PROBES",
    "canonical_spec",
    "load_plan",
]
