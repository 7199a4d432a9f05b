"""``pycoll-run``: start the ranks of a job on this node, host its store, watch them.

Usage::

    pycoll-run -n 4 train.py --lr 0.1          # 4 ranks of `python train.py --lr 0.1`
    pycoll-run -n 4 -m package.module args      # like `python -m package.module`
    pycoll-run -n 2 --no-python ./a.out         # any executable
    python -m pycoll.run ...                    # the same

What it does:

* Hosts pycoll's TCP store in a thread of the launcher (node 0's launcher for multi-node jobs), with
  a random token (loopback only for a single-node job), so a rank's death never takes the store
  with it. Each rank gets the variables documented in :mod:`pycoll.launch.discovery` (``PYCOLL_RANK``,
  ``PYCOLL_WORLD_SIZE``, ``PYCOLL_LOCAL_RANK``, ``PYCOLL_LOCAL_WORLD_SIZE``, ``PYCOLL_NODE_RANK``,
  ``PYCOLL_NNODES``, ``PYCOLL_STORE_ADDR``, ``PYCOLL_STORE_PORT``, ``PYCOLL_STORE_TOKEN``,
  ``PYCOLL_RUN_ID``, ``PYCOLL_REPLACEMENT``, ``PYCOLL_REPLACES``), torchrun's ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE`` and ``MASTER_ADDR`` for this job
  (``MASTER_PORT`` is left as given: pycoll-run hosts no torch store; an outer torchrun's ``TORCHELASTIC_*``,
  ``ROLE_RANK``, ``ROLE_WORLD_SIZE`` and ``ROLE_NAME`` are removed) and ``PYTHONUNBUFFERED=1`` unless already set.
  Standard input is ``/dev/null``.
* Prefixes every line a rank writes with ``[rank<r>]: `` (stdout to stdout, stderr to stderr); lines
  go out whole and in order (a thread per destination writes them, the launcher's own messages with
  the ranks' stderr), so lines of different ranks never mix. A reader of the launcher's output that
  falls behind holds the ranks up (their pipes are not read while more than 1 MiB waits for it), as
  it would hold up a program writing to it, but never the launcher: ``--timeout``, signals and
  failures act at once. Once the job was stopped by ``--timeout`` or a signal, output that nothing
  reads for 0.5 s is dropped, with a note on stderr. A write that fails (a full disk; a reader that went
  away, as ``| head``, is none) drops the rest of that output with a note on stderr, and the exit status is
  then 1 where the job's would be 0.
* Forwards SIGINT, SIGTERM and SIGHUP to every rank and then stops the job (a second one kills it); forwards SIGUSR1
  and SIGUSR2 without stopping anything, to each rank that handles them (not to its process group; a rank without a
  handler, which they would end, is skipped with a warning). Multi-node, a signal to any node's launcher stops the job
  on every node, under ``--keep-going`` and ``--replace-failed`` too: a signal asks for the job to stop, and a node's
  slots stopped on request could not be replaced on another node. (A node that *fails* -- its launcher killed, its
  host lost -- is what an elastic job survives: its ranks die with its launcher and the survivors reshape without
  them.)
* Each rank runs in its own process group. Ranks die when the launcher dies (``PR_SET_PDEATHSIG``),
  whatever is left in a rank's process group is killed when the rank ends, and the launcher (a child
  subreaper) kills any remaining descendant before it exits: no process outlives the launcher -- except where
  the launcher itself is killed by SIGKILL (the OOM killer, a scheduler): its ranks still die with it, but processes
  they started themselves outlive them.

Exit status:

* Default: the job fails fast. The first rank to end with a non-zero status (or a signal) fails
  the job; the other ranks get SIGTERM, then SIGKILL after ``--grace`` seconds, and the launcher
  exits with that rank's exit code (128+N for a rank killed by signal N, as shells report it).
  Otherwise 0.
* ``--keep-going``: a failing rank does not stop the others. Its rank slot is *replaced* if
  ``--replace-failed`` still allows it (the replacement's own outcome then counts for the slot),
  otherwise it is *lost*. A lost slot is *deliberately lost* when, by the end of the job, some
  process has called :func:`~pycoll.launch.keys.mark_lost` for it (the elastic layer does, once the survivors have
  reshaped without it). The launcher exits 0 when every slot's last process exited with 0 or the
  slot was deliberately lost; otherwise with the exit code of the earliest failure that is neither
  replaced nor deliberately lost.
* ``--replace-failed K`` (implies ``--keep-going``): start up to K replacement processes in total
  (on this node) for ranks that failed. A replacement has the same ``PYCOLL_RANK`` and local rank,
  ``PYCOLL_REPLACEMENT=k`` (k-th replacement of that slot) and ``PYCOLL_REPLACES=<rank>``.
* A *hung* rank can never take part again: stopped (SIGSTOP, a tracer) while its slot is marked lost (the
  survivors went on without it), or, in a job of one node, stopped by a signal for 2 s while every other rank has
  ended (nobody is left to continue it). The launcher kills it, and that counts as the rank's failure: replaced as
  a crash is under ``--replace-failed``, else it fails the job unless ``--keep-going``.
* A job one of whose groups lost every member (:func:`~pycoll.launch.keys.mark_group_lost`: the elastic layer's
  replacements found nobody left to admit them) failed, whatever its replacements exited with: the launcher exits
  with the earliest failure's code (where no rank failed, its members ended on their own, without ``close()``: no
  failure).
* A job stopped by a signal exits with 128+signal, and a job that exceeded ``--timeout`` (counted from the
  launcher's start) with 124, on every node; the other nodes' launchers say which node stopped the job and why.
* Multi-node: a node that did not join within ``--join-timeout`` fails the job (``EXIT_NODE``, 1). A launcher whose
  ``--node-rank`` another launcher already joined as exits 1 and starts no rank: "joined twice" while that launcher
  runs, "already ran in this job" once it is gone (a restarted node: see below).
* A job whose store is lost while ranks run (node 0's store server stopped, or another node can no
  longer reach it) fails: its ranks are stopped and the launcher exits with 1 (``EXIT_STORE_LOST``).

Multi-node (as torchrun): run one launcher per node with ``--nnodes M --node-rank i --master-addr
HOST --master-port PORT`` and the same ``PYCOLL_STORE_TOKEN`` exported on every node. Node 0's
launcher hosts the store bound to ``--master-addr`` (``--store-bind`` overrides). Node i > 0's launcher
says "waiting for node 0's store at HOST:PORT" while it is not there, waits at most ``--join-timeout``
seconds (300; SIGINT and SIGTERM end the wait), then joins as node i. A second launcher for the same
node rank is refused: "node rank i joined twice" while the first runs -- on this host its process tells at once,
on another one a heartbeat of it within 4.5 s --, and "node rank i already ran in this job" once the first
finished (its node reported done), exited, or sent no heartbeat for 4.5 s. A running job cannot take a
restarted node, elastic or not: its ranks ended with its first launcher, and replacements are started only by
the launcher whose rank failed (on its own node, ``--replace-failed``); an elastic job's survivors can go on
without the node's ranks, and a job that needs them has to be started again. A launcher given another ``--nnodes``
or ``-n`` than node 0's is refused as it joins. Node 0 fails the job when a node
has not joined within ``--join-timeout`` ("node i never joined within N s") or, while ranks run, when a node that
joined sends no heartbeat for 30 s (its launcher is gone or hangs; under ``--keep-going`` only its ranks are lost),
and keeps the store up until every node that joined has finished (or stopped sending heartbeats for 30 s); once the
job was stopped -- before that wait or during it --, for ``--grace`` seconds and 2 more at most (a second signal to
node 0 ends that wait). A failure or request that stops one node's launcher -- a failed rank (without
``--keep-going``), ``--timeout``, a signal, a node that never joined -- stops the others, and every launcher exits
with that status: node 0 too where its own ranks had ended with 0, and where another node reports a failure as it
finishes.

Store keys the launcher writes (at the root of the store, under ``pycoll-run/``): see
:mod:`pycoll.launch.keys`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import logging
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from .. import _settings, failpoints as _fp
from .._procs import boot_id, stat_fields, task_files
from .._settings import requests_until
from ..errors import StoreError, StoreTimeout
from ..store import Store, TCPStore, TCPStoreServer
from ..store.tcp_server import unauthenticated_for
from . import discovery
from .keys import (
    KEY_ABORT,
    KEY_DONE,
    KEY_EXIT,
    KEY_FAILURE,
    KEY_FAILURES,
    KEY_GROUP_LOST,
    KEY_HEARTBEAT,
    KEY_JOINED,
    KEY_LOST,
    KEY_NOT_NEEDED,
    KEY_PROC,
    KEY_REPLACEMENT,
    KEY_RESULT,
    KEY_RESULT_READ,
    KEY_SHAPE,
)

__all__ = ["main", "EXIT_TIMEOUT", "EXIT_STORE_LOST"]

log = logging.getLogger("pycoll.run")

FP_SPAWN = _fp.declare("launch.spawn", "the launcher, before it starts a rank (rank= the rank started)")
FP_REPLACEMENT = _fp.declare("launch.replacement.start", "the launcher, before it starts a replacement")
FP_EXIT = _fp.declare("launch.exit", "the launcher, handling a rank's exit (rank= the rank that ended)")
FP_OUTPUT_WRITE = {
    fd: _fp.declare(f"launch.output.write.{name}", f"the launcher's {name} thread, before it writes a batch of lines "
                                                   f"(sleep: a slow reader)")
    for fd, name in ((1, "stdout"), (2, "stderr"))
}
FP_STORE_WAIT = _fp.declare("launch.store.wait", "node i > 0's launcher, before each try to reach node 0's store")
FP_NODE_JOIN = _fp.declare("launch.node.join", "node i > 0's launcher, reaching node 0's store, before it joins")
FP_NODE_REJOIN = _fp.declare("launch.node.rejoin", "node i > 0's launcher whose node rank a launcher on another host "
                             "joined first, each pass of its wait for that one's heartbeat")
FP_ABORT_SEND = _fp.declare("launch.abort.send", "a launcher, before it tells the other nodes to stop the job")
FP_ABORT_RECEIVE = _fp.declare("launch.abort.receive", "a launcher told by another node to stop the job, before it "
                               "stops its ranks")
FP_NODES_FINISH = _fp.declare("launch.nodes.finish", "node 0's launcher, each pass of its wait for the other nodes "
                              "to finish")
FP_OUTPUT_FLUSH = _fp.declare("launch.output.flush", "the launcher at exit, waiting for its output to be written")

EXIT_TIMEOUT = 124
EXIT_STORE_LOST = 1
EXIT_NODE = 1  # a node never joined (--join-timeout), or joined twice, or again after its first launcher ended
_MAX_LINE = 1 << 16
# bytes queued for the launcher's stdout (or stderr) above which it stops reading the ranks' pipes to it, so that a
# rank blocks in its write as it would writing to that reader itself; below _OUT_LOW it reads them again
_OUT_HIGH = 1 << 20
_OUT_LOW = 1 << 18
# once the job was stopped by --timeout or a signal: how long output that nothing reads may make no progress before
# the launcher drops it and exits
_OUT_LINGER_S = 0.5
_HEARTBEAT_S = 2.0
HUNG_ALONE_S = 2.0  # a rank stopped this long while every other rank has ended is hung (kill_hung)
_NODE_SILENCE_S = 30.0
_RESULT_WAIT_S = 2.0  # node 0's wait for the other nodes to read the job's result before its store closes
# node 0 waits for the nodes it (or another node) told to stop --grace seconds and this much more: their launchers
# learn of it at once (a blocking store get), then stop their ranks and report
_STOP_MARGIN_S = 2.0
# one try of node i > 0 to reach node 0's store; signals are handled between tries
_CONNECT_TRY_S = 0.5
#: most ranks one launcher starts (-n)
MAX_NPROC = 4096
# file descriptors the launcher needs per rank (its stdout and stderr pipes, and the pipes Popen
# opens while it starts the rank), and besides the ranks
_FDS_PER_RANK = 4
_FDS_RESERVED = 64


# --------------------------------------------------------------------------------------------------
# process helpers


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# Runs in the new process between fork and the real program: ask the kernel to SIGKILL us when
# the launcher dies (an attribute that survives execve), then exec the real command line.
_BOOT = (
    "import ctypes,os,sys\n"
    "if ctypes.CDLL(None,use_errno=True).prctl(1,9,0,0,0)!=0:\n"
    " sys.exit('pycoll-run: prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid()!=int(sys.argv[1]):os._exit(137)\n"
    "try:os.execvp(sys.argv[2],sys.argv[2:])\n"
    "except OSError as e:\n"
    " sys.stderr.write('pycoll-run: cannot execute %r: %s\\n'%(sys.argv[2],e.strerror));os._exit(127)\n"
)


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _exit_code(returncode: int) -> int:
    """Popen's returncode as a shell reports it: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(code: int, returncode: Optional[int] = None) -> str:
    """How a rank ended, from ``code`` (as a shell reports it) and Popen's ``returncode`` where known (negative: killed
    by a signal; a rank's ``sys.exit(137)`` is no SIGKILL). Without it (another node's report) a code above 128 is
    read as a signal's."""
    signum = -returncode if returncode is not None and returncode < 0 else 0
    if returncode is None and code > 128:
        signum = code - 128
    if signum:
        try:
            return f"was killed by {signal.Signals(signum).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask in /proc; False when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _is_stopped(pid: int, traced: bool = True) -> bool:
    """True while process ``pid`` is stopped by a signal (state T) or, ``traced``, by its tracer (t)."""
    fields = stat_fields(pid)
    return bool(fields and fields[0] in (("T", "t") if traced else ("T",)))


