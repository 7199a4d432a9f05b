"""Creating communicators: :func:`init` (a new communicator) and :func:`join` (a new rank of a grow)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import re
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _bindings as B, _settings, failpoints as _fp, hooks
from ._settings import Seconds, requests_until
from .buffers import integer
from .comm import Communicator, _check_timeout, check_arguments, default_timeout, poll_ready, unique_id_argument
from .config import CommConfig
from .devices import Device, auto_backend, cuda_device_count, open_device, rocm_device_count
from .diagnostics import install as _install_diagnostics
from .diagnostics.exits import arm_sigterm
from .errors import (
    CommAborted,
    CommTimeout,
    InProgressError,
    NCCLError,
    NCCLTimeoutError,
    PycollError,
    StoreError,
    StoreTimeout,
)
from .launch import discovery
from .store.torch import store_argument

_log = logging.getLogger("pycoll.create")

__all__ = ["init", "join", "init_all", "from_handle", "get_unique_id", "load_library", "BACKENDS"]

#: Backend names accepted by :func:`init`.
BACKENDS = ("auto", "host", "nccl", "rccl")
_init_counts: Dict[str, int] = {}
_init_lock = threading.Lock()
FP_INIT_GIVEN_UP = _fp.declare("init.given_up.before_publish", "an init through a store ended in this rank (an error, "
                                                               "its timeout, Ctrl-C), before it says so at the store")
#: what replaces the unique id at an init's store key once a rank gave the init up (followed by who and why)
_GIVEN_UP = b"pycoll-init-given-up "
#: what replaces it once the communicator was made (followed by where rank 0 ran)
_MADE = b"pycoll-init-made "
FP_INIT_MADE = _fp.declare("init.made.before_mark", "rank 0's communicator of an init through a store is made, before "
                                                     "it marks the unique id's key as used")


def _default_init_timeout() -> float:
    return float(_settings.get("PYCOLL_INIT_TIMEOUT"))


def load_library(backend: str = "auto", library: Any = None) -> Tuple[str, Any]:
    """Resolve ``(backend, Library)``. ``library`` (a path or a loaded Library) overrides ``backend``; without it
    ``$PYCOLL_NCCL_LIBRARY``, where set, is the library (``"auto"``: of its kind; another backend: ValueError where
    its kind differs), else the backend's own."""
    if library is not None:
        if not isinstance(library, (B.Library, str, os.PathLike)):
            raise TypeError(f"library must be a loaded pycoll Library, a path or a backend name, or None; got "
                            f"{type(library).__name__}")
        lib = library if isinstance(library, B.Library) else B.load(os.fspath(library))
        kind = lib.kind if lib.kind in ("host", "nccl", "rccl") else "nccl"
        return kind, lib
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    chosen = _settings.explicit("PYCOLL_NCCL_LIBRARY")  # a custom libnccl: init() went on to the wheel's, silently
    if backend == "auto":
        backend = _settings.get("PYCOLL_BACKEND") or ("" if chosen else auto_backend())
    if not chosen:
        return backend, B.load(backend)
    lib = B.load()  # the variable's library (its LibraryError names the variable)
    kind = lib.kind if lib.kind in ("host", "nccl", "rccl") else "nccl"
    if backend and kind != backend:
        raise ValueError(f"$PYCOLL_NCCL_LIBRARY={chosen!r} is a {kind} library, but the backend asked for is "
                         f"{backend!r} (init's backend= or $PYCOLL_BACKEND): make them agree, or unset one")
    return kind, lib


def get_unique_id(backend: str = "auto", library: Any = None) -> Any:
    """A fresh ``UniqueId`` from the backend's library, for callers that exchange it themselves."""
    return load_library(backend, library)[1].get_unique_id()


def _on_failure(value: Any) -> str:
    """The failure policy asked for, or ``$PYCOLL_ON_FAILURE``'s (only None means the default: '' is refused)."""
    return str(_settings.get("PYCOLL_ON_FAILURE")) if value is None else value


def _open_device(backend: str, lib: Any, device: Any, local_rank: int) -> Tuple[Device, bool]:
    if isinstance(device, Device):
        device.make_current()  # NCCL builds the communicator on the current device
        return device, False
    if device is not None:
        device = integer(device, "device", "a GPU ordinal >= 0, a pycoll Device or None", 0)
    if backend == "host":
        return open_device("host", library=lib), True
    if device is None:
        count = cuda_device_count() if backend == "nccl" else rocm_device_count()
        device = local_rank % count if count else 0
    dev = open_device(backend, device_id=device)
    dev.make_current()
    return dev, True


