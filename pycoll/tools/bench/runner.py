"""Running a case: through Communicator methods or the raw bindings, timed, checked, combined over ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .arrays import _ArrayLib, _ptr
from .cases import Case
from .spec import DTYPES


def _comm_call(comm: Any, case: Case, stream: Optional[int], async_op: bool) -> Callable[[], Any]:
    """A no-argument callable running the case once through the Communicator's method."""
    name, root, op, n, r = case.spec.name, case.root, case.op, case.nranks, case.rank
    send, recv, ip = case.send, case.recv, case.in_place
    kw: Dict[str, Any] = {"stream": stream, "async_op": async_op}
    is_root = r == root
    if name == "all_reduce":
        out = None if ip else recv
        return lambda: comm.all_reduce(send, out, op, **kw)
    if name == "broadcast":
        out = None if ip else recv
        return lambda: comm.broadcast(send, root, out, **kw)
    if name == "reduce":
        out = None if ip else recv
        return lambda: comm.reduce(send, root, out, op, **kw)
    if name == "all_gather":
        inp = None if ip else send
        return lambda: comm.all_gather(inp, recv, **kw)
    if name == "reduce_scatter":
        out = None if ip else recv
        return lambda: comm.reduce_scatter(send, out, op, **kw)
    if name == "all_to_all":
        out = None if ip else recv
        return lambda: comm.all_to_all(send, out, **kw)
    if name == "gather":
        inp = None if (ip and is_root) else send
        out = recv if is_root else None
        return lambda: comm.gather(inp, out, root, **kw)
    if name == "scatter":
        inp = send if is_root else None
        out = None if (ip and is_root) else recv
        return lambda: comm.scatter(inp, out, root, **kw)
    if name == "send_recv":
        nxt, prv = (r + 1) % n, (r - 1) % n

        def sendrecv() -> Any:
            with comm.group():
                a = comm.send(send, nxt, **kw)
                b = comm.recv(recv, prv, **kw)
            return [a, b]

        return sendrecv
    raise AssertionError(name)


def _raw_call(comm: Any, case: Case, stream: int, timeout: float) -> Callable[[], Any]:
    """A no-argument callable running the case once through the bindings (``Library`` methods)."""
    from ... import _bindings as B

    lib, h = comm.library, comm.handle
    name, root, op, n, r = case.spec.name, case.root, case.op or 0, case.nranks, case.rank
    sp, rp, dtc, count, c = _ptr(case.send), _ptr(case.recv), case.dt.nccl, case.count, case.block
    in_progress = B.IN_PROGRESS

    def settle(status: int) -> None:
        # a nonblocking communicator may answer ncclInProgress; it must be polled before the next call
        if status == in_progress:
            deadline = time.monotonic() + timeout
            while lib.comm_get_async_error(h) == in_progress:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: the communicator stayed in progress for {timeout:.3g} s")
                time.sleep(0)
            code = lib.comm_get_async_error(h)
            if code != 0:
                from ...errors import error_class

                raise error_class(code)(code, name, lib.get_error_string(code), lib.get_last_error(h), lib.path)

    calls: Dict[str, Callable[[], int]] = {
        "all_reduce": lambda: lib.all_reduce(sp, rp, count, dtc, op, h, stream),
        "broadcast": lambda: lib.broadcast(sp, rp, count, dtc, root, h, stream),
        "reduce": lambda: lib.reduce(sp, rp, count, dtc, op, root, h, stream),
        "all_gather": lambda: lib.all_gather(sp, rp, c, dtc, h, stream),
        "reduce_scatter": lambda: lib.reduce_scatter(sp, rp, c, dtc, op, h, stream),
        "all_to_all": lambda: lib.all_to_all(sp, rp, c, dtc, h, stream),
        "gather": lambda: lib.gather(sp, rp, c, dtc, root, h, stream),
        "scatter": lambda: lib.scatter(sp, rp, c, dtc, root, h, stream),
    }
    if name == "send_recv":
        nxt, prv = (r + 1) % n, (r - 1) % n

        def sendrecv() -> None:
            lib.group_start()
            try:
                settle(lib.send(sp, count, dtc, nxt, h, stream))
                settle(lib.recv(rp, count, dtc, prv, h, stream))
            finally:
                status = lib.group_end()
            settle(status)

        return sendrecv
    fn = calls[name]

    def call() -> None:
        status = fn()
        if status:
            settle(status)

    return call


