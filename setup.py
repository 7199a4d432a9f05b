"""Build pycoll: the Cython bindings and the host library (a plain C shared object, never linked).

Nothing here needs CUDA, NCCL or ROCm: the NCCL API is declared in pycoll/_bindings/libnccl.pxd, the host
library's C sources are pycoll/_host/, and the libraries are opened with dlopen at run time.
"""

import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HOST_LIB = "pycoll._bindings.libpycoll_host"


class BuildExt(build_ext):
    """Builds the host library as ``libpycoll_host.so`` (no Python module init, no ABI tag)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # the extensions compile side by side (the bindings' C alone takes half)
            self.parallel = os.cpu_count() or 1

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == HOST_LIB.split(".")[-1]:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        if ext.name == HOST_LIB:
            return []
        return super().get_export_symbols(ext)


host = Extension(
    HOST_LIB,
    sources=sorted(glob.glob("pycoll/_host/*.c")),
    include_dirs=["pycoll/_host"],
    depends=sorted(glob.glob("pycoll/_host/*.h")),  # a header's change rebuilds every source (setuptools checks)
    extra_compile_args=["-O3", "-std=gnu11", "-pthread", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"],
    extra_link_args=["-pthread", "-Wl,-Bsymbolic", "-Wl,--no-undefined"],
    libraries=["rt", "m"],
)

FRAMES = ["pycoll/_bindings/frames.h"]  # the stack capture the bindings and the recorder's hook share
core = Extension("pycoll._core", sources=["pycoll/_core.pyx"])
observer_hooks = Extension("pycoll.diagnostics._hooks", sources=["pycoll/diagnostics/_hooks.pyx"], depends=FRAMES)

bindings = Extension(
    "pycoll._bindings._nccl",
    sources=["pycoll/_bindings/_nccl.pyx"],
    libraries=["dl"],
    depends=FRAMES,
)

setup(
    ext_modules=[
        *cythonize([bindings, core, observer_hooks], language_level=3, nthreads=os.cpu_count() or 1,
                   compiler_directives={"embedsignature": True, "binding": True}),
        host,
    ],
    cmdclass={"build_ext": BuildExt},
)
