"""The API reference, one page per room, generated from the code (no hand-kept lists of names).

``.. room:: losslens.geometry.operators`` documents, in this order:

1. the room's docstring;
2. its public names: for a geometry room, the names of ``losslens.geometry.__all__`` whose object is
   defined in that room, under the path users import them from (``losslens.geometry.HessianOperator``);
   for any other room with an ``__all__``, every name of it (``losslens.lm.quant.quantize``); for the
   front door ``losslens``, every name of its ``__all__``, each a one-line pointer to where its room
   documents it;
3. every public module of the room (not starting with ``_``) with its docstring and the members it
   defines that step 2 has not documented already; a module with a reference page of its own (the
   rooms of a group package such as ``losslens.lm``) is a link to that page instead. A room that is one
   module (``losslens.measure.sharpness``) adds its public names outside ``__all__``.

A cross-reference to where an object is defined (``losslens.geometry.operators.hessian.HessianOperator``,
``losslens.lm.quant.spec.QuantSpec``, or a short name inside that module's docstrings) resolves to where it
is documented (references.py), so docstrings may name either; autodoc_fixes.py puts right what autodoc
and napoleon get wrong on this project's docstrings and signatures.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

from autodoc_fixes import _keep_set_signatures, _plain_typer_signature, _prose_not_type, _prose_types
from references import _ALIASES, _EXPORTED, _REEXPORTED, _canonical, _record, _resolve

FRONT = "losslens"  # the front door: its __all__ points at the rooms
GEOMETRY = "losslens.geometry"  # its rooms' public names are imported from here


def _kind(obj) -> str:
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if callable(obj):
        return "autofunction"
    return "autodata"


def public_names(room: str) -> list[tuple[str, object]]:
    """(documented name, object) of the room's public names (step 2 of the module docstring)."""
    if room.startswith(GEOMETRY + "."):
        pkg = importlib.import_module(GEOMETRY)
        return [
            (f"{GEOMETRY}.{n}", getattr(pkg, n))
            for n in pkg.__all__
            if str(getattr(getattr(pkg, n), "__module__", "")).startswith(room + ".")
        ]
    mod = importlib.import_module(room)
    if room == GEOMETRY:
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


def _scope(room: str) -> str | None:
    """The package whose objects a room's page documents in full (the front door documents none)."""
    if room == FRONT:
        return None
    return GEOMETRY if room.startswith(GEOMETRY) else room


def _home(obj, room: str) -> bool:
    """Whether ``obj`` is defined inside the room's scope (else the room re-exports another room's object)."""
    scope = _scope(room)
    mod = str(getattr(obj, "__module__", scope))
    return scope is not None and (mod == scope or mod.startswith(scope + "."))


def _public_home(obj, canonical: str) -> str:
    """The name under which a re-exported object is documented in its own room (``losslens.lm.core.TokenSet``
    for ``losslens.lm.core.tokenset.TokenSet``, ``losslens.geometry.Plane`` for
    ``losslens.geometry.surfaces.planes.Plane``), else its canonical name."""
    parts = canonical.split(".")
    short = getattr(obj, "__name__", parts[-1])
    rooms = [GEOMETRY] if canonical.startswith(GEOMETRY + ".") else [".".join(parts[:3])]
    for room in rooms:
        try:
            mod = importlib.import_module(room)
        except ImportError:
            continue
        if short in getattr(mod, "__all__", ()) and getattr(mod, short) is obj:
            return f"{room}.{short}"
    return canonical


def _data_home(obj, short: str) -> str | None:
    """Where a constant of the front door is documented: the room whose ``__all__`` holds the same object."""
    for modname, mod in sorted(sys.modules.items()):
        if modname == GEOMETRY or (modname.count(".") == 2 and not modname.startswith(GEOMETRY + ".")):
            if short in getattr(mod, "__all__", ()) and getattr(mod, short, None) is obj:
                return f"{modname}.{short}"
    return None


def _module_extras(room: str) -> list[str]:
    """A one-module room's public names outside its ``__all__`` that it defines (its constants, read from
    the source: a constant has no ``__module__``)."""
    mod = importlib.import_module(room)
    if hasattr(mod, "__path__") or not hasattr(mod, "__all__") or not getattr(mod, "__file__", None):
        return []
    tree = ast.parse(open(mod.__file__, encoding="utf-8").read())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in dict.fromkeys(names) if not n.startswith("_") and n not in mod.__all__ and hasattr(mod, n)]


