"""Quantizer specs: what to quantize with, as a hashable value with a canonical string form.

Grammar (``:``-separated tokens after the method name; order of flags is free when parsing, the
printed form is canonical)::

    rtn:BITS[:GROUP][:sym]                      asymmetric per-group INT-b (docs/science.md §3); default g128
    int8                                        per-channel symmetric absmax INT8 (no other tokens)
    gptq:BITS[:GROUP][:sym][:act][:static][:damp=F][:block=N]
    gptq:BITS:GROUP[:asym][:act][:damp=F]:gptqmodel  the GPTQModel preset (losslens.lm.quant.gptq_preset)
    gptqmodel:BITS[:GROUP][:sym][:act][:damp=F] GPTQ through the optional GPTQModel package
    bnb-int8[:threshold=F]                      bitsandbytes int8 weights (optional package)
    bnb-nf4[:GROUP]                             bitsandbytes NF4, GROUP = its block size (default g64)
    awq:BITS[:GROUP][:sym][:grid=N][:clip=0|1][:shrink=F]  AWQ scale + clip search (losslens.lm.quant.awq); default g128
    fp8[:e5m2][:tensor] | mxfp4 | mxfp8[:e5m2] | nvfp4 | gguf:TYPE   deployment formats (losslens.lm.quant.formats)
    had[N]+SPEC                                 SPEC in a randomized Hadamard basis of each linear's input
                                                (seed N, default 0; losslens.lm.quant.hadamard); not for gptqmodel

GROUP is ``g<N>`` (N > 0 consecutive input columns per group) or ``row`` (= ``g-1``: one group per
output row). BITS is 2..8. ``sym`` selects the symmetric grid of the GPTQ reference quantizer
(see :func:`losslens.lm.quant.rtn.fit_grid`); the default is asymmetric. ``act`` = act-order (columns by
decreasing Hessian diagonal), ``static`` = static groups (group grids fitted once on the original
column layout before the permutation), ``damp`` = λ in H += λ·mean(diag H)·I (default 0.01),
``block`` = GPTQ lazy-update block size (default 128). The ``gptqmodel`` token selects the
preset that reproduces GPTQModel's default GPTQ (:mod:`losslens.lm.quant.gptq_preset`: group-aware
reordering, damp 0.05 + 0.01 steps, float32, its Hessian accumulation); under it ``sym`` and
``damp=0.05`` are the defaults (``asym`` / ``damp=F`` override them), ``act`` is GPTQModel's
``desc_act`` (which turns the group-aware order off), and static groups or another block size are
refused. ``variant`` is ``"reference"`` otherwise.

Examples: ``rtn:4:g128``, ``rtn:3:row``, ``int8``, ``gptq:3:g128:act``, ``gptq:4:g128:act:static``,
``gptq:4:g128:sym``, ``fp8``, ``mxfp4``, ``gguf:Q4_K``, ``had+rtn:4:g128``, ``had3+gptq:4``.
``str(QuantSpec.parse(s)) == s`` for every canonical string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from losslens.lm.quant.quant_errors import SpecError
from losslens.lm.quant.formats import FORMAT_METHODS, check_format, format_str, parse_format

METHODS = ("rtn", "int8", "gptq", "gptqmodel", "bnb-int8", "bnb-nf4", "awq") + FORMAT_METHODS
_GPTQ_LIKE = ("gptq", "gptqmodel")
_DEFAULT_GROUP = {"rtn": 128, "int8": -1, "gptq": 128, "gptqmodel": 128, "bnb-int8": -1, "bnb-nf4": 64, "awq": 128}
_FIXED_BITS = {"int8": 8, "bnb-int8": 8, "bnb-nf4": 4}
_EXTRA_KEYS = {"bnb-int8": ("threshold",), "gptqmodel": (), "bnb-nf4": (), "awq": ("clip", "grid", "shrink")}
DEFAULT_DAMP = 0.01
DEFAULT_BLOCK = 128
VARIANTS = ("reference", "gptqmodel")  # GPTQ variants: the IST-DASLab reference, the GPTQModel preset
GPTQMODEL_DAMP = 0.05  # GPTQModel's default damp_percent (quantization/config.py _default_damp_percent)


def _fmt_float(x: float) -> str:
    return repr(float(x)).rstrip("0").rstrip(".") if "e" not in repr(float(x)) else repr(float(x))


@dataclass(frozen=True)
class QuantSpec:
    """One quantizer configuration (hashable, ordered fields, canonical ``str``).

    Attributes:
        method: one of :data:`METHODS`.
        bits: integer bits b in 2..8 (fixed to 8 for ``int8``/``bnb-int8``, 4 for ``bnb-nf4``).
        group_size: consecutive input columns sharing one grid (> 0), or -1 for one per output row.
        symmetric: reference-GPTQ symmetric grid instead of the asymmetric min/max grid.
        act_order, static_groups, damp, block_size: GPTQ options (see module docstring).
        extra: further backend options as sorted ``(key, value-string)`` pairs.
        hadamard, hadamard_seed: quantize in a randomized Hadamard basis (``had[N]+`` prefix, seed N).
    """

    method: str
    bits: int = 4
    group_size: int = 128
    symmetric: bool = False
    act_order: bool = False
    static_groups: bool = False
    damp: float = DEFAULT_DAMP
    block_size: int = DEFAULT_BLOCK
    extra: tuple[tuple[str, str], ...] = field(default=())
    hadamard: bool = False
    hadamard_seed: int = 0
    variant: str = "reference"

    def __post_init__(self):
        m = self.method
        if m not in METHODS:
            raise SpecError(f"unknown quantization method {m!r}; choose one of {', '.join(METHODS)}")
        if self.variant not in VARIANTS:
            raise SpecError(f"unknown GPTQ variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.variant != "reference" and m != "gptq":
            raise SpecError(f"the {self.variant} preset is a variant of the native 'gptq' method, not of {m}")
        if self.hadamard and m == "gptqmodel":
            raise SpecError("had+ cannot wrap gptqmodel: that backend quantizes a saved copy without the rotation")
        if isinstance(self.hadamard_seed, bool) or not isinstance(self.hadamard_seed, int) or self.hadamard_seed < 0:
            raise SpecError(f"the Hadamard seed must be an integer >= 0, got {self.hadamard_seed!r}")
        if m in FORMAT_METHODS:
            object.__setattr__(
                self, "extra", tuple(sorted((str(k), str(v).lower()) for k, v in dict(self.extra).items()))
            )
            check_format(self)
            if self.act_order or self.static_groups or self.damp != DEFAULT_DAMP or self.block_size != DEFAULT_BLOCK:
                raise SpecError(f"act/static/damp/block are GPTQ options; {m} takes none of them")
            return
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise SpecError(f"bits must be an integer, got {self.bits!r}")
        if not 2 <= self.bits <= 8:
            raise SpecError(f"bits must be in 2..8, got {self.bits}")
        if m in _FIXED_BITS and self.bits != _FIXED_BITS[m]:
            raise SpecError(f"{m} always uses {_FIXED_BITS[m]} bits (got bits={self.bits})")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise SpecError(f"group size must be an integer, got {self.group_size!r}")
        if self.group_size == 0 or self.group_size < -1:
            raise SpecError(f"group size must be a positive number of columns or -1 (per row), got {self.group_size}")
        if m in ("int8", "bnb-int8") and self.group_size != -1:
            raise SpecError(f"{m} is per output channel; it takes no group size")
        if m == "bnb-nf4" and self.group_size == -1:
            raise SpecError("bnb-nf4 needs a block size g<N> (bitsandbytes quantizes in blocks); default g64")
        if m == "int8" and not self.symmetric:
            object.__setattr__(self, "symmetric", True)  # int8 is symmetric by definition
        if m in ("bnb-int8", "bnb-nf4") and self.symmetric:
            raise SpecError(f"{m} has a fixed grid; 'sym' does not apply")
        if m not in _GPTQ_LIKE:
            if self.act_order or self.static_groups or self.damp != DEFAULT_DAMP or self.block_size != DEFAULT_BLOCK:
                raise SpecError(f"act/static/damp/block are GPTQ options; {m} takes none of them")
        if self.static_groups and self.group_size == -1:
            raise SpecError("static groups need a group size g<N> (per-row grids are already fixed)")
        if self.variant == "gptqmodel" and (self.static_groups or self.block_size != DEFAULT_BLOCK):
            raise SpecError(
                "the gptqmodel preset takes bits, group, asym, act and damp only (GPTQModel's defaults "
                "have no static groups and a fixed block of 128)"
            )
        if self.variant == "gptqmodel" and self.group_size == -1 and not self.act_order:
            raise SpecError(
                "the gptqmodel preset's group-aware reordering needs a group size g<N> (GPTQModel refuses "
                "act_group_aware with group_size -1); give g<N> or 'act'"
            )
        if m == "gptqmodel" and (self.static_groups or self.block_size != DEFAULT_BLOCK):
            raise SpecError("gptqmodel specs take bits, group, sym, act and damp only")
        if not (isinstance(self.damp, (int, float)) and self.damp >= 0 and self.damp == self.damp):
            raise SpecError(f"damp must be a number >= 0, got {self.damp!r}")
        object.__setattr__(self, "damp", float(self.damp))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise SpecError(f"block size must be a positive integer, got {self.block_size!r}")
        extra = tuple(sorted((str(k), str(v)) for k, v in dict(self.extra).items()))
        allowed = _EXTRA_KEYS.get(m, ())
        for k, _ in extra:
            if k not in allowed:
                raise SpecError(
                    f"unknown option {k!r} for {m}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
                )
        object.__setattr__(self, "extra", extra)

    # ------------------------------------------------------------------ parsing / printing
    @classmethod
    def parse(cls, text: "str | QuantSpec") -> "QuantSpec":
        """Parse a spec string (see the module docstring); a QuantSpec is returned unchanged."""
        if isinstance(text, QuantSpec):
            return text
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"a quantizer spec must be a non-empty string like 'rtn:4:g128', got {text!r}")
        rot = re.fullmatch(r"had(\d*)\+(.+)", text.strip().lower(), flags=re.S)
        if rot:
            from dataclasses import replace

            inner = cls.parse(rot.group(2))
            if inner.hadamard:
                raise SpecError(f"cannot parse spec {text!r}: one had+ prefix at most")
            try:
                return replace(inner, hadamard=True, hadamard_seed=int(rot.group(1) or 0))
            except SpecError as e:
                raise SpecError(f"bad spec {text!r}: {e}") from None
        tokens = [t.strip() for t in text.strip().lower().split(":")]
        method, rest = tokens[0], tokens[1:]
        if method not in METHODS:
            raise SpecError(
                f"cannot parse spec {text!r}: unknown method {method!r}; choose one of {', '.join(METHODS)} "
                "(e.g. 'rtn:4:g128', 'int8', 'gptq:3:g128:act')"
            )
        if method in FORMAT_METHODS:
            kw = parse_format(method, rest, text)
            try:
                return cls(**kw)
            except SpecError as e:
                raise SpecError(f"bad spec {text!r}: {e}") from None
        kw: dict = {"method": method, "group_size": _DEFAULT_GROUP[method]}
        if method in _FIXED_BITS:
            kw["bits"] = _FIXED_BITS[method]
        extra: dict[str, str] = {}
        seen_bits = seen_group = False
        for i, tok in enumerate(rest):
            if re.fullmatch(r"[+-]?\d+", tok):
                if i != 0 or seen_bits:
                    raise SpecError(f"cannot parse spec {text!r}: bits must be the first token after the method")
                if method in _FIXED_BITS and int(tok) != _FIXED_BITS[method]:
                    raise SpecError(f"cannot parse spec {text!r}: {method} always uses {_FIXED_BITS[method]} bits")
                kw["bits"] = int(tok)
                seen_bits = True
            elif re.fullmatch(r"g[+-]?\d+", tok) or tok in ("row", "perrow", "per-row"):
                if seen_group:
                    raise SpecError(f"cannot parse spec {text!r}: two group sizes")
                kw["group_size"] = -1 if not tok.startswith("g") else int(tok[1:])
                seen_group = True
            elif tok in ("sym", "asym"):
                kw["symmetric"] = tok == "sym"
            elif tok in ("act", "actorder", "act_order", "desc_act"):
                kw["act_order"] = True
            elif tok in ("static", "static_groups"):
                kw["static_groups"] = True
            elif tok in VARIANTS:
                kw["variant"] = tok
            elif "=" in tok:
                k, v = tok.split("=", 1)
                try:
                    if k in ("damp", "percdamp"):
                        kw["damp"] = float(v)
                    elif k in ("block", "blocksize", "block_size"):
                        kw["block_size"] = int(v)
                    else:
                        extra[k] = v
                except ValueError:
                    raise SpecError(f"cannot parse spec {text!r}: bad value in {tok!r}") from None
            else:
                raise SpecError(
                    f"cannot parse spec {text!r}: unknown token {tok!r} (expected bits, g<N>|row, sym, act, "
                    "static, damp=F, block=N)"
                )
        if method not in _FIXED_BITS and not seen_bits:
            raise SpecError(f"cannot parse spec {text!r}: give the bits, e.g. '{method}:4:g128'")
        if extra:
            kw["extra"] = tuple(extra.items())
        if kw.get("variant") == "gptqmodel":  # the preset's own defaults
            kw.setdefault("symmetric", True)
            kw.setdefault("damp", GPTQMODEL_DAMP)
        try:
            return cls(**kw)
        except SpecError as e:
            raise SpecError(f"bad spec {text!r}: {e}") from None

    def __str__(self) -> str:
        rot = "" if not self.hadamard else f"had{self.hadamard_seed or ''}+"
        return rot + self._plain_str()

    def _plain_str(self) -> str:
        m = self.method
        if m in FORMAT_METHODS:
            return format_str(self)
        parts = [m]
        if m not in _FIXED_BITS:
            parts.append(str(self.bits))
        if m not in ("int8", "bnb-int8") and (m != "bnb-nf4" or self.group_size != _DEFAULT_GROUP[m]):
            parts.append("row" if self.group_size == -1 else f"g{self.group_size}")
        preset = self.variant == "gptqmodel"
        if self.symmetric and m != "int8" and not preset:
            parts.append("sym")
        if preset and not self.symmetric:
            parts.append("asym")
        if self.act_order:
            parts.append("act")
        if self.static_groups:
            parts.append("static")
        if self.damp != (GPTQMODEL_DAMP if preset else DEFAULT_DAMP):
            parts.append(f"damp={_fmt_float(self.damp)}")
        if self.block_size != DEFAULT_BLOCK:
            parts.append(f"block={self.block_size}")
        parts += [f"{k}={v}" for k, v in self.extra]
        if preset:
            parts.append("gptqmodel")
        return ":".join(parts)

    # ------------------------------------------------------------------ conveniences
    @property
    def options(self) -> dict:
        """Method options as a dict (GPTQ options plus backend extras)."""
        out = {
            "act_order": self.act_order,
            "static_groups": self.static_groups,
            "damp": self.damp,
            "block_size": self.block_size,
        }
        out.update(dict(self.extra))
        return out

    @property
    def unrotated(self) -> "QuantSpec":
        """This spec without its ``had+`` rotation."""
        from dataclasses import replace

        return replace(self, hadamard=False, hadamard_seed=0)

    @property
    def needs_calibration(self) -> bool:
        """True for the methods that need calibration data (GPTQ, its backend, AWQ)."""
        return self.method in _GPTQ_LIKE or self.method == "awq"

    @property
    def row_settings(self) -> dict:
        """Settings a ΔQ row records beside the spec (sweep rows' ``extra["settings"]``, part of their
        ``chosen`` column): ``{"gptq_variant": "reference" | "gptqmodel"}`` for native GPTQ, else {}."""
        return {"gptq_variant": self.variant} if self.method == "gptq" else {}

    def to_dict(self) -> dict:
        return {
            "spec": str(self),
            "method": self.method,
            "bits": self.bits,
            "group_size": self.group_size,
            "symmetric": self.symmetric,
            **self.options,
            "variant": self.variant,
        }
