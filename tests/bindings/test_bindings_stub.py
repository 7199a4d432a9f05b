"""The type stubs of the compiled modules (the contract others code against; _nccl.pyi above all) match them."""

from __future__ import annotations

import ast
import inspect
import os

import pytest

from pycoll._bindings import _nccl

STUB = os.path.join(os.path.dirname(_nccl.__file__), "_nccl.pyi")


def _stub():
    with open(STUB) as f:
        tree = ast.parse(f.read())
    module_names, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            module_names.add(node.name)
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = item
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = item
                elif isinstance(item, ast.Assign):
                    members.update({t.id: item for t in item.targets if isinstance(t, ast.Name)})
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            module_names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            module_names.add(node.target.id)
    return module_names, classes


def test_every_stub_name_exists():
    names, classes = _stub()
    assert names - set(dir(_nccl)) == set()
    for cls, members in classes.items():
        obj = getattr(_nccl, cls)
        missing = {m for m in members if not m.startswith("__") and not hasattr(obj, m)}
        assert not missing, f"{cls}: in the stub but not in the module: {sorted(missing)}"


def test_every_public_name_is_in_the_stub():
    names, classes = _stub()
    assert set(_nccl.__all__) <= names
    # and every public name of the stub is exported (pycoll.bindings re-exports __all__)
    assert {n for n in names if not n.startswith("_")} - set(_nccl.__all__) == set()
    import pycoll.bindings

    assert pycoll.bindings.HOST_STREAM_HELP == _nccl.HOST_STREAM_HELP
    for cls in ("Library", "Config", "CollConfig", "UniqueId", "CommSlot"):
        public = {m for m in vars(getattr(_nccl, cls)) if not m.startswith("_")}
        assert public - set(classes[cls]) == set(), f"{cls}: not in the stub"


@pytest.mark.parametrize("method", [m for m in vars(_nccl.Library) if not m.startswith("_")])
def test_library_signatures_match(method):
    _, classes = _stub()
    node = classes["Library"][method]
    obj = getattr(_nccl.Library, method)
    if not isinstance(node, ast.FunctionDef) or not callable(obj):
        return
    decos = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
    if "property" in decos:
        assert isinstance(obj, property) or not callable(obj)
        return
    stub_params = [a.arg for a in node.args.args]
    real_params = list(inspect.signature(obj).parameters)
    assert stub_params == real_params, method


_KINDS = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
          inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.KEYWORD_ONLY: "keyword",
          inspect.Parameter.VAR_KEYWORD: "**"}


def _stub_params(node):
    a = node.args
    pos = a.posonlyargs + a.args
    out = [(p.arg, "positional", i >= len(pos) - len(a.defaults)) for i, p in enumerate(pos)]
    out += [(a.vararg.arg, "*", False)] if a.vararg else []
    out += [(p.arg, "keyword", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    return out + ([(a.kwarg.arg, "**", False)] if a.kwarg else [])


def _real_params(obj):
    return [(p.name, _KINDS[p.kind], p.default is not p.empty) for p in inspect.signature(obj).parameters.values()]


@pytest.mark.parametrize("module", ["pycoll._core", "pycoll.diagnostics._hooks"])
def test_the_other_compiled_modules_match_their_stubs(module):
    """Their ``__all__``, and every function's and method's parameters (names, kinds, which have defaults) as the
    compiled code has them: a parameter the stub names otherwise cannot be passed by keyword as the stub says."""
    import importlib

    mod = importlib.import_module(module)
    with open(os.path.join(os.path.dirname(mod.__file__), module.rsplit(".", 1)[1] + ".pyi")) as f:
        tree = ast.parse(f.read())
    functions, bad = [], []
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]:
            assert set(ast.literal_eval(node.value)) == set(mod.__all__)
        elif isinstance(node, ast.FunctionDef):
            functions.append((node.name, getattr(mod, node.name), node))
        elif isinstance(node, ast.ClassDef):
            functions += [(f"{node.name}.{m.name}", vars(getattr(mod, node.name))[m.name], m) for m in node.body
                          if isinstance(m, ast.FunctionDef) and not m.name.startswith("__")
                          and not any(getattr(d, "id", None) == "property" for d in m.decorator_list)]
    for name, obj, node in functions:
        if _stub_params(node) != _real_params(obj):
            bad.append((name, _stub_params(node), _real_params(obj)))
    assert functions and bad == []


def test_cuda_driver_tables_take_only_real_addresses():
    import ctypes

    from pycoll import _bindings

    ok = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(lambda e: 0)
    addr = ctypes.cast(ok, ctypes.c_void_p).value
    with pytest.raises(ValueError, match="event_query is NULL"):
        _bindings.CudaDriver.from_addresses(addr, 0, addr, addr, addr)
    with pytest.raises(TypeError, match="device_get"):
        _bindings.CudaDriver.from_addresses(addr, addr, addr, addr, "libcuda")
    with pytest.raises(TypeError, match="cuda_driver"):
        _bindings.CudaDriver()
    d = _bindings.CudaDriver.from_addresses(addr, addr, addr, addr, addr, keep=ok, source="test")
    assert d.query(0x10) == 0 and repr(d) == "<CudaDriver from test>"
    with pytest.raises(ValueError, match="event"):
        d.query(-1)
    # this machine's answer: a table where libcuda.so.1 loads and cuInit succeeds, else None; never an exception
    found = _bindings.cuda_driver()
    assert found is None or found.source == "libcuda.so.1"
    assert _bindings.cuda_driver() is found


def test_the_public_module_path_is_the_bindings():
    """``pycoll.bindings`` (an attribute once ``pycoll`` is imported, as nccl4py users write it) is the same objects."""
    import subprocess
    import sys

    code = ("import pycoll; from pycoll._bindings import _nccl; b = pycoll.bindings; "
            "assert all(getattr(b, n) is getattr(_nccl, n) for n in _nccl.__all__); print(b.Library.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "Library", out.stderr
