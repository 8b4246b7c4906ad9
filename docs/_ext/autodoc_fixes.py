"""What autodoc and napoleon get wrong on this project's docstrings and signatures, put right
(docs/_ext/rooms.py connects these): prose in numpy type fields stays prose, and signatures that
``autodoc_preserve_defaults`` cannot read (set by hand, or typer's ``Annotated`` options) keep their
values, without typer's metadata objects."""

from __future__ import annotations

import inspect
import re


_TYPE = re.compile(r"^\s*[\w.]+(\[[\w., \[\]|]*\])?(\s*\|\s*[\w.]+(\[[\w., \[\]|]*\])?)*\s*$")


def _prose_not_type(app, what, name, obj, options, lines):
    """napoleon reads "text: more" on the first line of an attribute's docstring as "type: description";
    when the text before the colon is prose ("Steps at which checkpoints are written: ..."), a blank
    first line keeps it prose (runs before napoleon)."""
    if what in ("attribute", "data", "property") and lines and ":" in lines[0]:
        head = lines[0].split(":", 1)[0]
        if "`" not in head and not _TYPE.match(head):
            lines.insert(0, "")


def _type_like(text: str) -> bool:
    """Whether a numpy-style type field holds a type (``int``, ``dict[str, Tensor]``, ``str or None``,
    ``bool, optional``, a role) rather than the start of a description."""
    text = re.sub(r",?\s*optional$", "", text.strip().rstrip("."))
    pieces = [p for p in re.split(r"\s+or\s+|\s*\|\s*", text) if p]
    return bool(pieces) and all(re.fullmatch(r"[\w.]+(\[.*\])?|:[\w:]+:`[^`]+`|``[^`]+``", p) for p in pieces)


def _prose_types(app, what, name, obj, options, lines):
    """This project's numpy docstrings often write ``name : what it is`` (a description, not a type).
    After napoleon (which made it a ``:type:`` field), put such text back at the start of the
    description, so it renders as written and its words are not taken for class names."""
    out: list[str] = []
    pending: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^(\s*):type (.+?): (.*)$", line)
        if m and not _type_like(m.group(3)):
            pending[m.group(2)] = m.group(3)
            continue
        out.append(line)
    for i, line in enumerate(out):
        m = re.match(r"^(\s*):param (.+?):\s?(.*)$", line)
        if m and m.group(2) in pending:
            out[i] = f"{m.group(1)}:param {m.group(2)}: {pending.pop(m.group(2))} {m.group(3)}".rstrip()
    out += [f":param {k}: {v}" for k, v in pending.items()]
    # attributes: napoleon writes ".. attribute:: x", the description, then "   :type: prose"; the
    # prose goes back to the front of the description
    attr = None
    i = 0
    while i < len(out):
        line = out[i]
        if line.lstrip().startswith(".. attribute::"):
            attr = i
        m = re.match(r"^(\s+):type: (.*)$", line)
        if m and attr is not None and not _type_like(m.group(2)):
            del out[i]
            first = next((k for k in range(attr + 1, i) if out[k].strip()), None)
            if first is None:
                out.insert(attr + 1, "")
                out.insert(attr + 2, f"{m.group(1)}{m.group(2)}")
            else:
                out.insert(first, f"{m.group(1)}{m.group(2)}")
            attr = None
            continue
        i += 1
    lines[:] = out


def _keep_set_signatures() -> None:
    """``autodoc_preserve_defaults`` reads a function's defaults from its source; a function whose
    ``__signature__`` was set by hand (``losslens.lm.settings.keywords``: the settings groups' fields as
    keyword parameters) has other parameters than the source it wraps, and Sphinx fails on it ("pop
    from empty list"). Such a signature's defaults are the values themselves: leave them as they are."""
    import sphinx.ext.autodoc.preserve_defaults as legacy

    modules = [legacy]
    try:
        from sphinx.ext.autodoc._dynamic import _signatures

        modules.append(_signatures)
    except ImportError:  # Sphinx < 9
        pass
    for module in modules:
        original = getattr(module, "update_default_value", None)
        if original is None or getattr(original, "_rooms", False):
            continue

        def update_default_value(obj, bound_method, _original=original):
            if "__signature__" in getattr(obj, "__dict__", {}) or _annotated(obj):
                return None
            return _original(obj, bound_method)

        update_default_value._rooms = True
        module.update_default_value = update_default_value


def _annotated(obj) -> bool:
    """Whether a parameter of ``obj`` is ``Annotated[...]`` (a typer command's options): its source defaults
    sit after multi-line annotations, which ``autodoc_preserve_defaults`` cuts wrong (``=lse`` for False)."""
    try:
        return any("Annotated[" in str(p.annotation) for p in inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return False


_TYPER_META = r", <typer\.models\.\w+ object at 0x[0-9a-f]+>\]"
_TYPER_ANNOTATED = re.compile(rf"(?:~?typing\.)?Annotated\[((?:(?!Annotated\[).)*?){_TYPER_META}")


def _plain_typer_signature(app, what, name, obj, options, signature, return_annotation):
    """A typer command's signature without ``Annotated[X, <typer.models.OptionInfo object at 0x…>]``
    (the option's help and flags are its CLI's; the reference shows the Python types): ``X``."""
    if signature and "typer.models." in signature:
        signature = re.sub(_TYPER_META, "", _TYPER_ANNOTATED.sub(r"\1", signature))
        return signature, return_annotation
    return None