def _abort_new(lib: Any, exc: NCCLError) -> None:
    """A failed nonblocking init may leave a live handle in ``exc.comm``: release it."""
    h = getattr(exc, "comm", None)
    if h:
        with contextlib.suppress(NCCLError):
            lib.comm_abort(h)


def _poll_all_new(lib: Any, handles: Sequence[int], what: str) -> None:
    """Wait for the nonblocking inits of one process's communicators (``ncclCommInitAll``'s) within
    ``$PYCOLL_INIT_TIMEOUT``; on a failure, the deadline or Ctrl-C abort them all (the ranks of one communicator: a
    rank left behind would wait for the others for ever)."""
    timeout = _default_init_timeout()
    deadline = time.monotonic() + timeout
    try:
        for h in handles:
            poll_ready(lib, h, what, max(0.0, deadline - time.monotonic()), reported_timeout=timeout)
    except BaseException:
        for h in handles:
            with contextlib.suppress(NCCLError):
                lib.comm_abort(h)
        raise


def _local_rank() -> int:
    """This process's rank on its node from the launcher's environment (0 without one)."""
    try:
        return discovery.discover().local_rank
    except Exception:
        return 0


def _warn_blocking_env() -> None:
    # read as NCCL reads it (atoi: blanks, a sign, the leading digits): '01', '+1' and '1abc' mean blocking too
    m = re.match(r"\s*([+-]?[0-9]+)", os.environ.get("NCCL_COMM_BLOCKING", ""))
    if m and int(m.group(1)) not in (0, 1):  # NCCL applies 0 and 1 only
        _log.warning(f"NCCL_COMM_BLOCKING={os.environ['NCCL_COMM_BLOCKING']!r} is ignored (the library applies 0 "
                     "or 1 only)")
    elif m and int(m.group(1)) == 1:
        _log.warning(f"NCCL_COMM_BLOCKING={os.environ['NCCL_COMM_BLOCKING']!r} makes every NCCL call block: the "
                     "watchdog cannot interrupt a call "
                     "that hangs, and deadlines hold only between calls; unset it (pycoll's communicators are "
                     "nonblocking)")


def _uid_str(unique_id: Any) -> str:
    return hashlib.sha1(bytes(unique_id)).hexdigest()[:16]


def _blocking_new(lib: Any, cfg: Any, call: Callable[[], Tuple[Any, int]], handle_of: Callable[[Any], int], what: str,
                  timeout: float, reported_timeout: float, describe_missing: Callable[[], str] = lambda: "",
                  give_up: Optional[Callable[[float], Optional[BaseException]]] = None) -> Tuple[Any, int]:
    """The library's init (or grow) call ``call()``, returning ``(handle or slot, status)``. A nonblocking one returns
    at once; a blocking one (``CommConfig(blocking=True)``) returns only once every rank came, and has no handle to
    abort before: it runs in a thread of its own, and the wait for it is bounded by ``timeout`` (then
    :class:`pycoll.CommTimeout`), ended by Ctrl-C and by ``give_up`` (as :func:`_poll_new`'s: what it returns is
    raised). The communicator it returns after it was given up is aborted (``handle_of``: its handle), so that its
    peers are told."""
    if not getattr(cfg, "blocking", 0):
        return call()
    out: List[Tuple[Any, int]] = []
    raised: List[BaseException] = []
    done, lock, abandoned = threading.Event(), threading.Lock(), [False]

    def run() -> None:
        try:
            result = call()
        except BaseException as e:  # the caller takes it
            raised.append(e)
        else:
            with lock:
                if abandoned[0]:
                    lib.comm_abort(handle_of(result[0]))  # nobody takes it any more
                else:
                    out.append(result)
        done.set()

    threading.Thread(target=run, name="pycoll-init", daemon=True).start()
    t0 = time.monotonic()
    deadline, why = t0 + timeout, None
    try:
        while not done.is_set() and time.monotonic() < deadline:
            done.wait(min(0.1, max(1e-3, deadline - time.monotonic())))  # Ctrl-C raises between the slices
            why = give_up(time.monotonic() - t0) if give_up is not None and not done.is_set() else None
            if why is not None:
                break
    except BaseException:
        with lock:
            abandoned[0] = True
            if out:  # it completed as the wait was interrupted
                lib.comm_abort(handle_of(out[0][0]))
        raise
    with lock:
        if not out and not raised:  # given up: a result that comes later is aborted (one there now is taken)
            abandoned[0] = True
            if why is not None:
                raise why
            raise CommTimeout(f"{what} did not complete within {reported_timeout:g} s (a blocking communicator, "
                              "CommConfig(blocking=True): the library's init returns only once every rank came)"
                              f"{describe_missing()}", op="init", elapsed=timeout, timeout=reported_timeout)
    if raised:
        raise raised[0]
    return out[0]