def _children_of(pid: int) -> List[int]:
    """The children of process ``pid``, zombies included: the ``children`` lists of its threads (Linux 3.5 on,
    where the kernel has them), else a scan of every process's ``stat`` (which the launcher would make every
    0.5 s, on a node with thousands of processes a few percent of a CPU)."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return _children_by_scan(pid)
    return [int(c) for listed in task_files(pid, "children").values() for c in listed.split()]


def _children_by_scan(pid: int) -> List[int]:
    out: List[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


# --------------------------------------------------------------------------------------------------
# output


class _Stream:
    """Lines from one pipe of one rank, forwarded with the rank's prefix."""

    def __init__(self, fd: int, dest: int, prefix: bytes, launcher: _Launcher) -> None:
        self.fd = fd
        self.dest = dest
        self.prefix = prefix
        self.buf = bytearray()
        self.launcher = launcher

    def feed(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.rfind(b"\n")
        if end >= 0:
            lines = bytes(self.buf[:end + 1])
            del self.buf[:end + 1]
            self.launcher.write(self.dest, b"".join(self.prefix + line + b"\n" for line in lines.split(b"\n")[:-1]))
        while len(self.buf) >= _MAX_LINE:
            chunk = bytes(self.buf[:_MAX_LINE])
            del self.buf[:_MAX_LINE]
            self.launcher.write(self.dest, self.prefix + chunk + b"\n")

    def finish(self) -> None:
        if self.buf:
            self.launcher.write(self.dest, self.prefix + bytes(self.buf) + b"\n")
            self.buf.clear()


class _Writer:
    """Writes batches of whole lines to one of the launcher's file descriptors (stdout or stderr) from a thread of
    its own, in the order queued, so that a reader that does not read blocks that thread, never the launcher's loop.

    The loop stops reading the ranks' pipes to a writer that is :attr:`full` (more than ``_OUT_HIGH`` bytes queued)
    until ``on_room`` says it drained below ``_OUT_LOW``; with :attr:`drop_excess` it drops (and counts) what would
    go beyond ``_OUT_HIGH`` instead. :meth:`abandon` drops what is queued: the thread, if it is blocked in a write,
    is left behind (a daemon), and writes nothing more once that write returns."""

    def __init__(self, fd: int, on_room: Callable[[], None]) -> None:
        self.fd = fd
        self.on_room = on_room
        self.cond = threading.Condition()
        self.queue: Deque[bytes] = collections.deque()
        self.pending = 0  # bytes queued and not yet written
        self.written = 0
        self.dropped = 0
        self.full = False
        self.drop_excess = False
        self.dead = False  # the descriptor failed (its reader went away) or was abandoned: output is dropped
        self.error: Optional[OSError] = None  # a write's failure other than its reader going away (a full disk)
        self.thread: Optional[threading.Thread] = None

    def put(self, data: bytes) -> None:
        with self.cond:
            if self.dead:
                if self.error is not None:
                    self.dropped += len(data)
                return
            if self.drop_excess and self.pending + len(data) > _OUT_HIGH:
                self.dropped += len(data)
                return
            self.queue.append(data)
            self.pending += len(data)
            if self.pending > _OUT_HIGH and not self.drop_excess:
                self.full = True
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=f"pycoll-run-output-{self.fd}", daemon=True)
                self.thread.start()
            self.cond.notify()

    def abandon(self) -> int:
        """Drop what is queued (and whatever comes later); returns the bytes dropped in all."""
        with self.cond:
            self.dead = True
            self.dropped += self.pending
            self.pending = 0
            self.queue.clear()
            return self.dropped

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                data = self.queue[0]
            _fp.hit(FP_OUTPUT_WRITE[self.fd])
            view = memoryview(data)
            failed = False
            while view:
                try:
                    n = os.write(self.fd, view)
                except InterruptedError:
                    continue
                except BlockingIOError:  # a non-blocking descriptor the launcher inherited
                    select.select([], [self.fd], [], 1.0)
                    continue
                except OSError as e:  # e.g. the reader of our stdout went away: drop this output
                    failed = True
                    if e.errno != errno.EPIPE:  # not `| head`: said at exit, and the job fails (as `cat > /dev/full`)
                        self.error = e
                    break
                view = view[n:]
                with self.cond:
                    if self.dead:  # abandoned meanwhile
                        return
                    self.pending -= n
                    self.written += n
            with self.cond:
                if failed:
                    self.dead = True
                    if self.error is not None:
                        self.dropped += self.pending
                    self.pending = 0
                    self.queue.clear()
                elif self.queue:  # abandon() may have emptied it
                    self.queue.popleft()
                room = self.full and self.pending <= _OUT_LOW
                if room:
                    self.full = False
            if room:
                self.on_room()
            if failed:
                return


