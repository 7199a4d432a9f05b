# The Python stack capture (included by _nccl.pyx): the innermost frames' code objects and instruction
# offsets, read through the C API (frames.h, which the flight recorder's compiled hook shares).

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject, Py_XDECREF

cdef extern from "frames.h":
    int pycoll_frames(PyObject** codes, int* lastis, int skip, int depth)

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)


def capture_stack(int skip, int depth):
    """``[code, f_lasti, code, f_lasti, ...]`` of up to ``depth`` frames, starting ``skip`` frames
    above the calling Python frame (``skip=1``: its caller), innermost first -- what a loop over
    ``sys._getframe(skip).f_back`` collecting ``f_code`` and ``f_lasti`` gives, without the loop's
    cost. The list is not tracked by the cyclic garbage collector (nothing in it can refer back to
    it)."""
    if depth < 0 or skip < 0:
        raise ValueError(f"skip and depth must be >= 0, got {skip}, {depth}")
    cdef PyObject** codes = <PyObject**>PyMem_Malloc(max(depth, 1) * sizeof(PyObject*))
    cdef int* lastis = <int*>PyMem_Malloc(max(depth, 1) * sizeof(int))
    cdef int i, n = 0
    cdef list out = []
    try:
        if codes == NULL or lastis == NULL:
            raise MemoryError()
        n = pycoll_frames(codes, lastis, skip, depth)
        for i in range(n):
            out.append(<object>codes[i])
            out.append(lastis[i])
    finally:
        for i in range(n):
            Py_XDECREF(codes[i])
        PyMem_Free(codes)
        PyMem_Free(lastis)
    PyObject_GC_UnTrack(<void*>out)
    return out