def _poll_new(lib: Any, handle: int, what: str, timeout: float,
              describe_missing: Optional[Callable[[], str]] = None, reported_timeout: Optional[float] = None,
              give_up: Optional[Callable[[float], Optional[BaseException]]] = None) -> None:
    """Wait for a new communicator's nonblocking init; abort it on an error, at the deadline, when ``give_up`` says
    so (:func:`pycoll.comm.poll_ready`), when an exception ends the wait (KeyboardInterrupt) or when SIGTERM is about
    to end the process (:func:`hooks.abort_initializing`: the host library then removes the rendezvous segment this
    rank may have created)."""
    once = threading.Lock()

    def abort() -> None:
        if once.acquire(blocking=False):
            lib.comm_abort(handle)

    with hooks.initializing(abort, any_thread=lib.kind == "host"):
        try:
            poll_ready(lib, handle, what, timeout, on_error=abort, on_timeout=abort,
                       describe_missing=describe_missing, reported_timeout=reported_timeout, give_up=give_up)
        except BaseException:
            with contextlib.suppress(NCCLError):
                abort()
            raise


def init(
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    *,
    unique_id: Any = None,
    store: Any = None,
    backend: str = "auto",
    library: Any = None,
    device: Any = None,
    config: Optional[CommConfig] = None,
    timeout: Optional[Seconds] = None,
    init_timeout: Optional[Seconds] = None,
    name: str = "world",
    on_failure: Optional[str] = None,
    generation: int = 0,
    global_ranks: Optional[Sequence[int]] = None,
    failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
    give_up: Optional[Callable[[float], Optional[BaseException]]] = None,
) -> Communicator:
    """Create a communicator of ``world_size`` ranks; this process is ``rank``.

    Args:
        rank, world_size: explicit, or both None to read them from the environment (pycoll-run,
            torchrun, SLURM, Open MPI; see :mod:`pycoll.launch.discovery`), which also provides the store.
        unique_id: the ``UniqueId`` every rank uses (e.g. from :func:`pycoll.get_unique_id`,
            exchanged by the caller). Without it, rank 0 creates one and shares it through
            ``store``.
        store: a pycoll store (or anything with torch's Store methods) for the unique-id exchange. The ranks meet
            at keys named after ``name`` and how many times this process has called ``init`` with that name:
            every rank of a group must have done so equally often, and each group sharing a store needs a name
            of its own. A process that starts again (its count starts again) meets the others under a new name
            (say, with an epoch in it) or with a ``unique_id``. A second rank 0 at the same keys is refused
            (:class:`~pycoll.StoreError`), and it ends the init it met (:class:`~pycoll.CommAborted` there, naming
            the second rank 0): a rank number given twice leaves another one missing, for which the first group
            would wait out its ``init_timeout``. Once the communicator is made, rank 0 marks the keys used (in place
            of the unique id): any rank that comes to them later -- a second group, a job started again -- is refused
            too (:class:`~pycoll.StoreError`), where it joined a second rank 0's group, the groups mixed with no
            error. A rank whose rank 0 does not come is told why. A rank whose init
            ends without the communicator (an error, its timeout, Ctrl-C, SIGTERM) says so at the store: a rank that
            arrives later raises :class:`~pycoll.CommAborted` at once, naming it, instead of waiting out its own
            ``init_timeout`` for ranks that have left (the ranks already waiting are told by the library).
        backend: ``"auto"`` (nccl with CUDA GPUs, rccl with ROCm GPUs, else host; or
            ``$PYCOLL_BACKEND``), ``"host"``, ``"nccl"`` or ``"rccl"``. ``library`` (a path or a
            loaded ``Library``) overrides it.
        device: GPU ordinal (default: local rank modulo the GPUs visible) or a pycoll Device.
        config: a :class:`~pycoll.CommConfig`; the communicator is nonblocking unless it says
            ``blocking=True``.
        timeout: default per-operation timeout in seconds (``$PYCOLL_TIMEOUT``, else 30).
        init_timeout: deadline for initialisation (``$PYCOLL_INIT_TIMEOUT``, else 120): ranks
            that have not arrived by then are named in the :class:`~pycoll.CommTimeout`.
        name: the communicator's name (logs, flight-recorder dumps, store keys).
        on_failure: ``"abort"`` (default, or ``$PYCOLL_ON_FAILURE``), ``"revoke"`` or ``"report"``.
        generation: the membership generation (the elastic layer numbers its communicators; dumps
            are kept per generation).
        global_ranks: every member's job-wide rank in rank order (default ``0..world_size-1``; unknown where a
            launcher's environment says this process is another rank of a job of another size). Groups sharing a
            store and a name meet apart when they give it.
        failure_callbacks: called as ``callback(comm, exc)`` in the thread that records a failure,
            after the observers and before the policy acts; must return quickly. What one raises is logged and the
            policy acts all the same; a ``SystemExit`` or ``KeyboardInterrupt`` goes on once the policy has acted,
            in the main thread only: in the watchdog's threads it is logged and ignored (they go on watching; a
            thread cannot end the process with it: ``os._exit`` can).
        give_up: asked as ``give_up(seconds waited)`` about every 0.1 s while the init waits for the other
            ranks; an exception it returns (a rank the caller knows to be gone, say) ends the init at once: the
            new communicator is aborted and the exception raised. Must return quickly.

    The flight recorder and the watchdog are registered with the first communicator built.
    """
    try:
        init_timeout = _check_timeout(init_timeout, _default_init_timeout(), "init_timeout")
        bad_timeout: Optional[ValueError] = None
    except ValueError as exc:  # raised once the store is known: the others are told (below)
        init_timeout, bad_timeout = 120.0, exc
    deadline = time.monotonic() + init_timeout  # bounds everything init does, store connect included

    def left() -> float:
        return max(1e-3, deadline - time.monotonic())

    local_rank = 0
    job = ""  # the launcher's id of the job, where the environment gives one: its ranks meet under it
    if rank is None and world_size is None:
        info = discovery.discover()
        rank, world_size, local_rank = info.rank, info.world_size, info.local_rank
        job = f"{info.run_id}/" if info.run_id else ""
        if store is None and unique_id is None and world_size > 1:
            store = discovery.job_store(info, connect_timeout=init_timeout)
    elif rank is None or world_size is None:
        raise ValueError("give both rank and world_size, or neither (to read them from the environment)")
    rank, world_size = integer(rank, "rank", "an int"), integer(world_size, "world_size", "an int")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
    _settings.text(name, "name")
    if store is not None:
        store = store_argument(store)
    uid = meeting = base = None
    noted: Optional[contextlib.AbstractContextManager[None]] = None
    owns = False
    # the store's requests too (a server that stopped answering held each for its client's timeout, 300 s); past the
    # deadline, each of the give-up notes after a failure still gets its second
    bound = requests_until(deadline)
    bound.__enter__()
    try:
        # from here on a rank that gives up says so at the store (below): the others end at once, not at their
        # init_timeout -- a bad setting or argument, a library or GPU this rank lacks, as much as a failed exchange
        # (its init's count is taken then: a retry meets the others' retries, the meeting given up being over)
        with _init_lock:
            count = _init_counts[name] = _init_counts.get(name, 0) + 1
        # two jobs whose stores meet (one port and token: a second job's ranks reach the first job's store where its
        # own rank 0 could not host it) do not meet under one key: they mixed ranks, a silent wrong sum
        base = f"pycoll/init/{job}{name}/{count}"
        meeting = store is not None and unique_id is None and world_size > 1  # the unique id comes through the store
        if global_ranks is not None:  # groups of one name meet apart (their counts of that name are equal)
            with contextlib.suppress(TypeError, ValueError):  # not ranks: check_arguments says what is wrong
                base += "/" + _members_key(global_ranks)
        if bad_timeout is not None:
            raise bad_timeout
        _settings.check_all()  # a bad PYCOLL_* value is named now, not when it is first read (on a failure, say)
        _install_diagnostics(rank, global_ranks)
        _warn_blocking_env()
        op_timeout = _check_timeout(timeout, default_timeout())
        on_failure = _on_failure(on_failure)
        # what the communicator keeps, refused before the collective init (a rank refusing it after left a made
        # communicator behind, and its peers one whose member never came)
        check_arguments(world_size, global_ranks, on_failure, generation, failure_callbacks)
        if config is not None and not isinstance(config, CommConfig):
            raise TypeError(f"config must be a pycoll.CommConfig, not {type(config).__name__}")
        if give_up is not None and not callable(give_up):
            raise TypeError(f"give_up must be a callable, got {give_up!r}")
        # from here on a SIGTERM dumps and aborts the init under way (its segment removed); not before the store is
        # open: torch's connect blocks the main thread in C, where a Python handler cannot run
        arm_sigterm()
        if meeting:  # a SIGTERM that ends the process says at the store that this rank gave the init up
            noted = hooks.init_note(lambda: _give_up_init(_own_client(store), base, uid, rank, CommAborted(
                "its process was ended by SIGTERM")))
            noted.__enter__()
        backend, lib = load_library(backend, library)
        dev, owns = _open_device(backend, lib, device, local_rank)
        uid = _exchange_unique_id(lib, unique_id, store, rank, world_size, base, left(), name, count)
        cfg = (config or CommConfig()).to_nccl(lib, blocking_default=False)
        if store is not None:
            store.set(f"{base}/arrived/{rank}", b"1")
        def missing() -> str:
            if store is None:
                return ""
            absent = [r for r in range(world_size) if not store.check([f"{base}/arrived/{r}"])]
            gone = _given_up(store, base) if meeting else ""
            return ((f"; ranks that never arrived: {absent}" if absent
                     else "; every rank arrived at the store and called the library's init")
                    + (f"; {gone}" if gone else ""))

        what = f"init of communicator {name!r} ({world_size} ranks)"
        watching = _watching_given_up(store, base, name, give_up) if meeting else give_up
        try:
            try:
                handle, status = _blocking_new(lib, cfg, lambda: lib.comm_init_rank_config(world_size, uid, rank, cfg),
                                               int, what, left(), init_timeout, missing, watching)
            except NCCLError as exc:
                _abort_new(lib, exc)
                raise
            if status == B.IN_PROGRESS:
                _poll_new(lib, handle, what, left(), missing, reported_timeout=init_timeout, give_up=watching)
        except NCCLTimeoutError as exc:  # the library's own deadline (the host library's PYCOLL_HOST_INIT_TIMEOUT)
            own = float(_settings.get("PYCOLL_HOST_INIT_TIMEOUT")) if lib.kind == "host" else init_timeout
            # (its text names the ranks missing at the store, as the init's own deadline does)
            raise CommTimeout(f"{what} did not complete: the library gave it up at its own deadline -- "
                              f"{exc.last_error}", op="init", elapsed=init_timeout - left(), timeout=own) from exc
        if store is not None:
            _forget_init_keys(store, base, rank, uid if meeting else None)
    except BaseException as exc:
        if meeting:  # no communicator here (aborted, or never made): the init cannot complete
            _give_up_init(store, base, uid, rank, exc)  # type: ignore[arg-type]
        if owns:
            dev.close()
        raise
    finally:
        if noted is not None:
            noted.__exit__(None, None, None)
        bound.__exit__()
    return _watched(Communicator(
        handle, library=lib, device=dev, rank=rank, size=world_size, name=name, uid=_uid_str(uid),
        global_ranks=_default_global_ranks(rank, world_size) if global_ranks is None else global_ranks,
        timeout=op_timeout, on_failure=on_failure, store=store, owns_device=owns, generation=generation,
        failure_callbacks=failure_callbacks,
    ))


