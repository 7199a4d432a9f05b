# The flight recorder's per-call stack capture (included by _nccl.pyx): the innermost frames' code
# objects and instruction offsets, read through the C API; formatted into lines only at dump time.

cdef extern from *:
    """
    #include <frameobject.h>
    static PyObject* pycoll_capture_stack(int skip, int depth) {
    #if PY_VERSION_HEX >= 0x030B0000
        PyFrameObject* f = PyEval_GetFrame();
        Py_XINCREF(f);
        while (f && skip-- > 0) {
            PyFrameObject* back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
        PyObject* out = PyList_New(0);
        for (int i = 0; out && f && i < depth; i++) {
            PyObject* code = (PyObject*)PyFrame_GetCode(f);
            PyObject* lasti = PyLong_FromLong(PyFrame_GetLasti(f));
            if (!lasti || PyList_Append(out, code) < 0 || PyList_Append(out, lasti) < 0) Py_CLEAR(out);
            Py_DECREF(code);
            Py_XDECREF(lasti);
            PyFrameObject* back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
        Py_XDECREF(f);
        if (out) PyObject_GC_UnTrack(out);  /* code objects and ints: no cycle runs through it */
        return out;
    #else
        (void)skip; (void)depth;
        Py_RETURN_NONE;
    #endif
    }
    """
    object pycoll_capture_stack(int skip, int depth)


def capture_stack(int skip, int depth):
    """``[code, f_lasti, code, f_lasti, ...]`` of up to ``depth`` frames, starting ``skip`` frames
    above the calling Python frame (``skip=1``: its caller), innermost first -- what a loop over
    ``sys._getframe(skip).f_back`` collecting ``f_code`` and ``f_lasti`` gives, without the loop's
    cost. None before Python 3.11 (no ``PyFrame_GetLasti``): then loop in Python. The list is not
    tracked by the cyclic garbage collector (nothing in it can refer back to it), so a ring of them
    costs collections nothing."""
    if depth < 0 or skip < 0:
        raise ValueError(f"skip and depth must be >= 0, got {skip}, {depth}")
    return pycoll_capture_stack(skip, depth)
