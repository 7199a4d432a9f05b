"""Fakes of the core for the diagnostics' tests: a communicator that implements pycoll.hooks.CommView.

Operations are real :class:`pycoll.Work` objects with real buffers, without a library; the fake
plays the communicator's part (it alone sets a Work's state, as the Communicator does).
"""

from __future__ import annotations

import types

from pycoll.buffers import as_buffer
from pycoll.hooks import Progress
from pycoll.work import Work


class FakeComm:
    """Just what the recorder and the watchdog see of a Communicator; ``op()`` records an operation on it."""

    def __init__(self, recorder, rank, size, *, uid="0123456789abcdef", name="world", backend="host", generation=0,
                 global_ranks=None, store=None):
        self.recorder = recorder
        self.rank, self.size, self.uid, self.name = rank, size, uid, name
        self.backend, self.generation = backend, generation
        self.global_ranks = tuple(global_ranks) if global_ranks is not None else tuple(range(size))
        self.library = types.SimpleNamespace(version_tuple=(2, 32, 3))
        self.device = types.SimpleNamespace(make_current=lambda: None)
        self.state = "active"
        self.failure = None
        self.timeout = 30.0
        self.on_failure = "abort"
        self.store = store
        self.pending = []
        self.coll_seq = self.p2p_seq = 0
        self.checks = []
        self.busy_thread = None
        self.open = None  # {peer: count} for open_with (None: the library cannot say)
        recorder.comm_created(self)

    # -- the CommView ---------------------------------------------------------------------------

    @property
    def global_rank(self):
        return self.global_ranks[self.rank]

    @property
    def ops_issued(self):
        return self.coll_seq + self.p2p_seq

    def progress(self):
        return Progress.of(self.coll_seq, self.p2p_seq, self.pending)

    def outstanding(self):
        return list(self.pending)

    def next_deadline(self):
        return min((w.deadline for w in self.pending), default=None)

    def check(self, now=None):
        self.checks.append(now)

    def refresh(self, work):
        pass

    def try_refresh(self, work):
        pass

    def open_with(self, peer):
        return self.open.get(peer) if self.open is not None else None

    def peer_process(self, peer):
        return None

    def fail(self, exc, work=None):
        self.failure = exc

    # -- driving it -----------------------------------------------------------------------------

    def op(self, name, inp=None, out=None, *, peer=None, state="completed", timeout=30.0, capture_id=None, root=None,
           grouped=False):
        """Record one operation, left in ``state``; ``"captured"``: recorded into CUDA graph capture
        ``capture_id`` (1 when not given), as the Communicator does on a capturing stream (never outstanding);
        ``root``: a rooted collective's root, as the Communicator sets ``Work.root``; ``grouped``: it waits in a
        group() that has not ended (state scheduled)."""
        if state == "captured" and capture_id is None:
            capture_id = 1
        is_p2p = peer is not None
        if is_p2p:
            self.p2p_seq += 1
        else:
            self.coll_seq += 1
        ins = [as_buffer(inp)] if inp is not None else []
        outs = [as_buffer(out, writable=True)] if out is not None else []
        w = Work(self, name, self.coll_seq, self.p2p_seq, self.ops_issued, is_p2p, peer, timeout, 0, ins, outs,
                 capture_id=capture_id)
        w.root = root
        w.grouped = grouped
        self.recorder.work_enqueued(w)  # as Communicator._launch: before the library call
        w._state = state
        if state == "captured":
            w.inputs = w.outputs = []  # as Communicator._captured: it runs at the graph's replays
        elif state == "completed":
            w.time_started_ns = w.time_created_ns
            w.time_completed_ns = w.time_created_ns + 1000
            w.duration_ms = 0.001
            w.release_arrays()
            self.recorder.work_completed(w)  # as the Communicator does when an operation completes
        else:
            if state == "started":
                w.time_started_ns = w.time_created_ns
            self.pending.append(w)
        return w
