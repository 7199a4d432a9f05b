"""The architecture, checked: imports point down the layers, no import cycles, no private reads across modules.

ARCHITECTURE.md draws the layers; this test reads every module of the package (imports at module
level and inside functions; ``TYPE_CHECKING`` blocks are annotations only and do not count).
"""

from __future__ import annotations

import ast
import os
import re

import pytest
from helpers import REPO

PKG = os.path.join(REPO, "pycoll")

# lower number = lower layer; a module may import only modules of its own layer or below
LAYERS = [
    ("bindings", ["pycoll._bindings", "pycoll.bindings", "pycoll.errors", "pycoll._settings", "pycoll._dtypes",
                  "pycoll.failpoints", "pycoll._procs"]),
    ("core", ["pycoll.hooks", "pycoll.buffers", "pycoll.devices", "pycoll.config", "pycoll.work", "pycoll.group",
              "pycoll.premul", "pycoll.windows", "pycoll.memory", "pycoll.properties", "pycoll.collconfig",
              "pycoll.adopt", "pycoll.comm"]),
    ("store", ["pycoll.store"]),
    ("diagnostics", ["pycoll.diagnostics"]),
    ("bootstrap", ["pycoll.launch", "pycoll.create"]),
    ("elastic", ["pycoll.elastic", "pycoll.membership", "pycoll.nodeagg"]),
    ("tools", ["pycoll.tools", "pycoll.emulated", "pycoll"]),  # pycoll/__init__ and the alias modules sit on top
]


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules():
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                yield _module_name(path), path


MODULES = dict(_modules())


def _layer(name: str) -> int:
    best = (-1, len(LAYERS) - 1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best[0]:
                best = (len(p), i)
    return best[1]


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: str):
    """pycoll modules imported by ``name`` (module level and in functions), with line numbers."""
    tree = ast.parse(open(path).read(), path)
    is_pkg = path.endswith("__init__.py")
    here = name if is_pkg else name.rsplit(".", 1)[0]
    out = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            visit_stmt(child)

    def visit_stmt(child):
        if isinstance(child, ast.Import):
            out.extend((a.name, child.lineno) for a in child.names if a.name.startswith("pycoll"))
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                base = here.split(".")
                base = base[: len(base) - (child.level - 1)]
                mod = ".".join(base + ([child.module] if child.module else []))
            else:
                mod = child.module or ""
            if not mod.startswith("pycoll"):
                return
            for a in child.names:
                sub = f"{mod}.{a.name}"
                out.append((sub if sub in MODULES else mod, child.lineno))
        visit(child)

    visit(tree)
    return out


def _graph():
    graph = {}
    for name, path in MODULES.items():
        deps = set()
        for mod, _ in _imports(name, path):
            # importing a submodule runs its parent packages first: those edges are the package's own
            if mod != name and not name.startswith(mod + ".") and mod in MODULES:
                deps.add(mod)
        graph[name] = deps
    return graph


def test_no_import_cycles():
    graph = _graph()
    state, stack, cycles = {}, [], []

    def dfs(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                dfs(d)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            dfs(n)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_point_down_the_layers():
    bad = []
    for name, path in MODULES.items():
        for mod, line in _imports(name, path):
            if mod in MODULES and _layer(mod) > _layer(name) and not name.startswith(mod + "."):
                bad.append(f"{os.path.relpath(path, PKG)}:{line} ({LAYERS[_layer(name)][0]}) imports {mod} "
                           f"({LAYERS[_layer(mod)][0]})")
    assert not bad, "imports pointing up:\n" + "\n".join(bad)


_PRIVATE_READ = re.compile(r"\b(?!self\b|cls\b)([a-z_][a-z0-9_]*)\.(_[a-z][a-z0-9_]*)\b")
# the core's own pair (a Work is its Communicator's record), module-private globals of the same
# package read through its module object, and the C extension's objects
_ALLOWED = {("pycoll.comm", "w"), ("pycoll.work", "comm")}


@pytest.mark.parametrize("layer", ["diagnostics", "elastic", "bootstrap"])
def test_observers_use_the_declared_view(layer):
    """The recorder, the watchdog and the elastic layer read no private attribute of another object."""
    found = []
    for name, path in MODULES.items():
        if LAYERS[_layer(name)][0] != layer:
            continue
        for i, line in enumerate(open(path), 1):
            code = line.split("#", 1)[0]
            for var, attr in _PRIVATE_READ.findall(code):
                if (name, var) in _ALLOWED or attr.startswith("__") or var in ("sys", "os", "B", "_nccl", "pycoll"):
                    continue
                found.append(f"{os.path.relpath(path, PKG)}:{i}: {var}.{attr}")
    assert not found, "private attributes read across objects:\n" + "\n".join(found)


def test_the_public_surface_is_documented():
    """Every name of ``pycoll.__all__``, and every public method and property of its classes, has a docstring (its
    own, or the one it overrides: a store's ``get`` is documented by ``Store.get``)."""
    import inspect

    import pycoll

    def documented(cls, name, value):
        return any((getattr(vars(c).get(name), "__doc__", None) or "").strip()
                   for c in (cls.__mro__ if cls is not None else ()) if name in vars(c)) or bool(
            cls is None and (inspect.getdoc(value) or "").strip())

    missing = []
    for name in pycoll.__all__:
        obj = getattr(pycoll, name)
        if inspect.isclass(obj):
            missing += [] if (obj.__doc__ or "").strip() else [name]
            missing += [f"{name}.{m}" for m, v in vars(obj).items() if not m.startswith("_")
                        and (isinstance(v, property) or callable(v)) and not documented(obj, m, v)]
        elif callable(obj) and not documented(None, name, obj):
            missing.append(name)
    assert missing == []


def test_the_public_surface_is_one_literal_list():
    """``pycoll.__all__`` is a list of string literals, every error class among them, each bound in the package: the
    one form every type checker reads (mypy took no name from a starred ``*errors.__all__`` element, so ``from pycoll
    import *`` gave a checked program no ``CommTimeout``)."""
    import pycoll
    import pycoll.errors

    tree = ast.parse(open(os.path.join(PKG, "__init__.py")).read())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["__all__"]]
    assert isinstance(value, ast.List) and all(isinstance(e, ast.Constant) for e in value.elts), ast.dump(value)
    names = [e.value for e in value.elts]
    assert names == pycoll.__all__ and len(set(names)) == len(names)
    assert set(pycoll.errors.__all__) <= set(names)
    assert all(hasattr(pycoll, n) for n in names)
