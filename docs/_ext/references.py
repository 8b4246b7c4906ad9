"""Cross-references in the reference (docs/_ext/rooms.py builds the pages): a docstring's short names are
qualified as Python would resolve them (``autodoc-process-docstring``), and a reference to where an object
is defined resolves to where it is documented (``missing-reference``). A reference to something that does
not exist stays unresolved, so the strict build fails on it."""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from sphinx.application import Sphinx

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
    for depth in (len(parts), 3, 2, 1, 0):
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