def _own_client(store: Any) -> Any:
    """A client of ``store`` of its own, for the note SIGTERM's handler has another thread write: the handler may
    have interrupted this process's init inside a call of ``store``, holding its client's lock (a TCPStore's), which
    the note then waited for until the process ended without it. A pickled copy is one (a TCPStore's: a new
    connection, a lock of its own); ``store`` itself where it cannot be copied."""
    try:
        return pickle.loads(pickle.dumps(store))
    except Exception:
        return store


def _watched(comm: Communicator) -> Communicator:
    """``comm``, where its watchdog runs as it should: where the watchdog's threads could not start (no file
    descriptor or thread left), ``comm`` is aborted and this raises, naming why -- a rank without its watchdog turns
    no hang into an error and finds no stopped or dead peer before its timeout (init returned, a log line said so)."""
    from .diagnostics.watchdog import get_watchdog

    wd = get_watchdog()
    err = wd.start_error
    if wd.enabled and err is not None and not wd.running:
        comm.abort()
        raise PycollError(
            f"communicator {comm.name!r}: the watchdog could not start its threads ({type(err).__name__}: {err}): "
            "without it no hang becomes an error and no stopped or dead peer is found before the timeout, so the "
            "communicator was aborted; raise the limit (open files: ulimit -n; threads: the pids limit), or set "
            "PYCOLL_WATCHDOG=0 to run without the watchdog") from err
    return comm


