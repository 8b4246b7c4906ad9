"""The deployment formats as quantizer specs: one table row per method (parse, print, check, quantize).

Grammar (docs/science.md §3b–3c; canonical strings shown)::

    fp8[:e5m2][:tensor]     FP8 weights, E4M3 (default) or E5M2, float32 scale per output channel
                            (default) or per tensor (``tensor``)
    mxfp4                   OCP MX v1.0 MXFP4: blocks of 32, E8M0 shared scale, E2M1 elements
    mxfp8[:e5m2]            OCP MX v1.0 MXFP8: blocks of 32, E8M0 shared scale, E4M3 (default) / E5M2
    nvfp4                   NVFP4: blocks of 16, E4M3 block scale, float32 tensor scale, E2M1 elements
    gguf:TYPE               llama.cpp type TYPE in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K (reference rounding)

None needs calibration data. In a :class:`~losslens.lm.quant.spec.QuantSpec` they keep ``bits`` (the
element bits: 8, 4, 8, 4 and the GGUF type's nominal bits), ``group_size`` (the block: −1 per channel
for fp8, 32, 32, 16, 32 or 256) and ``extra`` (``elem``, ``scale``, ``type``). This module imports
nothing heavy; the quantizers live in :mod:`.minifloat`, :mod:`.microscaling`, :mod:`.ggml`.
"""

from __future__ import annotations

from losslens.lm.quant.quant_errors import SpecError

#: GGUF type → (block size, nominal bits); must agree with losslens.lm.quant.ggml.TYPES (tested)
GGUF_TYPES = {"Q4_0": (32, 4), "Q4_1": (32, 4), "Q5_0": (32, 5), "Q5_1": (32, 5), "Q8_0": (32, 8), "Q4_K": (256, 4)}
_FIXED = {"fp8": (8, -1), "mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}
_WORDS = {"fp8": ("e4m3", "e5m2", "tensor", "row", "channel"), "mxfp8": ("e4m3", "e5m2"), "mxfp4": (), "nvfp4": ()}
_EXTRA = {
    "fp8": {"elem": ("e5m2",), "scale": ("tensor",)},
    "mxfp8": {"elem": ("e5m2",)},
    "mxfp4": {},
    "nvfp4": {},
    "gguf": {"type": tuple(t.lower() for t in GGUF_TYPES)},
}
FORMAT_METHODS = tuple(_EXTRA)


def parse_format(method: str, tokens: list[str], text: str) -> dict:
    """QuantSpec keyword arguments for ``method`` and its (lower-cased) ``tokens``."""
    if method == "gguf":
        if len(tokens) != 1 or tokens[0].upper() not in GGUF_TYPES:
            raise SpecError(f"cannot parse spec {text!r}: write gguf:TYPE with TYPE one of {', '.join(GGUF_TYPES)}")
        block, bits = GGUF_TYPES[tokens[0].upper()]
        return {"method": method, "bits": bits, "group_size": block, "extra": (("type", tokens[0]),)}
    bits, group = _FIXED[method]
    extra: dict[str, str] = {}
    for tok in tokens:
        if tok not in _WORDS[method]:
            allowed = ", ".join(_WORDS[method]) or "no options"
            raise SpecError(f"cannot parse spec {text!r}: unknown token {tok!r} for {method} ({allowed})")
        if tok == "e5m2":
            extra["elem"] = tok
        elif tok == "tensor":
            extra["scale"] = tok
    return {"method": method, "bits": bits, "group_size": group, "extra": tuple(extra.items())}


def check_format(spec) -> None:
    """Raise :class:`SpecError` unless ``spec`` (a QuantSpec of a format method) is well formed."""
    m = spec.method
    extra = dict(spec.extra)
    for k, v in extra.items():
        if v not in _EXTRA[m].get(k, ()):
            raise SpecError(f"{m} takes no option {k}={v}")
    if m == "gguf":
        if "type" not in extra:
            raise SpecError(f"gguf needs a type, e.g. gguf:Q4_K ({', '.join(GGUF_TYPES)})")
        bits, group = GGUF_TYPES[extra["type"].upper()][1], GGUF_TYPES[extra["type"].upper()][0]
    else:
        bits, group = _FIXED[m]
    if spec.bits != bits or spec.group_size != group:
        raise SpecError(f"{format_str(spec)} has {bits} bits and blocks of {group}; they are not options")
    if spec.symmetric:
        raise SpecError(f"{m} has a fixed grid; 'sym' does not apply")


def format_str(spec) -> str:
    """The canonical spec string (GGUF type names upper-case: ``gguf:Q4_K``)."""
    extra = dict(spec.extra)
    if spec.method == "gguf":
        return f"gguf:{extra.get('type', '?').upper()}"
    return ":".join([spec.method] + [extra[k] for k in ("elem", "scale") if k in extra])


def quantize_weight(W, spec):
    """Fake-quantize one weight [out, in] with a format spec → (tensor in W's dtype, notes tuple)."""
    from losslens.lm.quant.minifloat import E2M1, FORMATS, fp8_quantize

    extra = dict(spec.extra)
    elem = FORMATS[extra.get("elem", "e4m3")]
    if spec.method == "fp8":
        return fp8_quantize(W, elem, per_channel=extra.get("scale") != "tensor"), ()
    if spec.method in ("mxfp4", "mxfp8"):
        from losslens.lm.quant.microscaling import mx_quantize

        return mx_quantize(W, E2M1 if spec.method == "mxfp4" else elem), ()
    if spec.method == "nvfp4":
        from losslens.lm.quant.microscaling import nvfp4_quantize

        return nvfp4_quantize(W), ()
    from losslens.lm.quant.ggml import gguf_quantize

    return gguf_quantize(W, extra["type"].upper())