class RoomDirective(SphinxDirective):
    """``.. room:: DOTTED.NAME``: the reference of one room (see the module docstring)."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        room = self.arguments[0]
        lines = [f".. automodule:: {room}", "   :no-members:", ""]
        if room == GEOMETRY:
            lines += self._geometry_index()
        names = public_names(room)
        if names:
            lines += ["Public names", "~~~~~~~~~~~~", ""]
            imported_from = GEOMETRY if room.startswith(GEOMETRY + ".") else room
            example = names[0][0].split(".")[-1]
            lines += [f"Imported from ``{imported_from}``, e.g. ``from {imported_from} import {example}``.", ""]
        for name, obj in names:
            lines += self._public_name(room, name, obj)
        lines += self._modules(room, {n.rsplit(".", 1)[1] for n, _ in names})
        content = StringList(lines, source=f"<room {room}>")
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, content, node)
        return node.children

    @staticmethod
    def _public_name(room: str, name: str, obj) -> list[str]:
        """The entry of one public name: documented in full, or a pointer to its room's entry."""
        kind = _kind(obj)
        canonical = _canonical(obj)
        mod, short = name.rsplit(".", 1)
        home = None
        if kind != "autodata" and canonical and not _home(obj, room):
            home = _public_home(obj, canonical)
        elif kind == "autodata" and room == FRONT:
            home = _data_home(obj, short)
        if home is not None:
            # another room's object, re-exported here: one line pointing to its home
            directive = {"autoclass": "py:class", "autoexception": "py:exception", "autodata": "py:data"}.get(
                kind, "py:function"
            )
            role = {"py:class": "class", "py:exception": "exc", "py:data": "data"}.get(directive, "func")
            _REEXPORTED.add(name)
            return [
                f".. {directive}:: {short}",
                f"   :module: {mod}",
                "",
                f"   The same object as :{role}:`{home}`, re-exported here.",
                "",
            ]
        _EXPORTED[id(obj)] = name
        if kind == "autodata":  # data has no __module__: alias every module that holds this object
            for modname, module in list(sys.modules.items()):
                if modname.startswith(FRONT + ".") and getattr(module, short, None) is obj:
                    _ALIASES.setdefault(f"{modname}.{short}", name)
        lines = [f".. {kind}:: {name}"]
        if kind in ("autoclass", "autoexception"):
            lines += ["   :members:"]
        if kind == "autodata":
            lines += ["   :no-value:"]
        return lines + [""]

    def _modules(self, room: str, exported_names: set[str]) -> list[str]:
        """Step 3: the room's modules (a link for one with a page of its own), or a one-module room's extras."""
        if room in (GEOMETRY, FRONT):
            return []
        extras = _module_extras(room)
        if extras:
            lines = ["Other names", "~~~~~~~~~~~", ""]
            module = importlib.import_module(room)
            for short in extras:
                kind = _kind(getattr(module, short))
                lines += [f".. {kind}:: {room}.{short}"] + (["   :no-value:"] if kind == "autodata" else []) + [""]
            return lines
        mods = room_modules(room)
        pages = [m for m in mods if f"reference/{m}" in self.env.found_docs]
        lines = []
        if pages:
            lines += ["Pages", "~~~~~", ""]
            lines += [", ".join(f":doc:`{mod}`" for mod in pages), ""]
        mods = [m for m in mods if m not in pages]
        if mods:
            lines += ["Modules", "~~~~~~~", ""]
        for mod in mods:
            lines += [mod, "^" * len(mod), "", f".. automodule:: {mod}", "   :members:"]
            if mod.rsplit(".", 1)[1] in exported_names:
                # a public name equal to the module's (losslens.study.analysis.series): the name is the function's
                lines += ["   :no-index:"]
            lines += [""]
        return lines

    @staticmethod
    def _geometry_index() -> list[str]:
        """``losslens.geometry.__all__`` by the room that defines each name, each a link to its entry."""
        import losslens.geometry

        lines = ["Public names by room", "~~~~~~~~~~~~~~~~~~~~", ""]
        for sub in room_modules(GEOMETRY):
            names = public_names(sub)
            if names:
                refs = ", ".join(f":py:obj:`~{n}`" for n, _ in names)
                lines += [f"- :doc:`{sub}`: {refs}", ""]
        missing = set(losslens.geometry.__all__) - {
            n.split(".")[-1] for sub in room_modules(GEOMETRY) for n, _ in public_names(sub)
        }
        if missing:
            raise ValueError(f"losslens.geometry.__all__ names defined outside every room: {sorted(missing)}")
        return lines


def _skip_exported(app, what, name, obj, skip, options):
    """A submodule's member documented as a public name already is not documented twice."""
    # the same object under the same name: a small int (MIN_NU = 10) shares its id with every other 10
    if what == "module" and _EXPORTED.get(id(obj), "").rsplit(".", 1)[-1] == name and not name.startswith("_"):
        # the module being documented is a submodule (the public names are written with autoclass etc.)
        return True
    return None


def setup(app: Sphinx) -> dict:
    _keep_set_signatures()
    app.connect("autodoc-process-signature", _plain_typer_signature)
    app.add_directive("room", RoomDirective)
    app.connect("autodoc-process-docstring", _prose_not_type, priority=400)
    app.connect("autodoc-process-docstring", _prose_types, priority=600)
    app.connect("autodoc-skip-member", _skip_exported)
    app.connect("autodoc-process-docstring", _record)
    app.connect("missing-reference", _resolve)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