def _members_key(global_ranks: Sequence[int]) -> str:
    """The part of an init's store keys that names its members: two groups that share a store and a name (each
    process counting its own inits of that name) would otherwise meet at one key, each rank joining whichever
    group's unique id it read first -- a communicator of the wrong ranks, with no error."""
    text = ",".join(str(int(r)) for r in global_ranks)
    return "members-" + hashlib.sha1(text.encode()).hexdigest()[:16]


def _default_global_ranks(rank: int, world_size: int) -> Optional[range]:
    """The default ``global_ranks``: ``0..world_size-1``, unless the launcher's environment says this process is
    another rank of a job of another size (a group made with explicit ranks): its members' job ranks are then
    unknown (None), and dumps and messages name this process by the launcher's rank, not by its rank here."""
    info = _launched()
    if info is not None and (info.world_size, info.rank) != (world_size, rank):
        return None
    return range(world_size)


def _launched() -> Any:
    """The launcher's view of this process (``discovery.RankInfo``), or None without a launcher's environment (or
    with a partial one: init reports that where it reads it)."""
    try:
        info = discovery.discover()
    except Exception:
        return None
    return info if info.source != "single" else None


def _exchange_unique_id(lib: Any, unique_id: Any, store: Any, rank: int, world_size: int, base: str,
                        timeout: float, name: str, count: int) -> Any:
    if unique_id is not None:
        return unique_id_argument(unique_id)
    if world_size == 1:
        return lib.get_unique_id()
    if store is None:
        launched = _launched() is not None
        raise ValueError("init needs a unique_id or a store to exchange one (or a launcher's environment"
                         + ("; there is one: call pycoll.init() without rank and world_size to use it, or pass its "
                            "store" if launched else "") + ")")
    key = f"{base}/unique_id"
    meets = ("(each process counts its own init calls per name: a group sharing the store under the same name, or "
             "a process that started again, meets at the same keys; give each group its own name= -- with an epoch "
             "in it for a process that restarts -- or pass unique_id=)")
    if rank == 0:
        uid = lib.get_unique_id()
        mine = bytes(uid)
        # only where nobody published yet: two rank 0s at one key would split their ranks between two ids, each
        # rank joining whichever it read (the weights of one group going to the other), with no error
        there = bytes(store.compare_set(key, b"", mine))
        if there != mine:
            over = _meeting_over(there, name, count, rank, meets)
            if over is not None:  # given up (a rank waited in vain and left), or a communicator made there already
                raise over
            err = StoreError(f"init of {name!r} (this process's init #{count} with that name): another rank 0 "
                             f"already published its unique id at {key!r} of the store {meets}")
            # the init met there cannot complete either (two rank 0s: a rank number given twice): its ranks, waiting
            # for one that never comes, are told now, not at their init_timeout
            _give_up_init(store, base, there, rank, err,
                          who=f"a second rank 0 (pid {os.getpid()} on {socket.gethostname()}) came, was refused and "
                              "ended it: a rank number given twice leaves another missing")
            raise err
        return uid
    try:
        value = bytes(store.get(key, timeout=timeout))
        over = _meeting_over(value, name, count, rank, meets)
        if over is not None:
            raise over
        return B.UniqueId.from_bytes(value)
    except StoreTimeout as e:
        if "did not answer" in str(e):  # the store itself, not rank 0
            err = StoreTimeout(f"init of {name!r} (this process's init #{count} with that name): waiting for rank 0's "
                               f"unique id: {e}")
        else:
            err = StoreTimeout(f"init of {name!r} (this process's init #{count} with that name): rank 0 published "
                               f"no unique id at {key!r} within {timeout:.3g} s: it has not reached its init #{count} "
                               f"with this name, or is not running {meets}")
        _give_up_init(store, base, b"", rank, err)  # in place of the unique id: rank 0, arriving later, fails at once
        raise err from e


