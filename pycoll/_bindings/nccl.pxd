# The old name of libnccl.pxd (the NCCL C API for Cython), kept so that existing cimports compile.
from pycoll._bindings.libnccl cimport *
