"""Every nccl* function the installed libnccl exports is declared, resolved, wrapped and stubbed.

The exported names come from the ELF dynamic symbol table of the wheel's libnccl.so.2 (read here
with a small ELF reader, no nm needed); the declared names from what the loader resolves
(``Library.symbols`` after load), so a future wheel adding a function fails this test until the
bindings declare it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import struct

import pytest

from pycoll._bindings import _nccl

pytestmark = pytest.mark.timeout(60)

STUB = os.path.join(os.path.dirname(_nccl.__file__), "_nccl.pyi")


def _wheel_lib():
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = os.path.join(base, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return None


def elf_dynamic_symbols(path: str) -> set:
    """Names of the defined, global or weak function symbols in .dynsym (ELF64 little-endian)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _name, sh_type, _flags, _addr, off, size, link, _info, _align, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_off, str_size = sections[link][4], sections[link][5]
        strtab = data[str_off:str_off + str_size]
        for k in range(size // entsize):
            st_name, st_info, _other, st_shndx, _value, _sz = struct.unpack_from("<IBBHQQ", data, off + k * entsize)
            bind, kind = st_info >> 4, st_info & 0xF
            if st_shndx == 0 or kind != 2 or bind not in (1, 2):  # defined, STT_FUNC, GLOBAL or WEAK
                continue
            end = strtab.index(b"\0", st_name)
            names.add(strtab[st_name:end].decode())
    return names


WHEEL = _wheel_lib()
needs_wheel = pytest.mark.skipif(WHEEL is None, reason="the nvidia-nccl wheel (nvidia/nccl/lib/libnccl.so.2) is absent")


def _declared():
    """The nccl* names the loader resolves for every library (read back from a loaded one)."""
    lib = _nccl.load("host")
    return {n for n in lib.symbols if n.startswith("nccl")} - set(_nccl.RCCL_FUNCTIONS)


@needs_wheel
def test_every_exported_function_is_declared():
    exported = {n for n in elf_dynamic_symbols(WHEEL) if n.startswith("nccl")}
    assert len(exported) >= 97, sorted(exported)
    missing = exported - _declared()
    assert not missing, f"libnccl exports functions pycoll does not declare: {sorted(missing)}"


@needs_wheel
def test_real_library_lacks_nothing_declared():
    lib = _nccl.load(WHEEL)
    assert lib.missing == []


def test_the_loader_resolves_exactly_the_declared_table():
    assert _declared() == set(_nccl.FUNCTIONS)
    assert set(_nccl.WRAPPERS) == set(_nccl.FUNCTIONS)


def _stub_library_methods(cls="Library"):
    with open(STUB) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
    raise AssertionError(f"no {cls} class in the stub")


def test_the_stub_has_every_public_name_and_host_library_method():
    with open(STUB) as f:
        tree = ast.parse(f.read())
    (names,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
    assert sorted(names) == sorted(_nccl.__all__)
    public = {m for m in vars(_nccl.HostLibrary) if not m.startswith("_")}
    assert sorted(public - _stub_library_methods("HostLibrary")) == []


def test_every_declared_function_has_a_wrapper_and_a_stub():
    stubbed = _stub_library_methods()
    for function, method in _nccl.WRAPPERS.items():
        assert method in vars(_nccl.Library), f"{function}: Library.{method} does not exist"
        assert method in stubbed, f"{function}: Library.{method} has no stub in _nccl.pyi"
        doc = getattr(_nccl.Library, method).__doc__ or ""
        assert doc.strip(), f"Library.{method} has no docstring"


def test_elf_reader_sees_the_host_library_exports():
    path = _nccl.load("host").path
    names = elf_dynamic_symbols(path)
    assert {"ncclCommQueryProperties", "ncclTeamWorld", "ncclLLA2ACalcSlots", "pycollHostGetVersion"} <= names