def _write_if_ready(fd: int, data: bytes) -> None:
    """One write of a short text to ``fd`` where that cannot block (its reader may have stopped reading)."""
    try:
        if select.select([], [fd], [], 0)[1]:
            os.write(fd, data)
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------------------------------
# the launcher


@dataclass
class _Proc:
    rank: int
    local_rank: int
    replacement: int
    popen: subprocess.Popen
    streams: List[_Stream] = field(default_factory=list)
    code: Optional[int] = None
    stopped: bool = False  # the launcher asked it to stop, so its exit status does not count
    hung: bool = False  # stopped and never to take part again (kill_hung): killed, which counts as a failure


@dataclass
class _Config:
    command: List[str]
    nproc: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    store_bind: Optional[str]
    keep_going: bool
    replace_failed: int
    timeout: Optional[float]
    join_timeout: float
    grace: float
    prefix: bool
    verbose: bool


class _Launcher:
    def __init__(self, cfg: _Config) -> None:
        self.cfg = cfg
        self.world = cfg.nproc * cfg.nnodes
        self.run_id = secrets.token_hex(8)
        self.procs: List[_Proc] = []
        self.known_pids: set = set()
        self.fd_to_stream: Dict[int, Tuple[_Stream, _Proc]] = {}
        self.sel = selectors.DefaultSelector()
        self.server: Optional[TCPStoreServer] = None
        self.store: Optional[Store] = None
        self.token = ""
        self.store_addr = ""
        self.store_port = 0
        self.replacements_left = cfg.replace_failed
        self.replacement_count: Dict[int, int] = {}
        self.failures: List[Tuple[int, int, str]] = []  # (rank, code, how it ended) in the order seen, replaced or not
        self.failure_n: List[int] = []  # each one's number in the job's failures (KEY_FAILURE; 0: not recorded)
        self.counted = 0  # the job-wide number of the failure whose code result() returned (0: none, or not known)
        self.replaced_failures: set = set()  # indices into self.failures
        self.stopping = False
        self.stop_code: Optional[int] = None
        self.kill_deadline: Optional[float] = None
        self.signals_seen = 0
        self.sigchld = True
        self.last_poll = 0.0
        self.alone_since: Optional[float] = None  # since when the ranks still running are all stopped (kill_hung)
        self.notify_r, self.notify_w = socket.socketpair()
        #: the launcher's stdout and stderr, written from threads of their own (the ranks' lines, the launcher's log)
        self.writers = {fd: _Writer(fd, self._notify_room) for fd in (1, 2)}
        self.paused: Set[int] = set()  # the ranks' pipes not read while their destination's reader is behind
        self.output_bounded = False
        self.output_failed = False  # a write of the output to stdout or stderr failed (not a reader gone)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + cfg.timeout if cfg.timeout else None
        self.join_deadline = self.t0 + cfg.join_timeout
        #: node 0: the nodes that have not joined yet (checked every 0.25 s until they have)
        self.unjoined: Set[int] = set(range(1, cfg.nnodes)) if cfg.node_rank == 0 else set()
        self.missing_reported = False
        self.last_join_check = 0.0
        #: node 0: each node's last heartbeat count and when it changed; the nodes given up for their silence
        self.beats: Dict[int, Tuple[int, float]] = {}
        self.silent: Set[int] = set()
        self.last_beat_check = 0.0
        self.events: List[str] = []
        self.events_lock = threading.Lock()
        self.watch_stop = threading.Event()
        self.watcher: Optional[threading.Thread] = None
        self.wake_r, self.wake_w = socket.socketpair()
        for s in (self.wake_r, self.wake_w, self.notify_r, self.notify_w):
            s.setblocking(False)
        self.old_handlers: Dict[int, object] = {}
        self.old_wakeup = -1
        self.boot = boot_id()
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.sel.register(self.notify_r, selectors.EVENT_READ)

    # ---- output

    def write(self, dest: int, data: bytes) -> None:
        """Queue ``data`` (whole lines) for the launcher's ``dest`` (1: stdout, 2: stderr); never blocks."""
        self.writers[dest].put(data)

    def pause_reading(self, dest: int) -> None:
        """Stop reading the ranks' pipes to ``dest``, whose reader is behind (until :meth:`resume_reading`)."""
        log.debug("the reader of %s is behind; not reading the ranks' output to it until it catches up",
                  "stdout" if dest == 1 else "stderr")
        for fd, (stream, _) in self.fd_to_stream.items():
            if stream.dest == dest and fd not in self.paused:
                self.sel.unregister(fd)
                self.paused.add(fd)

    def resume_reading(self) -> None:
        for fd in list(self.paused):
            stream, _ = self.fd_to_stream[fd]
            if self.output_bounded or not self.writers[stream.dest].full:
                self.paused.discard(fd)
                self.sel.register(fd, selectors.EVENT_READ)

    def bound_output(self) -> None:
        """The job was stopped by --timeout or a signal: from now on output that the launcher's stdout or stderr
        does not take is dropped (and counted) rather than waited for."""
        if not self.output_bounded:
            self.output_bounded = True
            for w in self.writers.values():
                w.drop_excess = True
            self.resume_reading()

    def flush_output(self) -> None:
        """At exit: wait until the queued output is written -- for as long as it takes (as a program writing to a
        pipe waits for its reader) unless the job was stopped by --timeout or a signal, --timeout passed, or a
        signal comes meanwhile: then until it makes no progress for ``_OUT_LINGER_S``. What is left is dropped, with
        a note on stderr where stderr takes one."""
        writers = list(self.writers.values())
        last, since = -1, time.monotonic()
        while any(w.pending for w in writers):
            _fp.hit(FP_OUTPUT_FLUSH)
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                self.bound_output()
            if self.output_bounded:
                written = sum(w.written for w in writers)
                if written != last:
                    last, since = written, now
                elif now - since >= _OUT_LINGER_S:
                    break
            self.wait_events(0.05)
        stderr_free = not self.writers[2].dead and not self.writers[2].pending
        notes = []
        for w in writers:
            dropped = w.abandon()
            name = "stdout" if w.fd == 1 else "stderr"
            if w.error is not None:
                self.output_failed = True
                notes.append(f"pycoll-run: writing the output to {name} failed ({w.error.strerror or w.error}): "
                             f"dropped {dropped} bytes\n")
            elif dropped:
                notes.append(f"pycoll-run: dropped {dropped} bytes of output to {name}: nothing read it\n")
        if notes and stderr_free:
            _write_if_ready(2, "".join(notes).encode())

    # ---- store

    def open_store(self) -> bool:
        """Host the store (node 0) or reach node 0's and join (node i > 0); False: a signal or --timeout stopped the
        launcher meanwhile (then :attr:`stop_code` is its exit code)."""
        cfg = self.cfg
        if cfg.nnodes > 1:
            self.token = os.environ.get(discovery.ENV_STORE_TOKEN, "")
            if not self.token.strip():  # blank: the ranks take it for unset (discovery), as it is no secret
                raise SystemExit(f"pycoll-run: {discovery.ENV_STORE_TOKEN} must be set (to the same secret on every "
                                 f"node) when --nnodes > 1" + (" (it is blank)" if self.token else ""))
        else:
            self.token = secrets.token_hex(32)
        self.store_addr, self.store_port = cfg.master_addr, cfg.master_port
        if cfg.node_rank == 0:
            bind = cfg.store_bind if cfg.store_bind is not None else cfg.master_addr
            try:
                self.server = TCPStoreServer(bind, cfg.master_port, self.token,
                                             max_unauthenticated=unauthenticated_for(self.world)).start()
            except StoreError as exc:
                raise SystemExit(f"pycoll-run: cannot host the store: {exc}") from None
            self.store_port = self.server.port
            self.store = self.server.client(timeout=30.0)
            # what the other nodes must have been given, and the job's run id (one dump folder for the job)
            self.store.set(KEY_SHAPE, f"{cfg.nnodes} {cfg.nproc} {self.run_id}")
            log.debug("store on %s:%d", bind, self.store_port)
        else:
            store = self.wait_for_node0()
            if store is None:
                return False
            self.store = store
            return self.join()
        return True

    def wait_for_node0(self) -> Optional[TCPStore]:
        """Node i > 0: reach node 0's store, trying until --join-timeout (or --timeout) passes; signals are handled
        meanwhile (None: one stopped the launcher; its exit code is :attr:`stop_code`)."""
        cfg = self.cfg
        where = f"{cfg.master_addr}:{cfg.master_port}"
        announced = False
        while True:
            _fp.hit(FP_STORE_WAIT)
            try:
                store = TCPStore(cfg.master_addr, cfg.master_port, self.token, timeout=30.0,
                                 connect_timeout=_CONNECT_TRY_S)
            except StoreTimeout:  # nobody answers there yet
                pass
            except StoreError as exc:
                raise SystemExit(f"pycoll-run: node {cfg.node_rank} cannot use the store of node 0 at {where}: "
                                 f"{exc}") from None
            else:
                store.connect_timeout = 30.0  # for the connections it opens later
                return store
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                log.error("the job exceeded --timeout %g s while waiting for node 0's store at %s", cfg.timeout,
                          where)
                self.stop(EXIT_TIMEOUT)
                return None
            if now >= self.join_deadline:
                raise SystemExit(f"pycoll-run: node 0's store at {where} did not answer within {cfg.join_timeout:g} "
                                 f"s (--join-timeout): is node 0's launcher running, with this --master-addr and "
                                 f"--master-port?")
            if not announced:
                log.info("waiting for node 0's store at %s (up to %g s, --join-timeout)", where, cfg.join_timeout)
                announced = True
            self.wait_events(0.25)
            if self.stopping:
                return None

    def join(self) -> bool:
        """Node i > 0: register as node i in the job's store. SystemExit if another launcher did first: "joined twice"
        while that launcher lives (two launchers were given one --node-rank), else "already ran in this job" (a
        restarted node, which a running job cannot take). False: a signal or --timeout stopped this launcher while
        it looked at that launcher (:attr:`stop_code` is its exit code)."""
        assert self.store is not None
        cfg = self.cfg
        _fp.hit(FP_NODE_JOIN)
        self.check_shape()
        fields = stat_fields(os.getpid())
        me = f"{self.run_id} {socket.gethostname()} {os.getpid()} {self.boot} {fields[19] if fields else ''}"
        try:
            first = self.store.compare_set(KEY_JOINED.format(node=cfg.node_rank), b"", me).decode("utf-8", "replace")
        except StoreError as exc:
            raise SystemExit(f"pycoll-run: node {cfg.node_rank} could not join the job in node 0's store: "
                             f"{exc}") from None
        if first == me:
            log.debug("joined as node %d", cfg.node_rank)
            return True
        _, host, pid, boot, start = [*first.split(" "), "?", "?", "", "", ""][:5]
        gone = self.gone_why(host, pid, boot, start)
        if gone is None:
            return False
        node = cfg.node_rank
        if not gone:
            raise SystemExit(f"pycoll-run: node rank {node} joined twice: the launcher on {host} (pid {pid}) joined as "
                             f"node {node} first and is running; give each node's launcher its own --node-rank")
        raise SystemExit(f"pycoll-run: node rank {node} already ran in this job: the launcher on {host} (pid {pid}) "
                         f"joined as node {node} and {gone}. A running job cannot take a restarted node: its ranks "
                         f"ended with that launcher, and pycoll-run starts no rank of a job again on a new launcher "
                         f"(a replacement is started by the launcher whose rank failed); restart the whole job -- an "
                         f"elastic job (ElasticGroup, --keep-going) can go on without this node's ranks")

    def check_shape(self) -> None:
        """Node i > 0: SystemExit unless node 0's launcher was given the same --nnodes and -n (ranks are numbered
        node rank x -n + local rank: other numbers give two ranks one number, or the ranks different world sizes);
        its ranks get node 0's run id (``PYCOLL_RUN_ID``: the job's dumps go to one folder)."""
        assert self.store is not None
        cfg = self.cfg
        try:
            shape = self.store.get(KEY_SHAPE, 30.0).decode("utf-8", "replace")
        except StoreError as exc:
            raise SystemExit(f"pycoll-run: node {cfg.node_rank} could not read node 0's --nnodes and -n in its store: "
                             f"{exc}") from None
        nnodes, nproc, run_id = [*shape.split(" "), "", "", ""][:3]
        if run_id:
            self.run_id = run_id
        if (nnodes, nproc) != (str(cfg.nnodes), str(cfg.nproc)):
            raise SystemExit(f"pycoll-run: node {cfg.node_rank} was started with --nnodes {cfg.nnodes} -n {cfg.nproc} "
                             f"but node 0 with --nnodes {nnodes} -n {nproc}: give every node's launcher the same")

    def gone_why(self, host: str, pid: str, boot: str, start: str) -> Optional[str]:
        """Node i > 0, whose node rank the launcher on ``host`` (``pid``, its boot id and start time) joined first:
        how that launcher ended ("" while it is running; None: a signal or --timeout stopped this launcher while it
        looked). On this host its process tells; on another one, its node's "done" key or its heartbeats (sent
        every ``_HEARTBEAT_S`` s) that stop for twice that."""
        assert self.store is not None
        node = self.cfg.node_rank
        done_key, hb_key = KEY_DONE.format(node=node), KEY_HEARTBEAT.format(node=node)
        if self.store_call("read whether a node finished", "check", [done_key]):
            code = self.store_call("read a node's exit code", "get", done_key, 1.0)  # "<code> <failure number>"
            return f"finished (exit code {code.decode('utf-8', 'replace').split()[0] if code else '?'})"
        if boot and boot == self.boot and pid.isdigit():
            fields = stat_fields(int(pid))
            if fields is None or fields[0] in ("Z", "X") or (start and fields[19] != start):
                return "is gone (its process exited)"
            return ""
        beats = self.store_call("read a node's heartbeats", "add", hb_key, 0)
        end = time.monotonic() + 2 * _HEARTBEAT_S + 0.5
        while time.monotonic() < end:
            _fp.hit(FP_NODE_REJOIN)
            self.wait_events(0.25)
            if self.stopping:
                return None
            if self.deadline is not None and time.monotonic() >= self.deadline:
                log.error("the job exceeded --timeout %g s while node %d's launcher looked whether node %d's first "
                          "launcher lives", self.cfg.timeout, node, node)
                self.stop(EXIT_TIMEOUT)
                return None
            if self.store_call("read a node's heartbeats", "add", hb_key, 0) != beats:
                return ""
        return f"sent no heartbeat for {2 * _HEARTBEAT_S + 0.5:g} s (it is gone, or hangs)"

    def store_call(self, what: str, method: str, *args: Any) -> Any:
        """Call a store method; log and return None when the store cannot be reached."""
        if self.store is None:
            return None
        try:
            return getattr(self.store, method)(*args)
        except StoreError as exc:
            log.warning("could not %s in the store: %s", what, exc)
            return None

    def start_watcher(self) -> None:
        self.watcher = threading.Thread(target=self._watch, name="pycoll-run-watch", daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        """Wait for another launcher's abort; heartbeat for node 0 (multi-node)."""
        assert self.store is not None
        hb_key = KEY_HEARTBEAT.format(node=self.cfg.node_rank)
        while not self.watch_stop.is_set():
            try:
                value = self.store.get(KEY_ABORT, timeout=_HEARTBEAT_S)
            except StoreTimeout:
                if self.cfg.node_rank != 0:
                    try:
                        self.store.add(hb_key, 1)
                    except StoreError:
                        pass
                continue
            except StoreError as exc:
                if not self.watch_stop.is_set():
                    self._notify(f"store-lost {exc}")
                return
            self._notify("abort " + value.decode("utf-8", "replace"))
            return

    def _notify_room(self) -> None:
        self._notify("output-room")

    def _notify(self, event: str) -> None:
        with self.events_lock:
            self.events.append(event)
        try:
            self.notify_w.send(b"x")
        except OSError:
            pass

    # ---- processes

    def rank_env(self, rank: int, local_rank: int, replacement: int) -> Dict[str, str]:
        cfg = self.cfg
        env = {k: v for k, v in os.environ.items()
               if k not in _MANAGED_VARS and k not in _STALE_VARS and not k.startswith("TORCHELASTIC_")}
        store_addr = self.store_addr if self.store_addr not in ("", "0.0.0.0", "::") else "127.0.0.1"
        env.update({
            # torchrun's names, so that torch code's env:// sees this job rather than an outer one's (MASTER_PORT
            # stays as given: pycoll-run hosts no torch store)
            "RANK": str(rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(cfg.nproc), "GROUP_RANK": str(cfg.node_rank), "GROUP_WORLD_SIZE": str(cfg.nnodes),
            "MASTER_ADDR": store_addr,
        })
        env.update({
            discovery.ENV_RANK: str(rank),
            discovery.ENV_WORLD_SIZE: str(self.world),
            discovery.ENV_LOCAL_RANK: str(local_rank),
            discovery.ENV_LOCAL_WORLD_SIZE: str(cfg.nproc),
            discovery.ENV_NODE_RANK: str(cfg.node_rank),
            discovery.ENV_NNODES: str(cfg.nnodes),
            discovery.ENV_STORE_ADDR: store_addr,
            discovery.ENV_STORE_PORT: str(self.store_port),
            discovery.ENV_STORE_TOKEN: self.token,
            discovery.ENV_RUN_ID: self.run_id,
            discovery.ENV_REPLACEMENT: str(replacement),
        })
        if replacement:
            env[discovery.ENV_REPLACES] = str(rank)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def spawn(self, rank: int, local_rank: int, replacement: int) -> _Proc:
        # Always called from the main thread: PR_SET_PDEATHSIG fires when the *thread* that forked
        # the child exits, so children must not be forked from short-lived threads.
        _fp.hit(FP_SPAWN, rank)
        cmd = self.cfg.command
        if sys.platform.startswith("linux"):
            cmd = [sys.executable, "-I", "-S", "-c", _BOOT, str(os.getpid()), *cmd]
        popen = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.rank_env(rank, local_rank, replacement), start_new_session=True, close_fds=True,
        )
        proc = _Proc(rank, local_rank, replacement, popen)
        self.known_pids.add(popen.pid)
        # before the process says who it is (it may be stopped or die before it can), the others can tell this
        # one's fate from its pid: the elastic layer's formation does
        self.store_call("record a rank's process", "set", KEY_PROC.format(rank=rank),
                        f"{self.boot} {popen.pid} {replacement}")
        prefix = f"[rank{rank}]: ".encode() if self.cfg.prefix else b""
        for pipe, dest in ((popen.stdout, 1), (popen.stderr, 2)):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            stream = _Stream(fd, dest, prefix, self)
            proc.streams.append(stream)
            self.fd_to_stream[fd] = (stream, proc)
            self.sel.register(fd, selectors.EVENT_READ)
        self.procs.append(proc)
        return proc

    def live(self) -> List[_Proc]:
        return [p for p in self.procs if p.code is None]

    def read_stream(self, fd: int) -> None:
        stream, _ = self.fd_to_stream[fd]
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            stream.feed(data)
            if self.writers[stream.dest].full and not self.output_bounded:
                self.pause_reading(stream.dest)
            return
        stream.finish()
        self.close_stream(fd)

    def close_stream(self, fd: int) -> None:
        if fd in self.paused:
            self.paused.discard(fd)
        else:
            self.sel.unregister(fd)
        del self.fd_to_stream[fd]
        os.close(fd)

    def poll_children(self, force: bool = False) -> None:
        """Handle ranks that ended; runs after SIGCHLD, and at least every 0.5 s as a safety net."""
        now = time.monotonic()
        if not (force or self.sigchld or now - self.last_poll >= 0.5):
            return
        self.sigchld = False
        self.last_poll = now
        for proc in self.live():
            rc = proc.popen.poll()
            if rc is not None:
                self.on_exit(proc, _exit_code(rc))
        self.reap_strays()
        self.kill_hung(now)

    def kill_hung(self, now: float) -> None:
        """A stopped rank that can never take part again is hung: end it, so that the job ends when the others do
        (nobody else would). Its end is the rank's failure: replaced if ``--replace-failed`` allows it, as a rank that
        crashed would be, else under ``--keep-going`` the slot's loss, else the job's failure (:meth:`on_exit`).

        Hung: stopped (SIGSTOP, a tracer) while its slot is marked lost (the survivors went on without it), or, in a
        job of one node, stopped by a signal for ``HUNG_ALONE_S`` while every other rank has ended (no peer is left
        to continue it; a debugger's stop is not such a stop)."""
        live = [p for p in self.live() if not (p.stopped or p.hung)]
        stopped = [p for p in live if _is_stopped(p.popen.pid)]
        for proc in stopped:
            if self.store_call("read lost ranks", "check", [KEY_LOST.format(rank=proc.rank)]):
                log.info("rank %d is stopped and was marked lost (hung); killing it", proc.rank)
                proc.hung = True
                _killpg(proc.popen.pid, signal.SIGKILL)
        alone = (self.cfg.nnodes == 1 and stopped and len(stopped) == len(live) and len(self.procs) >= self.world
                 and all(_is_stopped(p.popen.pid, traced=False) for p in stopped if not p.hung))
        if not alone:
            self.alone_since = None
            return
        if self.alone_since is None:
            self.alone_since = now
        if now - self.alone_since < HUNG_ALONE_S:
            return
        for proc in stopped:
            if not proc.hung:
                log.error("rank %d is stopped (SIGSTOP) and every other rank has ended: nobody is left to continue it "
                          "(hung); killing it", proc.rank)
                proc.hung = True
                _killpg(proc.popen.pid, signal.SIGKILL)

    def reap_strays(self) -> None:
        """Kill and reap descendants re-parented to us (we are a subreaper) after their parent died."""
        for pid in _children_of(os.getpid()):
            if pid in self.known_pids:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def on_exit(self, proc: _Proc, code: int) -> None:
        _fp.hit(FP_EXIT, proc.rank)
        proc.code = code
        _killpg(proc.popen.pid, signal.SIGKILL)  # whatever the rank left in its process group
        rank = proc.rank
        if proc.stopped:
            log.debug("rank %d %s after being stopped", rank, _describe(code, proc.popen.returncode))
            return
        if proc.hung:  # killed here: a failure whatever the status says (0 if it was continued and finished)
            code = code or 128 + signal.SIGKILL
        what = "hung (stopped) and was killed" if proc.hung else _describe(code, proc.popen.returncode)
        if code != 0:
            self.failures.append((rank, code, what))
            n = self.store_call("count a failure", "add", KEY_FAILURES, 1)
            self.failure_n.append(n or 0)
            if n is not None:
                self.store_call("record a failure", "set", KEY_FAILURE.format(n=n), f"{rank} {code}")
        # last: whoever waits for the exit code finds the failure recorded
        self.store_call("record an exit code", "set", KEY_EXIT.format(rank=rank), str(code))
        if code == 0:
            return
        if self.stopping:
            return
        if not self.cfg.keep_going:
            log.error("rank %d %s; stopping the other ranks", rank, what)
            self.tell_nodes(rank, code)
            self.stop(code)
            return
        if self.replacements_left > 0 and self.store_call("read whether a replacement is needed", "check",
                                                          [KEY_NOT_NEEDED.format(rank=rank)]):
            log.info("rank %d %s: its group finished before it was admitted; no replacement", rank, what)
            return
        if self.replacements_left > 0:
            self.replacements_left -= 1
            k = self.replacement_count.get(rank, 0) + 1
            self.replacement_count[rank] = k
            self.replaced_failures.add(len(self.failures) - 1)
            log.warning("rank %d %s; starting replacement %d for it (%d replacements left)", rank, what, k,
                        self.replacements_left)
            self.store_call("record a replacement", "set", KEY_REPLACEMENT.format(rank=rank), str(k))
            _fp.hit(FP_REPLACEMENT, rank)
            try:
                self.spawn(rank, proc.local_rank, k)
            except OSError as exc:
                log.error("could not start a replacement for rank %d: %s", rank, exc)
            return
        log.warning("rank %d %s; the other ranks go on (--keep-going)", rank, what)

    def tell_nodes(self, rank: int, code: int, why: str = "") -> None:
        """Tell the other nodes' launchers to stop the job (``rank`` -1: not for a rank's failure, ``why`` says
        why)."""
        if self.cfg.nnodes == 1:
            return
        _fp.hit(FP_ABORT_SEND)
        self.store_call("tell the other nodes", "set", KEY_ABORT,
                        f"{self.cfg.node_rank} {rank} {code}" + (f" {why}" if why else ""))

    def check_joined(self, now: float) -> None:
        """Node 0, while ranks run: a node that has not joined by --join-timeout fails the job."""
        if not self.unjoined or now - self.last_join_check < 0.25:
            return
        self.last_join_check = now
        for node in sorted(self.unjoined):
            self.joined(node)
        if self.unjoined and now >= self.join_deadline and not self.stopping:
            why = self.missing_nodes()
            log.error("%s; stopping the job", why)
            self.tell_nodes(-1, EXIT_NODE, why)
            self.stop(EXIT_NODE)

    def node_silence(self, node: int, now: float) -> Optional[float]:
        """Node 0: for how long ``node`` has sent no heartbeat, counted from node 0's first look (None: the store
        cannot tell)."""
        beats = self.store_call("read heartbeats", "add", KEY_HEARTBEAT.format(node=node), 0)
        if beats is None:
            return None
        last, since = self.beats.get(node, (-1, now))
        if beats != last:
            self.beats[node] = (beats, now)
            return 0.0
        return now - since

    def check_heartbeats(self, now: float) -> None:
        """Node 0, while ranks run: a node that joined and then sent no heartbeat for ``_NODE_SILENCE_S`` (its
        launcher is gone or hangs, its ranks with it) fails the job as a failed rank does; under --keep-going its
        ranks are lost and the others go on."""
        cfg = self.cfg
        if cfg.node_rank != 0 or cfg.nnodes == 1 or now - self.last_beat_check < 1.0:
            return
        self.last_beat_check = now
        for node in range(1, cfg.nnodes):
            if node in self.unjoined or node in self.silent:
                continue
            silent = self.node_silence(node, now)
            if silent is None or silent <= _NODE_SILENCE_S:
                continue
            if self.store_call("check nodes", "check", [KEY_DONE.format(node=node)]):
                continue  # finished: no more heartbeats
            self.silent.add(node)
            why = f"node {node} sent no heartbeat for {_NODE_SILENCE_S:g} s (its launcher is gone or hangs)"
            if cfg.keep_going:
                log.warning("%s; its ranks are lost, the others go on (--keep-going)", why)
            elif not self.stopping:
                log.error("%s; stopping the job", why)
                self.tell_nodes(-1, EXIT_NODE, why)
                self.stop(EXIT_NODE)

    def joined(self, node: int) -> bool:
        """Node 0: whether ``node`` has joined the job (it leaves :attr:`unjoined` once it has)."""
        if node in self.unjoined and self.store_call("read which nodes joined", "check",
                                                     [KEY_JOINED.format(node=node)]):
            self.unjoined.discard(node)
        return node not in self.unjoined

    def missing_nodes(self) -> str:
        self.missing_reported = True
        nodes = sorted(self.unjoined)
        names = f"node {nodes[0]}" if len(nodes) == 1 else "nodes " + ", ".join(map(str, nodes))
        return f"{names} never joined within {self.cfg.join_timeout:g} s (--join-timeout)"

    def stop(self, code: Optional[int], sig: int = signal.SIGTERM) -> None:
        """Stop every live rank: ``sig`` now, SIGKILL after the grace period."""
        if not self.stopping:
            self.stopping = True
            self.stop_code = code
            self.kill_deadline = time.monotonic() + self.cfg.grace
        for proc in self.live():
            proc.stopped = True
            _killpg(proc.popen.pid, sig)
            _killpg(proc.popen.pid, signal.SIGCONT)

    def kill_all(self) -> None:
        for proc in self.live():
            proc.stopped = True
            _killpg(proc.popen.pid, signal.SIGKILL)

    # ---- signals

    def install_signals(self) -> None:
        self.old_wakeup = signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            self.old_handlers[sig] = signal.signal(sig, _ignore)

    def restore_signals(self) -> None:
        for sig, handler in self.old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal() returned for sig
        signal.set_wakeup_fd(self.old_wakeup)


    def forward_user_signal(self, signum: int) -> None:
        """SIGUSR1/SIGUSR2 to each rank's process (not its process group: its own helpers are not its to signal) that
        handles it: one without a handler (pycoll's dump signal is off unless ``PYCOLL_FR_DUMP_SIGNAL`` is set, and
        not installed before its init) would be killed by it, and the job with it."""
        name = signal.Signals(signum).name
        skipped = []
        for proc in self.live():
            if _catches(proc.popen.pid, signum):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.popen.pid, signum)
            else:
                skipped.append(proc.rank)
        if skipped:
            log.warning("received %s; not forwarded to rank%s %s, which do%s not handle it (it would end them; "
                        "PYCOLL_FR_DUMP_SIGNAL=%s makes it pycoll's flight-recorder dump signal)", name,
                        "s" if len(skipped) > 1 else "", ", ".join(map(str, skipped)), "" if len(skipped) > 1 else "es",
                        name)

    def on_signals(self) -> None:
        try:
            data = self.wake_r.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self.sigchld = True
                continue
            if signum in (signal.SIGUSR1, signal.SIGUSR2):
                self.forward_user_signal(signum)
                continue
            self.signals_seen += 1
            self.bound_output()
            if self.signals_seen == 1 and not self.procs:
                log.warning("received %s before any rank started; exiting", signal.Signals(signum).name)
                self.stop(128 + signum, signum)
            elif self.signals_seen == 1:
                name = signal.Signals(signum).name
                told = not self.stopping and self.cfg.nnodes > 1
                log.warning("received %s; forwarding it to the ranks and stopping the job%s", name,
                            " on every node" if told else "")
                self.stop(128 + signum, signum)
                if told:  # after this node's ranks have the signal: a store that is slow to answer holds up nothing
                    self.tell_nodes(-1, 128 + signum, f"its launcher received {name}")
            else:
                log.warning("received %s again; killing the ranks", signal.Signals(signum).name)
                self.kill_all()

    def wait_events(self, timeout: float) -> List[int]:
        """Wait up to ``timeout`` seconds for the launcher's own events -- signals, its threads' notices -- and
        handle them; returns the other descriptors found ready (the ranks' pipes)."""
        ready = []
        for key, _ in self.sel.select(timeout):
            if key.fileobj is self.wake_r:
                self.on_signals()
            elif key.fileobj is self.notify_r:
                self.on_notify()
            else:
                ready.append(key.fd)
        return ready

    def on_notify(self) -> None:
        try:
            while self.notify_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self.events_lock:
            events, self.events = self.events, []
        for event in events:
            if event == "output-room":
                self.resume_reading()
            elif event.startswith("store-lost "):
                self.on_store_lost(event[len("store-lost "):])
            elif event.startswith("abort "):
                parts = event.split()
                try:
                    node, rank, code = int(parts[1]), int(parts[2]), int(parts[3])
                except (IndexError, ValueError):
                    node, rank, code = -1, -1, 1
                if node == self.cfg.node_rank or self.stopping:
                    continue
                if rank >= 0:
                    log.error("node %d stopped the job (rank %d %s); stopping this node's ranks", node, rank,
                              _describe(code))
                else:
                    log.error("node %d stopped the job (%s; exit code %d); stopping this node's ranks", node,
                              " ".join(parts[4:]) or "no reason given", code)
                _fp.hit(FP_ABORT_RECEIVE)
                self.stop(code)

    def check_server(self) -> None:
        """Node 0: a store server that stopped serving while ranks run fails the job."""
        if self.server is not None and not self.server.serving:
            error = self.server.error
            self.on_store_lost(f"its server stopped{f' ({error!r})' if error is not None else ''}")

    def on_store_lost(self, why: str) -> None:
        if self.stopping or not self.live():
            return
        where = "this launcher's" if self.cfg.node_rank == 0 else "node 0's"
        log.error("lost the job's store (%s store: %s); stopping the job", where, why)
        self.stop(EXIT_STORE_LOST)

    # ---- main loop

    def run(self) -> int:
        cfg = self.cfg
        _check_fd_limit(cfg.nproc)
        for local_rank in range(cfg.nproc):
            rank = cfg.node_rank * cfg.nproc + local_rank
            try:
                self.spawn(rank, local_rank, 0)
            except OSError as exc:  # the ranks already started are stopped and reaped by cleanup()
                raise SystemExit(f"pycoll-run: cannot start rank {rank} of {self.world}: {exc}") from None
        deadline = self.deadline
        drain_deadline: Optional[float] = None
        self.poll_children(force=True)
        while True:
            now = time.monotonic()
            if not self.live():
                if not self.fd_to_stream:
                    break
                if self.paused and not self.output_bounded:
                    drain_deadline = None  # the reader of our output is behind: wait for it, as the ranks did
                elif drain_deadline is None:
                    drain_deadline = now + 2.0
                elif now >= drain_deadline:
                    for fd in list(self.fd_to_stream):
                        self.fd_to_stream[fd][0].finish()
                        self.close_stream(fd)
                    break
            if deadline is not None and now >= deadline and not self.output_bounded:
                if self.live() and not self.stopping:
                    log.error("the job exceeded --timeout %g s; stopping it", cfg.timeout)
                    self.tell_nodes(-1, EXIT_TIMEOUT, f"it exceeded --timeout {cfg.timeout:g} s")
                    self.stop(EXIT_TIMEOUT)
                self.bound_output()
            if self.kill_deadline is not None and now >= self.kill_deadline and self.live():
                log.warning("ranks still running %g s after being asked to stop; killing them", cfg.grace)
                self.kill_all()
                self.kill_deadline = None
            waits = [0.5]
            for t in (deadline if not self.output_bounded else None, self.kill_deadline, drain_deadline):
                if t is not None:
                    waits.append(max(0.0, t - now))
            for fd in self.wait_events(min(waits)):
                if fd in self.fd_to_stream:
                    self.read_stream(fd)
            self.poll_children()
            self.check_server()
            self.check_joined(time.monotonic())
            self.check_heartbeats(time.monotonic())
        return self.result()

    def result(self) -> int:
        if self.stop_code is not None:
            return self.stop_code
        if self.store_call("read whether a group was lost", "check", [KEY_GROUP_LOST]):
            why = self.store_call("read why a group was lost", "get", KEY_GROUP_LOST, 1.0)
            text = why.decode("utf-8", "replace") if why else "a group lost every member"
            if self.failures:
                code, self.counted = self.failures[0][1], self.failure_n[0]
                log.error("the job failed: %s (exit code %d)", text, code)
                return code
            # no rank failed: the members ended on their own (without close()) while a replacement waited
            log.warning("%s, but no rank failed (its members ended without close()): not counted", text)
        if not self.cfg.keep_going:
            self.counted = self.failure_n[0] if self.failures else 0
            return self.failures[0][1] if self.failures else 0
        lost: Dict[int, bool] = {}
        for i, (rank, code, what) in enumerate(self.failures):
            if i in self.replaced_failures:
                continue
            if rank not in lost:
                lost[rank] = bool(self.store_call("read lost ranks", "check", [KEY_LOST.format(rank=rank)]))
            if lost[rank]:
                log.info("rank %d %s and was marked lost: not counted", rank, what)
                continue
            log.error("rank %d %s and was neither replaced nor marked lost", rank, what)
            self.counted = self.failure_n[i]
            return code
        return 0

    # ---- multi-node end

    def finish_nodes(self, code: int) -> int:
        """Node i > 0 says it is done; node 0 keeps the store up until every node that joined is done, and fails
        the job (``code`` 0 becomes ``EXIT_NODE``) when a node never joined within --join-timeout. A job that was
        stopped waits for the other nodes --grace seconds and ``_STOP_MARGIN_S`` more at most. Returns the exit
        code."""
        cfg = self.cfg
        if cfg.nnodes == 1 or self.store is None:
            return code
        if cfg.node_rank != 0:
            self.store_call("report this node done", "set", KEY_DONE.format(node=cfg.node_rank),
                            f"{code} {self.counted}")
            return self.job_result(code)
        pending = set(range(1, cfg.nnodes)) - self.silent
        stop_end: Optional[float] = None
        announced = False
        # the earliest failure of the job (by its number in the job's failures; 0: not known, after any known one)
        first = (self.counted or float("inf"), code) if code else (float("inf"), 0)
        done_nodes = []
        while pending and self.signals_seen < 2:  # a second signal ends the wait
            _fp.hit(FP_NODES_FINISH)
            now = time.monotonic()
            if stop_end is None and self.stopping:  # stopped before the wait or during it (a signal, another node)
                stop_end = now + cfg.grace + _STOP_MARGIN_S
            for node in sorted(pending):
                done_key = KEY_DONE.format(node=node)
                if self.store_call("check nodes", "check", [done_key]):
                    pending.discard(node)
                    done_nodes.append(node)
                    parts = (self.store_call("read a node's exit code", "get", done_key, 1.0) or b"0").split()
                    if parts and parts[0].lstrip(b"-").isdigit() and int(parts[0]):
                        n = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) else float("inf")
                        first = min(first, (n, int(parts[0])))
                    continue
                if node in self.unjoined:
                    if not self.joined(node) and now >= self.join_deadline:
                        pending.discard(node)
                    continue
                silent = self.node_silence(node, now)
                if silent is None:
                    return code
                if silent > _NODE_SILENCE_S:
                    log.warning("node %d sent no heartbeat for %g s; closing the store without it", node,
                                _NODE_SILENCE_S)
                    self.silent.add(node)
                    pending.discard(node)
            if pending and stop_end is not None and now >= stop_end:
                log.warning("node%s %s did not finish within %g s of the job's stop; closing the store without "
                            "%s", "s" if len(pending) > 1 else "", ", ".join(map(str, sorted(pending))),
                            cfg.grace + _STOP_MARGIN_S, "them" if len(pending) > 1 else "it")
                break
            if pending:
                if not announced:
                    log.info("waiting for nodes %s to finish before closing the store", sorted(pending))
                    announced = True
                self.wait_events(0.25)
        # every node's launcher exits with the job's status: the code of its earliest failure, whichever node saw
        # it; else one stopped while this one waited (a signal here, another node's failure)
        code = first[1] or (self.stop_code or 0)
        if self.unjoined and time.monotonic() >= self.join_deadline and not self.missing_reported:
            log.error("the job failed: %s", self.missing_nodes())
            code = code or EXIT_NODE
        if self.silent and not cfg.keep_going:
            code = code or EXIT_NODE  # a node whose launcher went silent: its ranks did not finish
        self.tell_result(code, done_nodes)
        return code

    def tell_result(self, code: int, nodes: List[int]) -> None:
        """Node 0: the job's status for the other nodes' launchers to exit with (:meth:`job_result`), and a short
        wait (``_RESULT_WAIT_S``) for ``nodes`` to have read it before the store closes."""
        if not nodes:
            return
        self.store_call("tell the job's result", "set", KEY_RESULT, str(code))
        end = time.monotonic() + _RESULT_WAIT_S
        keys = [KEY_RESULT_READ.format(node=n) for n in nodes]
        while time.monotonic() < end and self.signals_seen < 2:
            read = self.store_call("check the nodes read the result", "check", keys)
            if read or read is None:  # read, or the store is gone
                return
            self.wait_events(0.02)

    def job_result(self, code: int) -> int:
        """Node i > 0, done: the job's status, which node 0 tells once every node is done (a failure on another node
        is this node's status too); ``code`` where node 0's store is gone, it says nothing within
        ``_NODE_SILENCE_S`` (a node still running), or a second signal ends the wait."""
        end = time.monotonic() + _NODE_SILENCE_S
        announced = False
        with requests_until(end):  # a store that stopped answering (node 0 stopped) holds this no longer
            while self.signals_seen < 2 and time.monotonic() < end:
                there = self.store_call("check for the job's result", "check", [KEY_RESULT])
                if there is None:  # node 0's store is gone
                    return code
                if there:
                    raw = self.store_call("read the job's result", "get", KEY_RESULT, 1.0) or b""
                    self.store_call("say the result was read", "set",
                                    KEY_RESULT_READ.format(node=self.cfg.node_rank), b"1")
                    return int(raw) if raw.strip().lstrip(b"-").isdigit() else code
                if not announced:
                    log.info("waiting for node 0's verdict on the job before exiting")
                    announced = True
                self.wait_events(0.1)
                if self.stop_code:  # node 0 stopped the job meanwhile (a signal there): that status is the job's
                    return self.stop_code
        log.warning("node 0 gave no verdict on the job within %g s: exiting with this node's status", _NODE_SILENCE_S)
        return code

    # ---- teardown

    def cleanup(self) -> None:
        """Leave nothing behind: kill what lives, reap, close the store. Safe to call twice."""
        self.watch_stop.set()
        if self.live():
            self.stop(self.stop_code)
            end = time.monotonic() + self.cfg.grace
            while self.live() and time.monotonic() < end:
                time.sleep(0.02)
                for proc in self.live():
                    if proc.popen.poll() is not None:
                        proc.code = _exit_code(proc.popen.returncode)
        for proc in self.procs:
            _killpg(proc.popen.pid, signal.SIGKILL)
            if proc.code is None:
                proc.popen.wait()
                proc.code = _exit_code(proc.popen.returncode)
        for _ in range(50):
            strays = [p for p in _children_of(os.getpid()) if p not in self.known_pids]
            if not strays:
                break
            self.reap_strays()
            time.sleep(0.01)
        for fd in list(self.fd_to_stream):
            self.fd_to_stream[fd][0].finish()
            self.close_stream(fd)
        if self.store is not None:
            self.store.close()
        if self.watcher is not None:
            self.watcher.join(5.0)
        if self.server is not None:
            self.server.close()
        self.flush_output()
        self.sel.close()
        for s in (self.wake_r, self.wake_w, self.notify_r, self.notify_w):
            s.close()


