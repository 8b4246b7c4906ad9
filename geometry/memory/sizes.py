"""Sizes as a user writes them (``--max-memory 8GB``, a plan's ``max_memory``): one strict parser.

A size is a plain decimal number and a unit, with or without a space between (``8GB``, ``8 GB``,
``0.5GB``, ``512MiB``); the unit's case does not matter (``8gb`` is ``8GB``: bytes, never bits):

- decimal units, powers of 1000 (as disks, and as losslens prints sizes): ``B``, ``kB``, ``MB``,
  ``GB``, ``TB`` — ``0.5GB`` is 500,000,000 bytes;
- binary units, powers of 1024: ``KiB``, ``MiB``, ``GiB``, ``TiB`` — ``0.5GiB`` is 536,870,912 bytes.

The value is exact (no float rounding) and rounded down to a whole byte. Refused, each with a message
that says what was read and what is accepted: a bare number (bytes or gigabytes? write ``8GB`` or
``8000000000B``), a single-letter unit (``8G``: tools disagree whether that is 10⁹ or 2³⁰ bytes),
signs, exponents (``1e9``), NaN and infinities, words, anything below :data:`MIN_SIZE` (1 MB) and
anything above ``limit`` (the caller passes the machine's memory:
:func:`losslens.geometry.memory.model.parse_bytes`).

An ``int`` is a number of bytes computed by code (a budget derived from a measurement, a test that
forces a plan): exact, at least 1, with no upper bound (a budget is a bound, not an allocation).
Everything else (a float, a bool, None) is refused.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from losslens.geometry.base.errors import LosslensError

__all__ = ["SizeError", "parse_size", "MIN_SIZE", "UNITS", "ACCEPTED"]

#: The smallest size a user may write: 1 MB (10⁶ bytes). Below it no curvature plan fits.
MIN_SIZE = 10**6
#: Bytes per unit, by the unit's lower-case spelling.
UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: What a size may look like, for the messages.
ACCEPTED = "a number and a unit, B/kB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), e.g. 8GB or 512MiB"
_MAX_CHARS = 64
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")


class SizeError(LosslensError, ValueError):
    """A size that cannot be read, or one outside [1 MB, the machine's memory]."""


def _bytes_text(n: int) -> str:
    return f"{n:,} bytes" if n < 10**24 else f"about 10^{len(str(n)) - 1} bytes"


def _why_unreadable(text: str) -> str:
    low = text.lower()
    if low.lstrip().startswith(("-", "+")):
        return "a size has no sign"
    if re.search(r"nan|inf", low):
        return "it is not a finite number"
    if re.search(r"\d\s*e\s*[+-]?\d", low):
        return "it has an exponent (write plain digits: 2GB, not 2e9B)"
    return "it is not a number followed by a unit"


def parse_size(value: Any, limit: int | None = None, limit_text: str = "this machine's memory") -> int:
    """Bytes of ``value``: a size string (module docstring) or an ``int`` of bytes.

    ``limit``: the largest size accepted, in bytes (None: no upper bound); ``limit_text`` names it in
    the message (e.g. ``"this machine's memory (25.0 GB of RAM)"``). Raises :class:`SizeError`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        shown = f"the {type(value).__name__} {value!r}"
        raise SizeError(f"cannot use {shown} as a size; write {ACCEPTED} (or pass an integer number of bytes)")
    if isinstance(value, int):
        if value < 1:
            raise SizeError(f"a size in bytes must be at least 1, got {value}; or write {ACCEPTED}")
        return value
    text = value.strip()
    if not text:
        raise SizeError(f"read an empty size; write {ACCEPTED}")
    if len(text) > _MAX_CHARS:
        raise SizeError(f"read a size of {len(text)} characters ({text[:20]!r}…); write {ACCEPTED}")
    m = _SIZE.fullmatch(text)
    if m is None:
        raise SizeError(f"cannot read the size {value!r}: {_why_unreadable(text)}; write {ACCEPTED}")
    number, unit = m.group(1), m.group(2)
    if not unit:
        raise SizeError(f"the size {value!r} has no unit (bytes or gigabytes?); write {ACCEPTED} ({number}B for bytes)")
    if unit.lower() not in UNITS:
        if unit.lower() in ("k", "m", "g", "t"):
            u = unit.upper().replace("K", "k")
            raise SizeError(
                f"the unit of {value!r} is ambiguous ({u} means 10^n or 2^n bytes depending on the tool); "
                f"write {number}{u}B (powers of 1000) or {number}{unit.upper()}iB (powers of 1024)"
            )
        raise SizeError(f"the size {value!r} has an unknown unit {unit!r}; write {ACCEPTED}")
    nbytes = int(Fraction(number) * UNITS[unit.lower()])
    if nbytes < MIN_SIZE:
        raise SizeError(
            f"the size {value!r} is {_bytes_text(nbytes)}, below the smallest size, 1 MB "
            f"({MIN_SIZE:,} bytes); write {ACCEPTED}, from 1MB up"
        )
    if limit is not None and nbytes > limit:
        raise SizeError(
            f"the size {value!r} is {_bytes_text(nbytes)}, more than {limit_text} "
            f"({_bytes_text(limit)}); write a size from 1MB to {limit // MIN_SIZE}MB"
        )
    return nbytes