def _give_up_init(store: Any, base: str, uid: Any, rank: int, exc: BaseException, who: str = "") -> None:
    """This rank's init ended without the communicator (aborted): put that in place of the unique id ``uid`` (None:
    not exchanged yet -- whatever rank 0 published, or nothing), so that a rank arriving later fails at once
    (:func:`_exchange_unique_id`) and the ranks waiting in the library look there (:func:`_watching_given_up`),
    instead of waiting for ranks that have left. The first rank to give up is the one named (the others' errors
    follow from its). ``who``: what the ranks are told of it, where "rank N gave the init up" is not it. Best effort:
    the store may be what failed."""
    _fp.hit(FP_INIT_GIVEN_UP)
    what = (f"{who or f'rank {rank} gave the init up'} "
            f"({type(exc).__name__}{': ' + str(exc)[:1000] if str(exc) else ''})")
    key, marker = f"{base}/unique_id", _GIVEN_UP + what.encode()
    try:
        there = bytes(store.compare_set(key, b"" if uid is None else bytes(uid), marker))
        if uid is None and there not in (b"", marker) and not _given_up_text(there) and not _made_text(there):
            store.compare_set(key, there, marker)  # rank 0's unique id, published before (not the mark of a made one)
    except Exception as e:
        _log.debug("init: could not tell the store that it was given up: %s", e)


