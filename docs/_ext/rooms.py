"""The API reference, one page per room, generated from the code (no hand-kept lists of names).

``.. room:: losslens.geometry.operators`` documents, in this order:

1. the room's docstring;
2. its public names: for a ``geometry`` room, the names of ``losslens.geometry.__all__`` whose object is defined in
   that room, under the path users import them from (``losslens.geometry.HessianOperator``); for a ``probes``
   room with an ``__all__``, every name of it (``losslens.lm.quant.quantize``);
3. every public module of the room (not starting with ``_``) with its docstring and the members it
   defines that step 2 has not documented already.

A cross-reference to where an object is defined (``losslens.geometry.operators.hessian.HessianOperator``,
``losslens.lm.quant.spec.QuantSpec``, or a short name inside that module's docstrings) resolves to where it
is documented (``missing-reference`` below), so docstrings may name either.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

# canonical name (module.qualname where defined) -> documented name; filled while reading
_ALIASES: dict[str, str] = {}
# id() of objects documented as a public name, and the names documented: submodules skip them
_EXPORTED: dict[int, str] = {}
# names documented as one-line pointers to another room's object
_REEXPORTED: set[str] = set()


def _canonical(obj) -> str | None:
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<locals>" in qual:
        return None
    return f"{mod}.{qual}"


def _kind(obj) -> str:
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if callable(obj):
        return "autofunction"
    return "autodata"


def public_names(room: str) -> list[tuple[str, object]]:
    """(documented name, object) of the room's public names (step 2 of the module docstring)."""
    top = room.split(".")[0]
    if top == "geometry" and room != "geometry":
        pkg = importlib.import_module("geometry")
        return [
            (f"geometry.{n}", getattr(pkg, n))
            for n in pkg.__all__
            if str(getattr(getattr(pkg, n), "__module__", "")).startswith(room + ".")
        ]
    mod = importlib.import_module(room)
    if top == "geometry":
        return []
    return [(f"{room}.{n}", getattr(mod, n)) for n in getattr(mod, "__all__", [])]


def room_modules(room: str) -> list[str]:
    """The room's public modules (names not starting with ``_``), sorted."""
    pkg = importlib.import_module(room)
    if not hasattr(pkg, "__path__"):
        return []
    return [
        f"{room}.{m.name}"
        for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
        if not m.name.startswith("_")
    ]


def _home(obj, room: str) -> bool:
    """Whether ``obj`` is defined inside ``room`` (else the room re-exports another room's object)."""
    return str(getattr(obj, "__module__", room)).startswith(room)


def _public_home(obj, canonical: str) -> str:
    """The name under which a re-exported object is documented in its own room (``losslens.lm.core.TokenSet``
    for ``losslens.lm.core.tokenset.TokenSet``), else its canonical name."""
    parts = canonical.split(".")
    for depth in (2, 1):
        room = ".".join(parts[:depth])
        try:
            mod = importlib.import_module(room)
        except ImportError:
            continue
        short = getattr(obj, "__name__", parts[-1])
        if short in getattr(mod, "__all__", ()) and getattr(mod, short) is obj:
            return f"{room}.{short}"
    return canonical


