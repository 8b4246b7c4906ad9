"""QuantSpec: parse/print round trip, hashing, and clear errors for bad specs."""

from __future__ import annotations

import pytest

from losslens.lm.quant import QuantSpec, SpecError

CANONICAL = [
    "rtn:4:g128",
    "rtn:3:row",
    "rtn:2:g32",
    "rtn:8:g64:sym",
    "int8",
    "gptq:3:g128:act",
    "gptq:4:g128:act:static",
    "gptq:4:g128:sym",
    "gptq:4:row",
    "gptq:3:g64:damp=0.1:block=64",
    "gptqmodel:4:g128:act",
    "bnb-int8",
    "bnb-nf4",
    "bnb-nf4:g128",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_round_trip(text):
    spec = QuantSpec.parse(text)
    assert str(spec) == text
    assert QuantSpec.parse(str(spec)) == spec
    assert hash(spec) == hash(QuantSpec.parse(text))


def test_fields_and_defaults():
    s = QuantSpec.parse("gptq:3:g128:act")
    assert (s.method, s.bits, s.group_size, s.symmetric, s.act_order, s.static_groups) == (
        "gptq",
        3,
        128,
        False,
        True,
        False,
    )
    assert s.damp == 0.01 and s.block_size == 128 and s.needs_calibration
    assert QuantSpec.parse("rtn:3:row").group_size == -1
    assert QuantSpec.parse("rtn:4") == QuantSpec.parse("rtn:4:g128")  # default group 128
    assert str(QuantSpec.parse("GPTQ:4:Static:G64:ACT")) == "gptq:4:g64:act:static"  # free order, case
    i8 = QuantSpec.parse("int8")
    assert (i8.bits, i8.group_size, i8.symmetric, i8.needs_calibration) == (8, -1, True, False)
    assert QuantSpec.parse(QuantSpec("rtn", 4, 128)) == QuantSpec("rtn", 4, 128)
    assert {QuantSpec.parse("rtn:4:g128"): 1}[QuantSpec("rtn", 4, 128)] == 1
    assert QuantSpec.parse("gptq:4:g128:act").to_dict()["spec"] == "gptq:4:g128:act"


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("rtn:9:g128", "2..8"),
        ("rtn:1:g128", "2..8"),
        ("gptq:0", "2..8"),
        ("rtn:4:g0", "group size"),
        ("rtn:4:g-2", "group size"),
        ("rtn:4:g-128", "group size"),
        ("nope:4", "unknown method"),
        ("rtn:4:g128:banana", "unknown token"),
        ("gptq", "give the bits"),
        ("", "non-empty"),
        ("rtn:4:act", "GPTQ options"),
        ("int8:4", "8 bits"),
        ("gptq:4:row:static", "static"),
        ("rtn:4:g128:g64", "two group sizes"),
        ("gptq:4:damp=abc", "bad value"),
        ("gptq:4:damp=-1", "damp"),
        ("rtn:g128:4", "first token"),
        ("bnb-int8:g64", "group"),
    ],
)
def test_bad_specs(bad, needle):
    with pytest.raises(SpecError, match=needle):
        QuantSpec.parse(bad)


def test_constructor_validates():
    with pytest.raises(SpecError):
        QuantSpec("rtn", bits=10)
    with pytest.raises(SpecError):
        QuantSpec("rtn", bits=4, group_size=0)
    with pytest.raises(SpecError):
        QuantSpec("gptq", bits=4, block_size=0)
    with pytest.raises(SpecError):
        QuantSpec.parse(None)  # type: ignore[arg-type]