def _watching_given_up(store: Any, base: str, name: str, give_up: Optional[Callable[[float], Optional[BaseException]]]
                        ) -> Callable[[float], Optional[BaseException]]:
    """``give_up`` (the caller's, or None) that also, about once a second, looks at the store for a rank that gave
    this init up (:func:`_give_up_init`): the ranks already waiting end then, as the library tells them of a rank
    that aborted, also where the one that gave up never joined (a second rank 0, say)."""
    next_look = [0.0]

    def check(waited: float) -> Optional[BaseException]:
        if give_up is not None:
            exc = give_up(waited)
            if exc is not None:
                return exc
        if waited < next_look[0]:
            return None
        next_look[0] = waited + 1.0
        gone = _given_up(store, base, timeout=0.2)  # not in the way of the poll for long
        return CommAborted(f"init of {name!r}: {gone}; the init cannot complete") if gone else None

    return check


def _meeting_over(value: bytes, name: str, count: int, rank: int, meets: str) -> Optional[PycollError]:
    """The error of a rank that finds ``value`` at its init's unique id key where the meeting there is over, else
    None: another rank gave the init up (a note of this rank's own number is an earlier attempt's, a job that started
    again at the store under the same name), or a communicator was made there already."""
    what = f"init of {name!r} (this process's init #{count} with that name)"
    gone = _given_up_text(value)
    if gone:
        earlier = (" -- a rank of this number: an earlier attempt's note, the job started again at this store"
                   if gone.startswith(f"rank {rank} ") else "")
        return CommAborted(f"{what}: {gone} before this rank (rank {rank}) arrived{earlier}; nothing is waiting for it "
                           f"any more {meets}")
    made = _made_text(value)
    if made:
        return StoreError(f"{what}: {made}, so this rank (rank {rank}) comes after its group: a rank number given "
                          f"twice, or a second group or a job started again under this name at this store {meets}")
    return None


def _marked(value: bytes, mark: bytes) -> str:
    """The text after ``mark`` in ``value`` (an init's unique id key), or "" where it holds no such mark."""
    return value[len(mark):].decode(errors="replace") if value.startswith(mark) else ""


def _made_text(value: bytes) -> str:
    """Where the communicator of an init was made, from the value at its unique id's key, or ""."""
    return _marked(value, _MADE)


def _given_up_text(value: bytes) -> str:
    """Who gave an init up and why, from the value at its unique id's key (see :func:`_give_up_init`), or ""."""
    return _marked(value, _GIVEN_UP)


def _given_up(store: Any, base: str, timeout: float = 1.0) -> str:
    """Who gave the init at ``base`` up and why, or "" (its key gone, or a store that does not answer: "")."""
    try:
        return _given_up_text(bytes(store.get(f"{base}/unique_id", timeout=timeout)))
    except Exception:
        return ""


def _forget_init_keys(store: Any, base: str, rank: int, published: Any) -> None:
    """The communicator is up, so every rank has read the unique id and arrived: the arrivals go (the store would
    otherwise keep size keys per communicator made; also where the unique id was given, as the elastic layer's inits
    give it). ``published``: the unique id rank 0 put in the store (None: none), which rank 0 replaces with a mark
    that it was used (a few bytes): a rank that comes to these keys later -- a rank number given twice, a second
    group or a job started again under the same name -- is refused (:func:`_exchange_unique_id`), where it met a
    second rank 0's fresh unique id and joined it, the groups mixed with no error. Best effort: the store may be
    going."""
    try:
        store.delete(f"{base}/arrived/{rank}")
        if published is not None and rank == 0:
            _fp.hit(FP_INIT_MADE)
            store.compare_set(f"{base}/unique_id", bytes(published), _MADE + (
                f"a communicator was made at these keys (its rank 0: pid {os.getpid()} on {socket.gethostname()})"
            ).encode())
    except Exception as e:  # a store error here is not the communicator's
        _log.debug("init: could not mark the keys under %r used: %s", base, e)