_MANAGED_VARS = {
    discovery.ENV_RANK, discovery.ENV_WORLD_SIZE, discovery.ENV_LOCAL_RANK, discovery.ENV_LOCAL_WORLD_SIZE,
    discovery.ENV_NODE_RANK, discovery.ENV_NNODES, discovery.ENV_STORE_ADDR, discovery.ENV_STORE_PORT,
    discovery.ENV_STORE_TOKEN, discovery.ENV_RUN_ID, discovery.ENV_REPLACEMENT, discovery.ENV_REPLACES,
}


# an outer torchrun's variables that would mislead torch code in the ranks, removed with every TORCHELASTIC_* one
# (TORCHELASTIC_USE_AGENT_STORE makes its env:// wait for an agent's store that is not there); those pycoll-run
# knows it sets instead (rank_env)
_STALE_VARS = {"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME"}


def _check_fd_limit(nproc: int) -> None:
    """SystemExit with advice when this process cannot hold the file descriptors ``nproc`` ranks need."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return
    if soft == resource.RLIM_INFINITY:
        return
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    need = _FDS_PER_RANK * nproc + _FDS_RESERVED + in_use
    if need > soft:
        raise SystemExit(f"pycoll-run: {nproc} ranks need about {need} file descriptors but this process may open "
                         f"only {soft} (ulimit -n); raise the limit or start fewer ranks")


class _LogHandler(logging.Handler):
    """The launcher's log, queued for its stderr (:class:`_Writer`)."""

    def __init__(self, writer: _Writer) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self.writer.put(text.encode("utf-8", "replace"))


