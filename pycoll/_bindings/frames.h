/* The Python stack of the calling thread as code objects and instruction offsets, read from the interpreter:
 * what the flight recorder keeps of every operation (formatted into lines only at dump time), and what
 * pycoll.bindings.capture_stack returns. Included by _nccl.pyx and diagnostics/_hooks.pyx. */
#ifndef PYCOLL_FRAMES_H
#define PYCOLL_FRAMES_H

#include <Python.h>
#include <frameobject.h>

/* CPython 3.11 and 3.12: the thread's interpreter frames are read in place, as PyFrame_GetBack walks them,
 * without making a frame object for each (the public API below makes one for every frame not yet seen as an
 * object: an allocation per frame of every call, where a training step calls its collectives from a function
 * entered afresh each step). The internal header is the one Cython includes for its tracebacks, from the
 * same interpreter's headers. Other versions take the public API. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && !defined(PYPY_VERSION) && !defined(Py_LIMITED_API)
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#  endif
#  include "internal/pycore_frame.h"
#  define PYCOLL_FRAMES_IN_PLACE 1
#endif

/* Up to `depth` frames, innermost first, starting `skip` frames above the innermost Python frame:
 * codes[i] gets a new reference to frame i's code object, lastis[i] its last instruction's offset in
 * bytes (frame.f_lasti). Returns how many were written. Through the public API it may create frame objects
 * (the interpreter makes them lazily), so a caller that must not be interrupted by the collector captures
 * first. */
static int pycoll_frames(PyObject **codes, int *lastis, int skip, int depth) {
#ifdef PYCOLL_FRAMES_IN_PLACE
    int n = 0;
    for (_PyInterpreterFrame *f = PyThreadState_GET()->cframe->current_frame; f && n < depth; f = f->previous) {
        if (_PyFrame_IsIncomplete(f)) /* being set up, or a C entry's shim: no frame of the stack */
            continue;
        if (skip > 0) {
            skip--;
            continue;
        }
        Py_INCREF(f->f_code);
        codes[n] = (PyObject *)f->f_code;
        int lasti = _PyInterpreterFrame_LASTI(f); /* in code units, as PyFrame_GetLasti reads it */
        lastis[n] = lasti < 0 ? -1 : lasti * (int)sizeof(_Py_CODEUNIT);
        n++;
    }
    return n;
#else
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
#endif
}

#endif
