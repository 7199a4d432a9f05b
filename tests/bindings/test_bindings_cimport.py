"""The shipped .pxd files work for Cython users: a module that cimports them is built and run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

pytestmark = pytest.mark.timeout(180)

ROOT = REPO

USER_MODULE = textwrap.dedent(
    '''
    # cython: language_level=3
    from libc.stdint cimport uintptr_t
    from pycoll._bindings.nccl cimport *
    from pycoll._bindings._nccl cimport Library, Config, UniqueId

    def layout():
        cdef ncclConfig_t cfg
        return (sizeof(ncclConfig_t), sizeof(ncclUniqueId), sizeof(ncclSimInfo_t),
                sizeof(ncclCollConfig_t), sizeof(ncclWaitSignalDesc_t), sizeof(ncclEncryptionConfig_t),
                <char*>&cfg.nvlsHostMode - <char*>&cfg, <char*>&cfg.commName - <char*>&cfg,
                NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT, NCCL_API_MAGIC, NCCL_SPLIT_NOCOLOR,
                <int>ncclFloat8e5m2, <int>ncclMaxRedOp, <int>ncclInProgress, <int>ncclHostCftDefault)

    def call_directly(Library lib):
        cdef int version = 0
        cdef ncclResult_t r
        if lib.fn.ncclGetVersion == NULL:
            return None
        with nogil:
            r = lib.fn.ncclGetVersion(&version)
        return (<int>r, version, lib.fn.ncclCommRevoke != NULL)

    def config_pointer(Config cfg):
        cdef ncclConfig_t* p = &cfg.c
        return (<uintptr_t>p, p.magic)
    '''
)


def test_cimport_from_a_user_module(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build a Cython module")
    (tmp_path / "usermod.pyx").write_text(USER_MODULE)
    setup = textwrap.dedent(
        f'''
        from setuptools import setup, Extension
        from Cython.Build import cythonize
        setup(ext_modules=cythonize([Extension("usermod", ["usermod.pyx"])], include_path=[{ROOT!r}], quiet=True),
              script_args=["build_ext", "--inplace", "-q"])
        '''
    )
    (tmp_path / "build_it.py").write_text(setup)
    env = dict(os.environ, PYTHONPATH=ROOT)
    built = subprocess.run([sys.executable, "build_it.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=170, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    check = textwrap.dedent(
        f'''
        import ctypes, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import usermod
        from pycoll._bindings import _nccl
        print(usermod.layout())
        cfg = _nccl.Config()
        addr, magic = usermod.config_pointer(cfg)
        assert addr == cfg.address and magic == 0xcafebeef
        try:
            lib = _nccl.load("nccl")
        except Exception:
            print("no-nccl")
        else:
            print(usermod.call_directly(lib), lib.version)
        '''
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert eval(lines[0]) == (120, 128, 24, 72, 16, 32, 112, 48, 23203, -(2**31), 0xCAFEBEEF, -1, 11,
                              2**31 - 1, 7, -(2**31))
    if lines[1] != "no-nccl":
        result, version = lines[1].rsplit(" ", 1)
        assert eval(result) == (0, int(version), True)