def _ignore(signum: int, frame: object) -> None:
    """Signals are handled through the wakeup fd; the Python-level handler has nothing to do."""


# --------------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pycoll-run",
        description="Start the ranks of a pycoll job on this node, host its store and watch them. "
                    "See `pydoc pycoll.launch.launcher` for exit codes, --keep-going and the environment.",
        usage="%(prog)s [options] (script.py | -m module | --no-python command) [args ...]",
    )
    p.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int, default=1, metavar="N",
                   help="ranks to start on this node (default 1)")
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run the target as an executable, not with the Python interpreter")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (one launcher each; default 1)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this node's index (default 0)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None,
                   help="host of node 0, where the store runs (default: loopback for one node; "
                        "required for several)")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None,
                   help="store port (default: a free port for one node, 29500 for several)")
    p.add_argument("--store-bind", dest="store_bind", default=None,
                   help="address node 0 binds the store to (default: --master-addr)")
    p.add_argument("--keep-going", dest="keep_going", action="store_true",
                   help="a failing rank does not stop the others (see the exit status rules)")
    p.add_argument("--replace-failed", dest="replace_failed", type=int, default=None, metavar="K",
                   help="start up to K replacement processes for failed ranks (implies --keep-going)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the job after this many seconds and exit with 124")
    p.add_argument("--join-timeout", dest="join_timeout", type=float, default=300.0, metavar="SECONDS",
                   help="multi-node: how long a node's launcher waits for node 0's store, and node 0 for every "
                        "node to join; a node missing then fails the job (default 300)")
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
    p.add_argument("--no-prefix", dest="prefix", action="store_false", help="do not prefix output lines")
    p.add_argument("-v", "--verbose", action="store_true", help="log the launcher's decisions")
    # optional to argparse only so that a missing one is said plainly ("required: target, args" named the optional
    # args too)
    p.add_argument("target", nargs="?", help="script, module (-m) or executable (--no-python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    return p


def _config(argv: Optional[Sequence[str]]) -> _Config:
    parser = _parser()
    a = parser.parse_args(argv)
    if a.target is None:
        parser.error("no target given: a script, a module (-m) or an executable (--no-python) to run")
    if a.nproc < 1:
        parser.error(f"-n must be at least 1, got {a.nproc}")
    if a.nproc > MAX_NPROC:
        parser.error(f"-n must be at most {MAX_NPROC} (ranks per launcher), got {a.nproc}")
    if a.nnodes < 1:
        parser.error(f"--nnodes must be at least 1, got {a.nnodes}")
    if not 0 <= a.node_rank < a.nnodes:
        parser.error(f"--node-rank must be in [0, {a.nnodes}), got {a.node_rank}")
    if a.replace_failed is not None and a.replace_failed < 0:
        parser.error(f"--replace-failed must be >= 0, got {a.replace_failed}")
    for opt, value, positive in (("--timeout", a.timeout, True), ("--join-timeout", a.join_timeout, True),
                                 ("--grace", a.grace, False)):
        try:  # pycoll's rule for every duration (README): finite, at most 1e9 s
            if value is not None:
                _settings.seconds(value, opt, positive=positive)
        except ValueError as exc:
            parser.error(str(exc))
    if a.module and a.no_python:
        parser.error("-m and --no-python exclude each other")
    if a.nnodes > 1 and a.master_addr is None:
        parser.error("--master-addr is required when --nnodes > 1")
    master_port = a.master_port if a.master_port is not None else (29500 if a.nnodes > 1 else 0)
    if not 0 <= master_port <= 65535 or (a.nnodes > 1 and master_port == 0):
        parser.error(f"--master-port must be a TCP port, got {master_port}")
    _fp.WARN_UNKNOWN = False  # the ranks' programs may declare names of their own: their processes warn
    try:
        _settings.get("PYCOLL_FAILPOINTS")  # the launcher's own failpoints, and its ranks', read this variable
    except ValueError as e:
        parser.error(str(e))
    if a.module:
        command = [sys.executable, "-u", "-m", a.target, *a.args]
    elif a.no_python:
        exe = a.target if os.sep in a.target else shutil.which(a.target)
        if exe is None or not os.access(exe, os.X_OK):
            parser.error(f"cannot find executable {a.target!r}")
        command = [a.target, *a.args]
    else:
        # as python runs it: a file, or a folder or zip file with a __main__.py
        if not os.path.isfile(a.target) and not os.path.isfile(os.path.join(a.target, "__main__.py")):
            parser.error(f"no such script: {a.target!r}" if not os.path.isdir(a.target) else
                         f"{a.target!r} is a folder without a __main__.py: nothing to run")
        command = [sys.executable, "-u", a.target, *a.args]
    return _Config(
        command=command, nproc=a.nproc, nnodes=a.nnodes, node_rank=a.node_rank,
        master_addr=a.master_addr or "127.0.0.1", master_port=master_port, store_bind=a.store_bind,
        # --replace-failed given, 0 too (a K from a variable), implies --keep-going as --help says
        keep_going=a.keep_going or a.replace_failed is not None, replace_failed=a.replace_failed or 0,
        timeout=a.timeout,
        join_timeout=a.join_timeout, grace=a.grace, prefix=a.prefix, verbose=a.verbose,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``pycoll-run``; returns the exit status. Must run in the main thread."""
    cfg = _config(argv)
    launcher = _Launcher(cfg)
    handler = _LogHandler(launcher.writers[2])  # in order with the ranks' stderr, and never blocking the loop
    handler.setFormatter(logging.Formatter("pycoll-run: %(message)s"))
    root = logging.getLogger("pycoll")
    level, propagate = root.level, root.propagate  # the caller's (pycoll.run.main() from a program), restored
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if cfg.verbose else logging.INFO)
    root.propagate = False  # its lines once, through this handler (a program's root handler printed them again)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    code = 1
    try:
        launcher.install_signals()
        if launcher.open_store():
            launcher.start_watcher()
            code = launcher.run()
            code = launcher.finish_nodes(code)
        else:  # a signal or --timeout stopped node i > 0 while it waited for node 0's store, or before it joined
            code = launcher.stop_code if launcher.stop_code is not None else 1
    except BaseException:
        launcher.bound_output()  # leaving on an error: do not wait long for a reader that does not read
        raise
    finally:
        launcher.cleanup()
        launcher.restore_signals()
        root.removeHandler(handler)
        root.setLevel(level)
        root.propagate = propagate
    return code or (1 if launcher.output_failed else 0)  # output lost to a write error is no success


if __name__ == "__main__":
    sys.exit(main())