def join(
    size: int,
    rank: int,
    unique_id: Any,
    *,
    backend: str = "auto",
    library: Any = None,
    device: Any = None,
    config: Optional[CommConfig] = None,
    timeout: Optional[Seconds] = None,
    init_timeout: Optional[Seconds] = None,
    name: str = "world",
    store: Any = None,
    global_ranks: Any = None,
    on_failure: Optional[str] = None,
    generation: int = 0,
    failure_callbacks: Sequence[Callable[[Communicator, BaseException], None]] = (),
    give_up: Optional[Callable[[float], Optional[BaseException]]] = None,
) -> Communicator:
    """Join a communicator that existing ranks are growing to ``size`` (``ncclCommGrow``, NCCL 2.29).

    ``rank`` is this new process's rank (>= the old size); ``unique_id`` the id the existing
    coordinator obtained with :meth:`Communicator.get_unique_id`. The other arguments are those
    of :func:`init` (``give_up`` too: a member known gone ends the join at once, not at ``init_timeout``).
    """
    _settings.check_all()
    _install_diagnostics(rank, global_ranks)
    op_timeout = _check_timeout(timeout, default_timeout())
    init_timeout = _check_timeout(init_timeout, _default_init_timeout(), "init_timeout")
    size = integer(size, "join: size", "an int >= 2", 2)
    rank = integer(rank, "join: rank", f"an int in [1, {size})")
    if not 0 < rank < size:
        raise ValueError(f"join: rank must be in [1, {size}), got {rank!r}")
    if give_up is not None and not callable(give_up):
        raise TypeError(f"give_up must be a callable, got {give_up!r}")
    uid = unique_id_argument(unique_id, "join: unique_id")
    arm_sigterm()  # a SIGTERM from here on dumps and aborts the join (see init)
    backend, lib = load_library(backend, library)
    dev, owns = _open_device(backend, lib, device, _local_rank())
    try:
        cfg = (config or CommConfig()).to_nccl(lib, blocking_default=False)
        what = f"join of communicator {name!r} as rank {rank}/{size}"
        try:
            slot, status = _blocking_new(lib, cfg, lambda: lib.comm_grow(0, size, uid, rank, cfg),
                                         lambda s: s.value, what, init_timeout, init_timeout, give_up=give_up)
        except NCCLError as exc:
            _abort_new(lib, exc)
            raise
        handle = slot.value
        if status == B.IN_PROGRESS:
            _poll_new(lib, handle, what, init_timeout, give_up=give_up)
    except BaseException:
        if owns:
            dev.close()
        raise
    return _watched(Communicator(
        handle, library=lib, device=dev, rank=rank, size=size, name=name, uid=_uid_str(uid),
        global_ranks=global_ranks, timeout=op_timeout,
        on_failure=_on_failure(on_failure), store=store, owns_device=owns,
        generation=generation, failure_callbacks=failure_callbacks,
    ))


def from_handle(handle: Any, **kwargs: Any) -> Communicator:
    """:meth:`Communicator.from_handle` with the flight recorder and the watchdog registered (as
    :func:`init` does); the same arguments."""
    _install_diagnostics()
    return Communicator.from_handle(handle, **kwargs)


def init_all(devices: Any, *, backend: str = "auto", library: Any = None, timeout: Optional[Seconds] = None,
             on_failure: Optional[str] = None) -> List[Communicator]:
    """One process driving several devices: ``ncclCommInitAll`` over ``devices`` (an int ``n`` for
    devices ``0..n-1``, or a sequence of GPU ordinals; on the host backend the numbers only label
    the ranks). Returns one :class:`Communicator` per device, rank ``i`` on ``devices[i]``, all owned.

    Their operations must be issued from one thread inside :meth:`Communicator.group` (or from one
    thread per communicator), as with NCCL: a blocking collective on one of them waits for the others.
    They are blocking communicators, as NCCL makes them: ``destroy()`` finalizes, which waits for every rank's,
    so end them with :func:`abort_all`, or destroy each from a thread of its own (:meth:`Communicator.hand_off`);
    one thread destroying them in turn gets a :class:`pycoll.CommTimeout` at the first one's timeout.
    ``NCCL_COMM_BLOCKING=0`` makes them nonblocking (NCCL's init then returns them still initialising): they
    are waited for here, within ``$PYCOLL_INIT_TIMEOUT``, and all aborted if one fails.
    """
    if isinstance(devices, bool):
        raise TypeError("devices must be an int or a sequence of device ordinals, not bool")
    if isinstance(devices, int):
        if not 1 <= devices < 1 << 31:  # NCCL's int; the host library refuses what it cannot hold
            raise ValueError(f"devices must be >= 1 and below 2**31, got {devices}")
        devlist = list(range(devices))
    else:
        devlist = list(devices)
        if not devlist:
            raise ValueError("devices must name at least one device")
        for d in devlist:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ValueError(f"devices must be ordinals >= 0, got {d!r}")
    _settings.check_all()  # as init: before the communicators exist
    _, lib = load_library(backend, library)
    _install_diagnostics()
    try:
        handles = lib.comm_init_all(len(devlist), devlist)
    except InProgressError as exc:  # NCCL_COMM_BLOCKING=0: every handle is valid, still initialising
        handles = list(getattr(exc, "comms", None) or ())
        _poll_all_new(lib, handles, f"ncclCommInitAll of {len(handles)} ranks")
    comms: list = []
    try:
        for h in handles:
            comms.append(Communicator.from_handle(
                h, owned=True, library=lib, timeout=_check_timeout(timeout, default_timeout()),
                on_failure=_on_failure(on_failure)))
    except BaseException:
        for c in comms:
            c.abort()
        for h in handles[len(comms):]:
            with contextlib.suppress(NCCLError):
                lib.comm_abort(h)
        raise
    return comms
