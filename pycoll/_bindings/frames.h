/* The Python stack of the calling thread as code objects and instruction offsets, read through the C API:
 * what the flight recorder keeps of every operation (formatted into lines only at dump time), and what
 * pycoll.bindings.capture_stack returns. Included by _nccl.pyx and diagnostics/_hooks.pyx. */
#ifndef PYCOLL_FRAMES_H
#define PYCOLL_FRAMES_H

#include <Python.h>
#include <frameobject.h>

/* Up to `depth` frames, innermost first, starting `skip` frames above the innermost Python frame:
 * codes[i] gets a new reference to frame i's code object, lastis[i] its last instruction's offset in
 * bytes (frame.f_lasti). Returns how many were written. May create frame objects (the interpreter
 * makes them lazily), so a caller that must not be interrupted by the collector captures first. */
static int pycoll_frames(PyObject **codes, int *lastis, int skip, int depth) {
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    int n = 0;
    Py_XINCREF(f);
    while (f && skip-- > 0) {
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    while (f && n < depth) {
        codes[n] = (PyObject *)PyFrame_GetCode(f);
#if PY_VERSION_HEX >= 0x030B0000
        lastis[n] = PyFrame_GetLasti(f);
#else
        lastis[n] = f->f_lasti < 0 ? -1 : f->f_lasti * (int)sizeof(_Py_CODEUNIT); /* 3.10: in code units */
#endif
        n++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    return n;
}

#endif