@dataclass
class Measurement:
    """The result of one case: per-iteration times (ns, slowest rank each) and the wrong count."""

    times_ns: np.ndarray
    wrong: Optional[int]

    def summary(self, nbytes: int, bus_factor: float) -> Dict[str, Any]:
        t = self.times_ns / 1e3
        med = float(np.median(t))
        algbw = nbytes / (med * 1e-6) / 1e9 if med > 0 else float("inf")
        return {
            "time_us": med,
            "time_us_mean": float(np.mean(t)),
            "time_us_min": float(np.min(t)),
            "time_us_p90": float(np.percentile(t, 90)),
            "iters": int(t.size),
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * bus_factor,
            "wrong": self.wrong,
        }


class _Runner:
    """Runs cases on one rank's communicator: timing, checking, aggregation over ranks."""

    def __init__(self, comm: Any, kit: _ArrayLib, *, api: str, use_stream: bool, op_timeout: float) -> None:
        self.comm = comm
        self.kit = kit
        self.api = api
        self.op_timeout = op_timeout
        self.device = comm.device
        self.stream: Optional[int] = self.device.create_stream() if use_stream else None
        self._events: List[Tuple[int, int]] = []

    def close(self) -> None:
        for a, b in self._events:
            self.device.destroy_event(a)
            self.device.destroy_event(b)
        self._events = []
        if self.stream is not None:
            stream, self.stream = self.stream, None
            self.device.destroy_stream(stream)

    def _call(self, case: Case) -> Callable[[], Any]:
        if self.api == "raw":
            return _raw_call(self.comm, case, self.stream or 0, self.op_timeout)
        return _comm_call(self.comm, case, self.stream, async_op=self.stream is not None)

    def _complete(self, pending: List[Any]) -> None:
        if self.stream is not None:
            self.device.synchronize_stream(self.stream)
        for item in pending:
            for w in item if isinstance(item, list) else [item]:
                if w is not None and hasattr(w, "wait"):
                    w.wait()

    def _event_pairs(self, n: int) -> List[Tuple[int, int]]:
        while len(self._events) < n:
            self._events.append((self.device.create_event(timing=True), self.device.create_event(timing=True)))
        return self._events[:n]

    def time_case(self, case: Case, iters: int, warmup: int) -> np.ndarray:
        """This rank's time of each iteration in ns (after ``warmup`` untimed ones)."""
        call = self._call(case)
        stream = self.stream
        pending = [call() for _ in range(warmup)]
        self._complete(pending)
        self.comm.barrier(timeout=self.op_timeout)
        times = np.empty(iters, dtype=np.float64)
        if stream is None:
            clock = time.perf_counter_ns
            for i in range(iters):
                t0 = clock()
                call()
                times[i] = clock() - t0
            return times
        dev = self.device
        pairs = self._event_pairs(iters)
        pending = []
        for start, end in pairs:
            dev.record_event(start, stream)
            pending.append(call())
            dev.record_event(end, stream)
        self._complete(pending)
        for i, (start, end) in enumerate(pairs):
            times[i] = dev.elapsed_ms(start, end) * 1e6
        return times

    def check_case(self, case: Case, corrupt: bool) -> int:
        case.fill()
        call = self._call(case)
        self._complete([call()])
        return case.check(corrupt)

    def allgather_f64(self, values: np.ndarray) -> np.ndarray:
        """Every rank's ``values`` (same length everywhere), one row per rank."""
        n = self.comm.size
        dbl = DTYPES["double"]
        src, dst = self.kit.empty(values.size, dbl), self.kit.empty(values.size * n, dbl)
        self.kit.assign(src, values)
        self.kit.sync()
        self.comm.all_gather(src, dst, timeout=self.op_timeout)
        self.kit.sync()
        return self.kit.fetch(dst, dbl).reshape(n, values.size)


def measure(runner: _Runner, case: Case, *, iters: int, warmup: int, check: bool,
            corrupt: bool = False) -> Measurement:
    """Time ``case`` on every rank, check it, and combine: every rank gets the same Measurement.

    Collective: every rank of the communicator must call it with the same case parameters.
    """
    mine = runner.time_case(case, iters, warmup)
    wrong = runner.check_case(case, corrupt) if check else 0
    table = runner.allgather_f64(np.append(mine, float(wrong)))
    return Measurement(times_ns=table[:, :iters].max(axis=0), wrong=int(table[:, iters].sum()) if check else None)