class RoomDirective(SphinxDirective):
    """``.. room:: DOTTED.NAME``: the reference of one room (see the module docstring)."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        room = self.arguments[0]
        lines = [f".. automodule:: {room}", "   :no-members:", ""]
        if room == "geometry":
            lines += self._geometry_index()
        names = public_names(room)
        if names:
            lines += ["Public names", "~~~~~~~~~~~~", ""]
            if room.startswith("geometry."):
                lines += [
                    f"Imported from ``geometry``, e.g. ``from geometry import {names[0][0].split('.')[-1]}``.",
                    "",
                ]
        for name, obj in names:
            kind = _kind(obj)
            canonical = _canonical(obj)
            if (
                kind != "autodata"
                and canonical
                and not _home(obj, room.split(".")[0] if room.startswith("geometry") else room)
            ):
                # another room's object, re-exported here: one line pointing to its home
                directive = {"autoclass": "py:class", "autoexception": "py:exception"}.get(kind, "py:function")
                role = {"py:class": "class", "py:exception": "exc"}.get(directive, "func")
                mod, short = name.rsplit(".", 1)
                _REEXPORTED.add(name)
                home = _public_home(obj, canonical)
                lines += [
                    f".. {directive}:: {short}",
                    f"   :module: {mod}",
                    "",
                    f"   The same object as :{role}:`{home}`, re-exported here.",
                    "",
                ]
                continue
            _EXPORTED[id(obj)] = name
            if kind == "autodata":  # data has no __module__: alias every room module that holds this object
                for modname, mod in list(sys.modules.items()):
                    if (
                        modname.startswith(room.split(".")[0] + ".")
                        and getattr(mod, name.rsplit(".", 1)[1], None) is obj
                    ):
                        _ALIASES.setdefault(f"{modname}.{name.rsplit('.', 1)[1]}", name)
            lines += [f".. {kind}:: {name}"]
            if kind in ("autoclass", "autoexception"):
                lines += ["   :members:"]
            if kind == "autodata":
                lines += ["   :no-value:"]
            lines += [""]
        mods = room_modules(room) if room != "geometry" else []
        if mods:
            lines += ["Modules", "~~~~~~~", ""]
        exported_names = {n.rsplit(".", 1)[1] for n, _ in names}
        for mod in mods:
            lines += [mod, "^" * len(mod), "", f".. automodule:: {mod}", "   :members:"]
            if mod.rsplit(".", 1)[1] in exported_names:
                # a public name equal to the module's (losslens.study.analysis.series): the name is the function's
                lines += ["   :no-index:"]
            lines += [""]
        content = StringList(lines, source=f"<room {room}>")
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, content, node)
        return node.children

    @staticmethod
    def _geometry_index() -> list[str]:
        """``losslens.geometry.__all__`` by the room that defines each name, each a link to its entry."""
        import losslens.geometry

        lines = ["Public names by room", "~~~~~~~~~~~~~~~~~~~~", ""]
        for sub in room_modules("geometry"):
            names = public_names(sub)
            if names:
                refs = ", ".join(f":py:obj:`~{n}`" for n, _ in names)
                lines += [f"- :doc:`{sub}`: {refs}", ""]
        missing = set(losslens.geometry.__all__) - {
            n.split(".")[-1] for sub in room_modules("geometry") for n, _ in public_names(sub)
        }
        if missing:
            raise ValueError(f"losslens.geometry.__all__ names defined outside every room: {sorted(missing)}")
        return lines


def _skip_exported(app, what, name, obj, skip, options):
    """A submodule's member documented as a public name already is not documented twice."""
    if what == "module" and id(obj) in _EXPORTED and not name.startswith("_"):
        # the module being documented is a submodule (the public names are written with autoclass etc.)
        return True
    return None


_ROLE = re.compile(r":(py:)?(func|meth|class|exc|attr|data|obj|mod|const):`(?:([^`<]*?)\s*<)?([~!]?)([\w.]+)(>?)`")


def _record(app, what, name, obj, options, lines):
    canonical = _canonical(obj)
    if what in ("attribute", "property", "method", "classmethod", "staticmethod"):
        owner = _lookup(name.rsplit(".", 1)[0])
        if inspect.isclass(owner) and _canonical(owner):
            canonical = f"{_canonical(owner)}.{name.rsplit('.', 1)[1]}"
    if canonical and canonical != name:
        _ALIASES.setdefault(canonical, name)
    if (
        what in ("data", "attribute")
        and getattr(obj, "__doc__", None) is not None
        and obj.__doc__ == getattr(type(obj), "__doc__", None)
    ):
        lines[:] = []  # a constant without a docstring of its own: not dict's or tuple's docstring
    scopes = _scopes(what, name, obj)
    if scopes:
        lines[:] = [_ROLE.sub(lambda m: _qualified(m, scopes), line) for line in lines]


def _scopes(what, name, obj) -> list:
    """Where a short name in this docstring is looked up, innermost first: the class (for a class or
    one of its members), then the module the object was written in, as Python would."""
    out = []
    if what == "module":
        return [obj]
    owner = obj if inspect.isclass(obj) else None
    if owner is None and what in ("method", "attribute", "property", "classmethod", "staticmethod"):
        owner = _lookup(name.rsplit(".", 1)[0])
    if owner is not None:
        out.append(owner)
    modname = getattr(owner if owner is not None else obj, "__module__", None)
    if isinstance(modname, str) and modname in sys.modules:
        out.append(sys.modules[modname])
    return out


