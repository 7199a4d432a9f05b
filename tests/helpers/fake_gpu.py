"""A fake CUDA/HIP runtime with cuda-bindings' call shapes, for pycoll.devices' GPU classes on CPU.

Streams hold "work" items a test queues (``launch``) and completes (``finish``); events recorded on
a stream complete when the work queued before them is finished. Stream 0 and 1 are the legacy
default stream. ``sticky`` makes every event query fail (a sticky device error).
"""

from __future__ import annotations

import enum


class Handle:
    """Like cudaStream_t / hipStream_t objects: convertible with int()."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


class FakeGpuRuntime:
    """The handful of runtime functions pycoll uses, with CUDA's return-tuple convention."""

    def __init__(self, prefix, ndev=2, count_error=0):
        self.prefix = prefix
        p = prefix
        self.Err = enum.IntEnum(
            f"{p}Error_t",
            {
                f"{p}Success": 0,
                f"{p}ErrorInvalidValue": 1,
                f"{p}ErrorInsufficientDriver": 35,
                f"{p}ErrorInvalidResourceHandle": 400,
                f"{p}ErrorNotReady": 600,
                f"{p}ErrorStreamCaptureImplicit": 906,
                f"{p}ErrorIllegalAddress": 700,
            },
        )
        self.ndev, self.count_error = ndev, count_error
        self.current = 0
        self.sticky = 0  # an error every event query returns from now on (a sticky device error)
        # handle -> {"device", "flags", "pending": [...], "capture": status}; 1 is cudaStreamLegacy,
        # which 0 also names
        self.streams = {1: {"device": 0, "flags": 0, "pending": [], "capture": 0}}
        self.events = {}  # handle -> {"device", "flags", "pending": set of work ids}
        self.next = 0x7000
        self.log = []
        for name in (
            "GetDeviceCount",
            "GetDevice",
            "SetDevice",
            "StreamCreateWithFlags",
            "StreamDestroy",
            "StreamSynchronize",
            "StreamQuery",
            "StreamWaitEvent",
            "StreamIsCapturing",
            "EventCreateWithFlags",
            "EventDestroy",
            "EventRecord",
            "EventQuery",
            "EventSynchronize",
            "EventElapsedTime",
            "GetErrorString",
        ):
            setattr(self, p + name, getattr(self, "_" + name))

    def _ok(self, *values):
        return (self.Err(0),) + values

    def _err(self, code):
        return (self.Err(code),)

    def _GetDeviceCount(self):
        if self.count_error:
            return (self.Err(self.count_error), None)
        return self._ok(self.ndev)

    def _GetDevice(self):
        return self._ok(self.current)

    def _SetDevice(self, d):
        self.log.append(("set", d))
        self.current = d
        return self._ok()

    def _GetErrorString(self, err):
        return self._ok(f"text of {int(err)}".encode())

    def _StreamCreateWithFlags(self, flags):
        self.next += 0x10
        self.streams[self.next] = {"device": self.current, "flags": flags, "pending": [], "capture": 0}
        return self._ok(Handle(self.next))

    def _StreamDestroy(self, s):
        if int(s) not in self.streams:
            return self._err(400)
        del self.streams[int(s)]
        return self._ok()

    def _StreamSynchronize(self, s):
        self.streams[int(s)]["pending"].clear()
        return self._ok()

    def _StreamQuery(self, s):
        s = int(s) or 1
        if int(s) not in self.streams:
            return self._err(400)
        return self._ok() if not self.streams[int(s)]["pending"] else self._err(600)

    def _StreamWaitEvent(self, s, e, flags):
        self.log.append(("wait", int(s), int(e), flags))
        return self._ok()

    def _StreamIsCapturing(self, s):
        if int(s) == 0 and any(st["capture"] for st in self.streams.values()):
            return (self.Err(906), 0)
        return self._ok(self.streams[int(s)]["capture"] if int(s) in self.streams else 0)

    def _EventCreateWithFlags(self, flags):
        self.next += 0x10
        self.events[self.next] = {"device": self.current, "flags": flags, "pending": set()}
        return self._ok(Handle(self.next))

    def _EventDestroy(self, e):
        del self.events[int(e)]
        return self._ok()

    def _EventRecord(self, e, s):
        self.log.append(("record", int(e), int(s)))
        s = int(s) or 1
        pending = set(self.streams[s]["pending"]) if s in self.streams else set()
        self.events[int(e)]["pending"] = pending
        return self._ok()

    def _EventQuery(self, e):
        if self.sticky:
            return self._err(self.sticky)
        if int(e) not in self.events:
            return self._err(400)
        ev = self.events[int(e)]
        live = {w for st in self.streams.values() for w in st["pending"]}
        return self._ok() if not (ev["pending"] & live) else self._err(600)

    def _EventSynchronize(self, e):
        for st in self.streams.values():
            st["pending"] = [w for w in st["pending"] if w not in self.events[int(e)]["pending"]]
        return self._ok()

    def _EventElapsedTime(self, a, b):
        if self.events[int(a)]["flags"] & 2 or self.events[int(b)]["flags"] & 2:
            return (self.Err(400), 0.0)
        return self._ok(2.25)

    # test helpers
    def launch(self, stream, work):
        """Queue ``work`` (any hashable) on ``stream``: events recorded after it wait for :meth:`finish`."""
        self.streams[int(stream) or 1]["pending"].append(work)

    def finish(self, stream):
        return self.streams[int(stream) or 1]["pending"].pop(0)