def _lookup(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not a module path
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _qualified(m: re.Match, scopes: list) -> str:
    """A short target rewritten to its full name where the docstring's own scope defines it."""
    prefix, role, title, mark, target, close = m.groups()
    if target.startswith(".") or mark == "!":
        return m.group(0)
    head, *rest = target.split(".")
    for scope in scopes:
        if not hasattr(scope, head):
            continue
        found = getattr(scope, head)
        full = _full_name(found, scope, head)
        if full is None:
            return m.group(0)
        try:
            for attr in rest:
                found = getattr(found, attr)
        except AttributeError:
            return m.group(0)
        full = ".".join([full, *rest])
        shown = title if title else (target.rsplit(".", 1)[-1] if mark == "~" else target)
        return f":{prefix or ''}{role}:`{shown} <{full}>`"
    return m.group(0)


def _full_name(found, scope, head: str) -> str | None:
    if inspect.ismodule(found):
        return found.__name__
    canonical = _canonical(found) if (inspect.isclass(found) or inspect.isfunction(found)) else None
    if canonical:
        return canonical
    if inspect.isclass(scope):
        return f"{_canonical(scope)}.{head}"
    if inspect.ismodule(scope):
        return f"{scope.__name__}.{head}"
    return None


def _resolve(app: Sphinx, env, node, contnode):
    """Resolve a Python reference to where its object is defined to where it is documented."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    candidates = [target]
    for ctx in (node.get("py:class"), node.get("py:module")):
        if ctx:
            candidates.append(f"{ctx}.{target}")
    if node.get("py:module") and node.get("py:class"):
        candidates.append(f"{node['py:module']}.{node['py:class']}.{target}")
    domain = env.get_domain("py")
    candidates += _by_last_name(domain, target, node.get("py:module") or "")
    for cand in candidates:
        documented = cand if cand in domain.objects else None
        documented = documented or _ALIASES.get(cand) or _ALIASES.get(_canonical_of(cand) or "")
        if documented:
            new = node.deepcopy()
            new["reftarget"] = documented
            for role in (node["reftype"], "obj"):
                ref = domain.resolve_xref(env, node["refdoc"], app.builder, role, documented, new, contnode)
                if ref is not None:
                    return ref
    # an undocumented member that exists (a dataclass field, a property without a docstring): link to
    # its class; a member the class does not have stays unresolved (and fails the strict build)
    if "." in target and node["reftype"] in ("attr", "meth", "obj"):
        owner, member = target.rsplit(".", 1)
        owner_node = node.deepcopy()
        owner_node["reftarget"] = owner
        owner_node["reftype"] = "class"
        ref = _resolve(app, env, owner_node, contnode) or domain.resolve_xref(
            env, node["refdoc"], app.builder, "class", owner, owner_node, contnode
        )
        cls = _lookup(ref.get("reftitle", "")) if ref is not None else None
        if inspect.isclass(cls) and _has_member(cls, member):
            return ref
    return None


def _has_member(cls, member: str) -> bool:
    return (
        hasattr(cls, member)
        or any(member in getattr(c, "__annotations__", {}) for c in cls.__mro__)
        or member in getattr(cls, "__dataclass_fields__", {})
    )


def _by_last_name(domain, target: str, module: str) -> list[str]:
    """A short name in a docstring (``:class:`CurvatureOperator``` in ``losslens.geometry.operators``): the one
    documented object of that name in the same room, else in the same package; none when ambiguous."""
    if not module:
        return []
    found = {}
    for name, entry in domain.objects.items():
        if name.endswith("." + target) and not entry.aliased and name not in _REEXPORTED:
            found[name] = entry
    parts = module.split(".")
    for depth in (len(parts), 2, 1, 0):
        scope = ".".join(parts[:depth]) + "." if depth else ""
        near = [n for n in found if n.startswith(scope)]
        if len(near) == 1:
            return near
        if len(near) > 1:
            return []
    return []


def _canonical_of(dotted: str) -> str | None:
    """The canonical name of the object at a dotted path (importing its module), or None."""
    obj = _lookup(dotted)
    return None if obj is None else _canonical(obj)


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


def setup(app: Sphinx) -> dict:
    app.add_directive("room", RoomDirective)
    app.connect("autodoc-process-docstring", _prose_not_type, priority=400)
    app.connect("autodoc-process-docstring", _prose_types, priority=600)
    app.connect("autodoc-skip-member", _skip_exported)
    app.connect("autodoc-process-docstring", _record)
    app.connect("missing-reference", _resolve)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
