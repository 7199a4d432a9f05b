"""Elastic membership: lose a rank, agree, shrink and go on -- no restart; grow back later.

:class:`ElasticGroup` owns the job's current :class:`~pycoll.Communicator` and replaces it when the
membership changes. Members are identified by their *slot* (the launcher's rank: ``PYCOLL_RANK``);
a replacement process started for a dead slot keeps the slot number. The rank of a member in the
current communicator is its index in :attr:`ElasticGroup.members`.

A loop looks like this::

    group = pycoll.ElasticGroup.from_env()          # under pycoll-run --keep-going
    step, sync = 0, group.joined                    # a replacement first receives the state
    while step < steps or sync:
        try:
            if sync:                                # rank 0's model and step (after a reshape too)
                step, sync = send_state(group.comm, params, step), False
                continue
            grads = compute(...)
            group.comm.all_reduce(grads)
            prev = params.copy(); update(params, grads)
            group.commit(step)                      # this member completed the step
            step += 1
            if group.maybe_grow():                  # a step boundary: admit replacements
                send_state(group.comm, params, step)
        except pycoll.CommFailure:
            mine = group.last_committed
            group.reshape()                         # survivors agree on the members and on the last step
            agreed = -1 if group.last_committed is None else group.last_committed
            if mine is not None and mine > agreed:  # its collective completed where another's failed
                params = prev
            step, sync = agreed + 1, True           # the step is redone on the new communicator

**Reshape.** A member that sees a communicator failure calls :meth:`ElasticGroup.reshape`. It raises
the generation's reshape flag in the store; every member's watcher thread sees it, vouches that its
process is alive and revokes its communicator, so members stuck in a collective or busy computing
join promptly (their operations raise :class:`~pycoll.CommRevoked`, the failure their dumps record: the
analyzer names no rank that never entered an operation only because of it while another explains the failure).
Members that neither vouch nor are provably gone (a same-host process that exited or
is stopped) are waited for up to ``window`` seconds. The first live member collects the votes
(:mod:`pycoll.membership`), proposes the survivors and writes the decision with an atomic
compare-and-set, which every member adopts (another member takes over if it is gone), so all
survivors end with the same member list and generation (a live member left out raises
:class:`Excluded`). A member may also ask for a reshape with nothing failed (:meth:`ElasticGroup.reshape`
outside a failure): the others' communicators are then revoked without a failure (their operations raise
:class:`~pycoll.CommRevoked`), nothing is reported or dumped, and the transition's kind is ``"requested"``.
Then ``ncclCommShrink(NCCL_SHRINK_ABORT)`` builds the new communicator where the
library has it (else a fresh init with a new unique id); the parent is released with abort. A
failure during the reshape starts another round with a fresh init.

**One outcome per step.** A collective can complete on some members and fail on others (a member that dies
right after the data moved; a communicator error read after the operation ended). :meth:`ElasticGroup.commit`
records each step a member completed, and the reshape's agreement includes the last step every survivor
completed (:attr:`ElasticGroup.last_committed`): a member one step ahead takes that step back, and every
survivor goes on from the same step. A loop that only redoes its failed step can leave the members a step
apart, mixing two steps' gradients and, at the end, calling different collectives.

**Grow.** A new process (``pycoll-run --replace-failed``, or any process constructed with
``joiner=True``) asks to join and waits. At each :meth:`maybe_grow` call -- a step boundary every
member reaches -- rank 0 admits the waiting joiners; existing members call ``ncclCommGrow`` (else a
fresh init) and joiners :func:`pycoll.join`; the joiner learns its rank and the generation.

Every change is recorded as a :class:`Transition` (detection, agreement, revoke, shrink/init, and
for a grow or join the first successful collective), logged and kept in :attr:`ElasticGroup.transitions`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from . import _bindings as B, _settings, failpoints as _fp, membership as _mb, nodeagg as _node
from ._procs import boot_id, exiting, stat_fields
from ._settings import Seconds
from .buffers import integer as _integer
from .comm import Communicator, default_timeout
from .config import CommConfig
from .create import init, join, load_library
from .diagnostics import get_recorder, get_watchdog
from .errors import (
    CommFailure,
    CommRevoked,
    CommStateError,
    InvalidUsage,
    NCCLError,
    StoreError,
    StoreLost,
    StoreTimeout,
)
from .launch import discovery
from .launch.keys import launched_processes, mark_group_lost, mark_lost, mark_not_needed, unmark_lost
from .store.torch import store_argument

__all__ = ["ElasticGroup", "Excluded", "Transition"]

_log = logging.getLogger("pycoll.elastic")

# failpoints (pycoll.failpoints): every store interaction and state transition of the protocol
FP_FORM_BEFORE_INIT = _fp.declare("elastic.form.before_init", "forming: before the first communicator")
FP_FORM_AFTER_INIT = _fp.declare("elastic.form.after_init", "forming: the first communicator is up")
FP_FORM_MARK_LOST = _fp.declare("elastic.form.mark_lost", "formed without some slots: rank 0, before it marks them "
                                                          "lost")
FP_UID_BEFORE_PUBLISH = _fp.declare("elastic.uid.before_publish", "a new rank 0, before it writes the unique id")
FP_WATCHER_WAKE = _fp.declare("elastic.watcher.wake", "the watcher saw another member's reshape flag")
FP_WATCHER_AFTER_REVOKE = _fp.declare("elastic.watcher.after_revoke", "the watcher revoked, before vouching")
FP_ANNOUNCE_BEFORE_FLAG = _fp.declare("elastic.announce.before_flag", "vouched, before raising the reshape flag")
FP_AGREE_BEFORE_VOTE = _fp.declare("elastic.agree.before_vote", "the agreement, before this member vouches")
FP_AGREE_WAIT, FP_AGREE_BEFORE_DECISION, FP_AGREE_AFTER_DECISION = (  # the protocol's own, in membership
    _mb.FP_AGREE_WAIT, _mb.FP_AGREE_BEFORE_DECISION, _mb.FP_AGREE_AFTER_DECISION)
FP_REVOKE_BEFORE = _fp.declare("elastic.revoke.before", "before revoking the parent communicator")
FP_SHRINK_BEFORE = _fp.declare("elastic.shrink.before", "before the shrink (or the fresh init)")
FP_SHRINK_AFTER = _fp.declare("elastic.shrink.after", "the new communicator is built")
FP_RESHAPE_DONE = _fp.declare("elastic.reshape.done", "the reshape is over, before it returns")
FP_COMMIT = _fp.declare("elastic.commit", "a member commits a step")
FP_GROW_BEFORE_DECISION = _fp.declare("elastic.grow.before_decision", "maybe_grow(), before rank 0's decision")
FP_GROW_AFTER_DECISION = _fp.declare("elastic.grow.after_decision", "maybe_grow(), joiners are waiting")
FP_GROW_ADMIT = _fp.declare("elastic.grow.admit", "rank 0, before it admits the joiners")
FP_GROW_BEFORE_COMM = _fp.declare("elastic.grow.before_comm", "before ncclCommGrow (or the fresh init)")
FP_GROW_AFTER_COMM = _fp.declare("elastic.grow.after_comm", "the grown communicator is built")
FP_GROW_FAILED = _fp.declare("elastic.grow.failed", "the grow failed (a member or a joiner gone), before it is "
                                                    "recorded")
FP_GROW_FIRST_COLLECTIVE = _fp.declare("elastic.grow.first_collective", "before the grown group's first collective")
FP_JOIN_REQUEST = _fp.declare("elastic.join.request", "a joiner, before it asks to join")
FP_JOIN_ADMITTED = _fp.declare("elastic.join.admitted", "a joiner was admitted, before it joins")
FP_JOIN_AFTER_COMM = _fp.declare("elastic.join.after_comm", "a joiner's communicator is built")
FP_JOIN_NOBODY_LEFT = _fp.declare("elastic.join.nobody_left", "a joiner found every member gone, before it marks "
                                                              "them and the group lost")
FP_CLOSE_GONE = _fp.declare("elastic.close.gone", "close(): the destroy failed and members are gone, before "
                                                  "they are marked lost")

#: the smallest membership that agrees through per-host hubs by default (``node_hub=None``): a hub
#: saves the store two requests per local member and costs a hop and a thread in a member process
NODE_HUB_MIN_MEMBERS = 16


#: the end of a reshape flag's value (the slot that raised it) when that member asked for it, nothing having failed
_REQUESTED = " requested"
_KEYS_KEPT = 4  # the generations whose store keys stay (_forget_generations)


def _flag_slot(flag: bytes) -> Optional[int]:
    """The slot that raised a reshape flag (after a failure, or asking for a reshape); None: unreadable."""
    text = bytes(flag).decode("utf-8", "replace")
    try:
        return int(text[:-len(_REQUESTED)] if text.endswith(_REQUESTED) else text)
    except ValueError:
        return None


def _requester(flag: bytes) -> Optional[int]:
    """The slot that asked for a reshape with nothing failed, from its reshape flag; None: a failure's flag."""
    return _flag_slot(flag) if bytes(flag).endswith(_REQUESTED.encode()) else None


class Excluded(CommFailure):
    """This process was left out of the new membership (it was too slow to vouch for itself).

    The job goes on without it; it may exit, or start again as a joiner.
    """


@dataclass
class Transition:
    """One membership change and how long each phase took.

    Times are wall-clock seconds (``time.time()``); ``phases_ms()`` gives the durations.
    """

    kind: str  # "shrink", "reinit", "requested" (nothing failed, the same members), "grow" or "grow-reinit"
    generation: int  # the new generation
    members_before: Tuple[int, ...]
    members_after: Tuple[int, ...]
    cause: str = ""
    detected: float = 0.0  # when this member saw the failure (or the grow began)
    agreement_started: float = 0.0
    agreed: float = 0.0
    revoked: float = 0.0
    comm_ready: float = 0.0
    first_collective: float = 0.0  # a grow's or join's barrier on the new communicator (0: none, a reshape)
    attempts: int = 1
    committed: Optional[int] = None  # the last step every member completed (see ElasticGroup.commit)

    def phases_ms(self) -> Dict[str, float]:
        """Durations in milliseconds: detection->agreement start, agreement, revoke, shrink/init,
        first collective (grow and join only: a reshape runs none), and total (detection to the
        first successful collective, or to the new communicator after a reshape)."""
        def ms(a: float, b: float) -> float:
            return round((b - a) * 1e3, 3) if a and b else 0.0

        out = {
            "to_agreement": ms(self.detected, self.agreement_started),
            "agreement": ms(self.agreement_started, self.agreed),
            "revoke": ms(self.agreed, self.revoked),
            "comm": ms(self.revoked or self.agreed, self.comm_ready),
        }
        if self.first_collective:
            out["first_collective"] = ms(self.comm_ready, self.first_collective)
        out["total"] = ms(self.detected, self.first_collective or self.comm_ready)
        return out

    def describe(self) -> str:
        """One line for logs and the demo."""
        p = self.phases_ms()
        return (
            f"generation {self.generation} ({self.kind}): members {list(self.members_before)} -> "
            f"{list(self.members_after)}; agreement {p['agreement']:.1f} ms, revoke {p['revoke']:.1f} ms, "
            f"{'shrink' if self.kind == 'shrink' else 'grow' if self.kind == 'grow' else 'init'} {p['comm']:.1f} ms, "
            + (f"first collective {p['first_collective']:.1f} ms, " if self.first_collective else "")
            + f"total {p['total']:.1f} ms"
            + (f" after {self.attempts} attempts" if self.attempts > 1 else "")
            + (f" (cause: {self.cause})" if self.cause else "")
        )


def _local_process_gone(pid: int) -> bool:
    """True when a process of this host has exited (also as an unreaped zombie), is exiting, or is stopped."""
    fields = stat_fields(pid)
    return not fields or fields[0] in ("Z", "X", "T", "t") or exiting(fields)


class ElasticGroup:
    """A communicator whose membership changes when processes fail or join.

    Args:
        store: the job's store (every member and joiner uses the same one).
        slot: this process's slot (the launcher's rank); unique among live processes.
        world_size: the initial number of members (slots ``0..world_size-1``). Not needed for a joiner.
        joiner: this process joins a running group (a replacement) instead of forming it.
        backend, library, device, config, timeout: as for :func:`pycoll.init` (``device``: a GPU ordinal
            or a :class:`pycoll.devices.Device`, e.g. ``pycoll.emulated.device()``). Communicators of the group
            are revoked (not aborted) on failure, so that they can be shrunk.
        window: how long (seconds) the survivors wait for members that neither vouch for themselves
            nor are provably gone (a process on another host, or a slow one). Same-host processes
            that exited or are stopped are known at once.
        join_timeout: how long a joiner waits to be admitted.
        name: namespace of the group in the store.
        on_change: called as ``on_change(group, transition)`` after every membership change, on
            every member (joiners included), before the call that made the change returns.
        node_hub: members on one host (same boot id) agree through one of them, the lowest local slot
            (:mod:`pycoll.nodeagg`): it alone waits in the store for the reshape flag and sends the
            host's votes in one request. None (the default): in memberships of at least
            ``NODE_HUB_MIN_MEMBERS`` (16) members, where it saves the store more requests than its
            extra hop costs (4 members on one host: the agreement 6.2-6.7 ms through a hub, 4.3-4.4 ms
            without); True: in every membership; False: never, every member talks to the store itself.

    Use :meth:`from_env` under ``pycoll-run``.
    """

    def __init__(
        self,
        store: Any,
        slot: int,
        world_size: Optional[int] = None,
        *,
        joiner: bool = False,
        backend: str = "auto",
        library: Any = None,
        device: Any = None,
        config: Optional[CommConfig] = None,
        timeout: Optional[Seconds] = None,
        window: Seconds = 1.0,
        join_timeout: Seconds = 120.0,
        name: str = "elastic",
        on_change: Optional[Callable[[ElasticGroup, Transition], None]] = None,
        node_hub: Optional[bool] = None,
    ) -> None:
        slot = _integer(slot, "slot", "an int >= 0", 0)
        joiner = _settings.flag(joiner, "joiner")
        if world_size is not None:
            world_size = _integer(world_size, "world_size", "an int > 0", 1)
        if not joiner and world_size is None:
            raise ValueError(f"slot {slot}: world_size is needed to form the group (only a joiner, joiner=True, "
                             f"goes without it)")
        if not joiner and not 0 <= slot < world_size:  # type: ignore[operator]
            raise ValueError(f"slot {slot} must be below world_size {world_size} when forming the group")
        if on_change is not None and not callable(on_change):
            raise TypeError(f"on_change must be None or callable as on_change(group, transition), "
                            f"got {type(on_change).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
        if not name:
            raise ValueError("name must be a non-empty str (the group's namespace in the store)")
        node_hub = None if node_hub is None else _settings.flag(node_hub, "node_hub")
        self.store = store_argument(store)
        self.slot = slot
        self.name = name
        self.window = _settings.seconds(window, "window")
        self.join_timeout = _settings.seconds(join_timeout, "join_timeout")
        self.timeout = default_timeout() if timeout is None else _settings.seconds(timeout, "timeout")
        self.config = config
        self.on_change = on_change
        self.backend, self.library = load_library(backend, library)
        self.device = device
        self._ns = f"pycoll/elastic/{name}"
        self.transitions: List[Transition] = []
        self.generation = 0
        self.members: Tuple[int, ...] = ()
        self.comm: Communicator
        self.joined = joiner
        self._grow_calls = 0
        self._closed = False
        # slots that left the group (a reshape without them) and were not admitted again: rank 0 marks them lost for
        # the launcher after every reshape, so that one a rank 0 that died before it could mark is marked all the same
        self._lost: set[int] = set()
        self._stop = threading.Event()
        self._gave_up = False  # the last reshape raised: hold no dumps
        self._reshaping = False
        self._announced = -1  # the last generation whose reshape this member announced
        # (generation, members) of a grow that failed here: the others may have built it (see _reshape)
        self._failed_grow: Optional[Tuple[int, Tuple[int, ...]]] = None
        self._announce_q: queue.SimpleQueue[Optional[Tuple[int, Optional[Sequence[int]], bool]]] = queue.SimpleQueue()
        # (generation, slot) of the last reshape another member requested with nothing failed (its flag says so)
        self._requested: Tuple[int, int] = (-1, -1)
        self._forgotten = 0  # the generations below this one had their store keys deleted (_forget_generations)
        self._vouched: Tuple[int, int] = (-1, -1)  # the last (generation, attempt) this member vouched for
        # what that vote learnt: ((generation, attempt), whether it was the first vote, the members it
        # decided for and the decision, when it was the vote that completed the set)
        self._vote: Optional[Tuple[Tuple[int, int], bool, Tuple[int, ...], Optional[bytes]]] = None
        self._vote_lock = threading.Lock()  # one vote at a time (the caller's, the announcer's, the watcher's)
        self._moved = threading.Event()  # set when the generation changes (wakes the watcher)
        self._proc_cache: Dict[int, Tuple[str, int]] = {}  # slot -> (boot id, pid), read by the watcher
        self._release_at = 0  # dumps wait until the new communicator has issued this many operations
        self._watcher: Optional[threading.Thread] = None
        self._boot = boot_id()
        self._node = None if node_hub is False else _node.NodeAggregation(  # the wrapped store: a torch one is not
            self.store, self._ns, slot, self._boot, self._slot_gone,  # one (its get takes no timeout, no append_get)
            min_members=1 if node_hub else NODE_HUB_MIN_MEMBERS)
        self._link: Optional[_node.NodeLink] = None  # to this host's hub (the watcher keeps it per generation)
        self._link_of: Tuple[int, Optional[_node.NodeLink]] = (-1, None)  # (generation, _link), set together
        self._hub_voted = (-1, -1)  # the last (generation, attempt) whose vote went to a hub only
        self._committed: Optional[int] = None  # the last step this member completed (commit())
        self._joiners_seen = False  # rank 0's watcher saw join requests (read by maybe_grow)
        # a joiner: the members it found gone, the last time it looked (a stopped one must be seen twice)
        self._gone_members: Tuple[Tuple[int, ...], bool] = ((), False)
        self.store.set(f"{self._ns}/proc/{slot}", f"{self._boot} {os.getpid()}")
        if joiner:
            self._join()
        else:
            self._form(cast(int, world_size))  # checked above: a forming member has one
        # failure dumps wait until the reshape is over: writing them would slow the recovery down
        self._dump_gate = get_watchdog().add_dump_gate(self._dumps_may_run)
        self._start_watcher()

    @classmethod
    def from_env(cls, **kwargs: Any) -> ElasticGroup:
        """Build the group from the launcher's environment (:mod:`pycoll.launch.discovery`).

        A replacement process (``PYCOLL_REPLACEMENT`` >= 1) joins; the others form the group.
        """
        info = discovery.discover()
        store = kwargs.pop("store", None) or discovery.job_store(info)
        return cls(store, info.rank, info.world_size, joiner=info.is_replacement, **kwargs)

    # -- properties -----------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the current communicator."""
        return self.members.index(self.slot)

    @property
    def size(self) -> int:
        """The number of members now (the current communicator's size)."""
        return len(self.members)

    def __repr__(self) -> str:
        return (f"<ElasticGroup {self.name!r} slot {self.slot} generation {self.generation} "
                f"members {list(self.members)}>")

    # -- forming and joining ----------------------------------------------------------------------

    def _new_comm(self, rank: int, members: Sequence[int], key: str, generation: int,
                  gone: Optional[Callable[[int], bool]] = None) -> Communicator:
        """A fresh communicator of ``members`` (unique id from the new rank 0 through the store). ``gone``: the
        liveness rule of the members (default: their registered processes)."""
        if rank == 0:
            uid = self.library.get_unique_id()
            _fp.hit(FP_UID_BEFORE_PUBLISH)
            self.store.set(key, bytes(uid))
        else:
            uid = self._wait_key(key, members[0], f"the unique id of generation {generation}", gone)
        comm = init(rank, len(members), unique_id=uid, init_timeout=self.timeout,
                    give_up=self._gone_give_up(members, f"init of generation {generation}", gone),
                    **self._comm_options(members, generation))
        return self._adopt(comm, members, generation)

    def _gone_give_up(self, members: Sequence[int], what: str,
                      gone: Optional[Callable[[int], bool]] = None) -> Callable[[float], Optional[BaseException]]:
        """For a fresh init of ``members``: the :func:`pycoll.init` ``give_up`` that ends it as soon as another
        member is known gone (a same-host process that exited or is stopped), instead of at its timeout -- a
        member that vouched and then died is still in the agreement's members."""
        others = [m for m in members if m != self.slot]
        if gone is None:
            gone = self._gone_test(others)

        def give_up(waited: float) -> Optional[BaseException]:
            for m in others:
                if gone(m):
                    return CommFailure(f"slot {m} is gone during the {what} of group {self.name!r} (given up after "
                                       f"{waited:.2f} s)")
            return None

        return give_up

    def _comm_options(self, members: Sequence[int], generation: int) -> Dict[str, Any]:
        """What every communicator of the group is built with (revoked on failure, so it can be shrunk)."""
        return {"library": self.library, "device": self.device, "config": self.config, "timeout": self.timeout,
                "name": self.name,
                "on_failure": "revoke", "store": self.store, "generation": generation,
                "global_ranks": tuple(members), "failure_callbacks": [self._on_comm_failure]}

    def _adopt(self, comm: Communicator, members: Sequence[int], generation: int) -> Communicator:
        # the processes of the members that stay are known already; a slot that leaves is forgotten (a
        # new process may take it and join: the watcher reads that one from the store)
        stay = set(self.members).intersection(members)
        self._proc_cache = {m: v for m, v in self._proc_cache.items() if m in stay}
        self._lost = (self._lost | set(self.members)) - set(members)
        old: Optional[Communicator] = getattr(self, "comm", None)
        if old is not None and old is not comm:
            old.superseded(f"communicator {old.name!r} of generation {old.generation} of elastic group "
                           f"{self.name!r} was replaced by generation {generation}: use group.comm, not a reference "
                           "kept from before the reshape")
            new = {id(comm)} | {id(c) for c in comm.descendants(closed=True)}  # made from it (a shrink, a grow)
            for made in old.descendants(closed=True):  # split from it: remade from group.comm (README)
                if id(made) in new:
                    continue
                made.superseded(f"communicator {made.name!r} was made from generation {old.generation} of elastic "
                                f"group {self.name!r}, which generation {generation} replaced: make it again from "
                                "group.comm")
        self.comm, self.members, self.generation = comm, tuple(members), generation
        self._grow_calls = 0
        self._moved.set()
        return comm

    def _form(self, world_size: int) -> None:
        """The first communicator; a member that dies meanwhile is left out (the others agree without it)."""
        members = tuple(range(world_size))
        gone = self._forming_gone(members)
        attempt = 0
        while True:
            key = f"{self._ns}/g0/uid" if attempt == 0 else f"{self._ns}/form/a{attempt}/uid"
            try:
                _fp.hit(FP_FORM_BEFORE_INIT)
                self._new_comm(members.index(self.slot), members, key, 0, gone)
                break
            except InvalidUsage:
                raise  # this process cannot meet the others (its PYCOLL_HOST_SHM_TAG, ...): no attempt would
            except (CommFailure, NCCLError, StoreError) as exc:
                _log.warning("slot %d: forming group %r (attempt %d) failed: %s", self.slot, self.name, attempt, exc)
            # a member that failed on its own (a raise) is out of init at once, the others only at
            # their init timeout: wait that long for their vouchers
            members, _ = self._agree_at(f"{self._ns}/form/a{attempt}/", members, None,
                                        window=self.timeout + self.window, gone=gone)
            if self.slot not in members:
                raise Excluded(f"slot {self.slot} was left out while group {self.name!r} formed "
                               f"(members {list(members)})")
            attempt += 1
        # the slots left out are lost, as after a reshape without them: rank 0 tells the launcher (which kills such
        # a slot's process if it is stopped, and may replace it), and every member keeps them for a later rank 0
        self._lost = set(range(world_size)) - set(members)
        if self._lost and self.rank == 0:
            _fp.hit(FP_FORM_MARK_LOST)
            for m in sorted(self._lost):
                try:
                    mark_lost(self.store, m, f"left out when group {self.name!r} formed")
                except (StoreError, AttributeError):
                    pass
        _fp.hit(FP_FORM_AFTER_INIT)

    def _forming_gone(self, members: Sequence[int]) -> Callable[[int], bool]:
        """While the group forms: whether a slot's first process is gone (exited, exiting or stopped; this host
        only). Its registration tells which process that is; so does, from its start, pycoll-run's record of the
        process it started for the slot (:func:`pycoll.launch.keys.launched_processes`): a process stopped or killed
        before it registered is then known at once, not at the init's timeout and the agreement's window. What is
        not known yet is looked up again at most every 0.25 s."""
        others = [m for m in members if m != self.slot]
        procs: Dict[int, Tuple[str, int]] = {}
        launched: Dict[int, Tuple[str, int, int]] = {}
        next_look = 0.0

        def look() -> None:
            nonlocal next_look, procs, launched
            next_look = time.monotonic() + 0.25
            try:
                if not procs and self.store.check([f"{self._ns}/proc/{m}" for m in others]):
                    procs = self._procs(others)  # every one registered: one read, kept (a replacement that
                    # registers later for a slot whose first process died does not hide that death)
                if not launched:
                    launched = launched_processes(self.store, others)
            except (StoreError, AttributeError, ValueError):
                pass

        def gone(m: int) -> bool:
            if m == self.slot:
                return False
            if (not procs or not launched) and time.monotonic() >= next_look:
                look()
            proc = procs.get(m)
            if proc is not None and proc[0] == self._boot and _local_process_gone(proc[1]):
                return True
            first = launched.get(m)
            # k > 0: the launcher replaced the slot's first process, which therefore ended
            return first is not None and (first[2] > 0 or (first[0] == self._boot and _local_process_gone(first[1])))

        return gone

    # -- liveness of the other members ------------------------------------------------------------

    def _slot_gone(self, slot: int) -> bool:
        """True when ``slot``'s process is known to have exited or stopped (same host only)."""
        proc = self._proc_cache.get(slot)
        if proc is None:
            try:
                raw = self.store.get(f"{self._ns}/proc/{slot}", timeout=0.01)
            except StoreError:
                return False
            boot, pid = raw.decode().split()
            proc = (boot, int(pid))
        return proc[0] == self._boot and _local_process_gone(proc[1])

    def _wait_key(self, key: str, writer: int, what: str, gone: Optional[Callable[[int], bool]] = None) -> bytes:
        """The value of ``key``, which only slot ``writer`` writes. CommFailure (a member failure) as
        soon as that process is gone (``gone``; default: its registered process), or when the key has not come
        within the timeout."""
        return _mb.wait_key(self.store, key, writer, f"{what} of group {self.name!r}", gone or self._slot_gone,
                            self.timeout)

    def _guard(self, slots: Sequence[int], comm: Communicator, what: str) -> threading.Event:
        """Watch ``slots`` while this thread is inside ``comm``'s grow: a process found gone fails ``comm``, and
        the grow gives up within 0.1 s (:meth:`Communicator.grow` ends when its communicator fails meanwhile: a
        joiner is no peer of ``comm``, which the watchdog's liveness could find gone). Set the event returned
        to stop."""
        done = threading.Event()
        procs = self._procs(slots)

        def watch() -> None:
            while not done.wait(0.01):
                for m, (boot, pid) in procs.items():
                    if boot == self._boot and _local_process_gone(pid):
                        # vouch and raise the flag first: failing the communicator may take a while
                        # (its failure report), and the others' agreement window is running
                        self._announce(comm.generation, comm.global_ranks)
                        try:
                            comm.fail(CommFailure(f"slot {m} is gone during the {what} of group {self.name!r}"))
                        except Exception:  # already failed or closed: the rendezvous ends either way
                            pass
                        return

        threading.Thread(target=watch, name=f"pycoll-elastic-guard-{self.name}", daemon=True).start()
        return done

    def _join(self) -> None:
        """Ask to join and wait to be admitted; a grow that fails (a member or another joiner died)
        is retried with a new request until ``join_timeout``."""
        t0 = time.time()
        deadline = time.monotonic() + self.join_timeout
        while True:
            try:
                self._join_once(t0, deadline)
                return
            except (CommFailure, NCCLError) as exc:
                # InvalidUsage: this process cannot meet the members (another PYCOLL_HOST_SHM_TAG, planning settings
                # of its own): asking again only held the members' grow for its timeout each time
                if isinstance(exc, (Excluded, InvalidUsage)) or time.monotonic() >= deadline:
                    raise
                _log.warning("slot %d: joining group %r failed (%s); asking again", self.slot, self.name, exc)

    def _nobody_to_admit(self) -> Optional[str]:
        """Why no member of the group is left to admit this joiner, when every process that took a slot of it (but
        this one and the joiners: a slot whose join request is pending, or whose joiner gave up, has no member) ran
        on this host and is gone -- exited, or stopped on two looks in a row; else None (one lives, runs on another
        host, or the group has not begun to form)."""
        prefix = f"{self._ns}/proc/"
        try:
            joiners = set(_mb.pending_joiners(self.store, self._ns, ()))
            slots = sorted(int(k[len(prefix):]) for k in self.store.list_keys(prefix) if k[len(prefix):].isdigit())
            others = [m for m in slots if m != self.slot and m not in joiners]
            procs = self._procs(others) if others else {}
            # no member at all: gone (their slots' processes are joiners now), or not started yet
            if not others and not (self.store.check([f"{self._ns}/g0/uid"])
                                   or self.store.check([f"{self._ns}/form/a0/votes"])):
                return None
        except (StoreError, ValueError):
            return None
        if len(procs) < len(others) or any(
                boot != self._boot or not _local_process_gone(pid) for boot, pid in procs.values()):
            self._gone_members = ((), False)
            return None
        # a stopped member counts as gone once seen stopped twice (about 0.5 s apart), as the watchdog's liveness
        # and pycoll-run's hung ranks have it: a short pause must not end the group
        stopped = any(not exiting(f) and f[0] in ("T", "t")
                      for f in (stat_fields(pid) for _, pid in procs.values()) if f)
        seen, was_stopped = self._gone_members
        self._gone_members = (tuple(others), stopped)
        if stopped and not (seen == tuple(others) and was_stopped):
            return None
        if not others:
            return (f"every member of group {self.name!r} is gone (the other slots' processes are joiners that were "
                    f"not admitted): nobody is left to admit slot {self.slot}")
        which = f"slot{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        return (f"every member of group {self.name!r} is gone (the process{'es' if len(others) > 1 else ''} of "
                f"{which} exited or stopped): nobody is left to admit slot {self.slot}")

    def _group_gone(self, why: str) -> None:
        """This joiner found every member gone: mark their slots lost (pycoll-run kills a stopped one, as the
        others would have had they been left to reshape without it) and the group lost (pycoll-run exits non-zero:
        the job failed, however its replacements end)."""
        _fp.hit(FP_JOIN_NOBODY_LEFT)
        try:
            for m in self._gone_members[0]:
                mark_lost(self.store, m, f"gone with every other member of group {self.name!r}")
            mark_group_lost(self.store, why)
        except (StoreError, AttributeError) as exc:
            _log.warning("slot %d: could not mark group %r lost: %s", self.slot, self.name, exc)

    def _join_once(self, t0: float, deadline: float) -> None:
        _fp.hit(FP_JOIN_REQUEST)
        admitted = _mb.request_join(self.store, self._ns, self.slot)
        try:
            raw = _mb.await_admission(self.store, self._ns, self.slot, admitted, deadline, self.join_timeout,
                                      self._nobody_to_admit)
        except StoreTimeout as exc:
            raise StoreTimeout(f"{exc} (group {self.name!r})") from None
        except LookupError as exc:
            self._group_gone(str(exc))
            raise Excluded(str(exc)) from None
        if not raw:
            why = f"group {self.name!r} finished before slot {self.slot} was admitted"
            try:
                mark_not_needed(self.store, self.slot, why)  # the launcher starts no other replacement for it
            except (StoreError, AttributeError):
                pass
            raise Excluded(why)
        generation, rank, members, kind, committed = _mb.parse_admission(raw)
        _fp.hit(FP_JOIN_ADMITTED)
        uid = self.store.get(f"{self._ns}/g{generation}/uid", timeout=self.timeout)
        tr = Transition("grow" if kind == "grow" else "grow-reinit", generation, (), members, "joined",
                        detected=t0, agreement_started=t0, agreed=time.time(), committed=committed)
        tr.revoked = tr.agreed
        options = self._comm_options(members, generation)
        # a member gone meanwhile (one that died before the grow it was admitted to) ends the wait at once, as the
        # members' own: it waited out the timeout, and the job's end with it
        give_up = self._gone_give_up(members, "join")
        if kind == "grow":
            comm = join(len(members), rank, uid, init_timeout=self.timeout, give_up=give_up, **options)
        else:
            comm = init(rank, len(members), unique_id=uid, init_timeout=self.timeout, give_up=give_up, **options)
        self._adopt(comm, members, generation)
        self._committed = None if committed is None or committed < 0 else committed
        tr.comm_ready = time.time()
        _fp.hit(FP_JOIN_AFTER_COMM)
        try:
            comm.barrier()
        except BaseException:
            comm.abort()
            raise
        tr.first_collective = time.time()
        self._record(tr)

    def _record(self, tr: Transition) -> None:
        self.transitions.append(tr)
        # the flight recorder's dumps carry it: pycoll-fr --trace draws the phases
        get_recorder().add_transition({**asdict(tr), "slot": self.slot, "group": self.name,
                                       "phases_ms": tr.phases_ms()})
        _log.info("slot %d: %s", self.slot, tr.describe())
        if self.on_change is not None:
            self.on_change(self, tr)

    # -- watcher ----------------------------------------------------------------------------------

    def _start_watcher(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name=f"pycoll-elastic-{self.name}", daemon=True)
        self._watcher.start()
        threading.Thread(target=self._announcer, name=f"pycoll-elastic-announce-{self.name}", daemon=True).start()

    def _announcer(self) -> None:
        while True:
            item = self._announce_q.get()
            if item is None:
                return
            self._vouch_and_flag(*item)

    def _watch(self) -> None:
        """Vouch for this process and revoke the communicator when a reshape starts elsewhere."""
        seen = fetched = -1
        while not self._stop.is_set():
            g = self.generation
            if fetched != g:  # the members' processes, known before any reshape needs them
                try:
                    if not all(m in self._proc_cache for m in self.members):
                        self._proc_cache = self._procs(self.members)
                    fetched = g
                    self._link, self._link_of = None, (g, None)
                    self._forget_generations(g)
                except Exception:
                    if self._stop.is_set():
                        return
            if self._node is not None and (self._link is None or self._link.broken) and fetched == g:
                self._link = self._node.link(self.members, self._proc_cache)
                self._link_of = (g, self._link)
            if g == seen:  # this generation's reshape is under way here: wait for its end, not in the store
                self._moved.wait(0.5)
                self._moved.clear()
                continue
            key = f"{self._ns}/g{g}/reshape"
            try:
                if self.members and self.members[0] == self.slot:  # rank 0 decides the grows
                    self._joiners_seen = bool(self.pending_joiners())
                # a generation that changes (a grow, a reshape) is seen at the end of this wait: short for a group
                # without node hubs (a few members: a few requests a second each), where a member waiting in a
                # communicator split from the new generation's would otherwise wait that long to be revoked (its
                # vouch late too: a reshape window shorter than the wait left it out)
                wait = (0.05 if self._node is not None and self._node.pending else 0.5 if self._node is not None
                        else 0.1)
                flag = _node.watch_key(self._link, self.store, key, wait)
                if flag is None:
                    continue
            except StoreTimeout:
                continue  # look again, the generation may have changed
            except StoreError:  # a store hiccup, or a store gone (it then fails at once): no spinning
                self._stop.wait(0.1)
                continue
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            if g != self.generation:
                continue
            seen = g
            _fp.hit(FP_WATCHER_WAKE)
            # revoke first, then vouch: the step this member vouches with is then at most one behind
            # what it completes (see commit())
            comm = self.comm
            requester = _requester(flag)
            quiet = requester is not None and comm.failure is None
            if comm.state == "active" and comm.generation == g:
                if requester is not None and quiet:
                    # asked for with nothing failed: no failure here either (nothing reported, no dump). The
                    # requester revokes its communicator once every member voted, i.e. saw this flag: what this
                    # member then finds failed (an operation meeting that revoke) revokes this one quietly
                    self._requested = (g, requester)
                    comm.expect_revoke()
                else:
                    try:  # a CommRevoked: the recovery stops it, this member's own part did not fail
                        by = _flag_slot(flag)
                        why = ("" if by is None else f" (slot {by} asked for it)" if requester is not None
                               else f" (slot {by} raised its flag, having met a failure)")
                        comm.fail(CommRevoked(f"generation {g} of {self.name!r} is being reshaped by another member"
                                              + why))
                    except Exception:  # revoke unsupported: the policy aborts instead
                        _log.exception("revoking generation %d", g)
            if comm.generation == g:
                self._revoke_descendants(comm, g, "expect" if quiet else "fail")
            _fp.hit(FP_WATCHER_AFTER_REVOKE)
            self._vouch(g, 0, comm.global_ranks if comm.generation == g else None)

    def _forget_generations(self, g: int) -> None:
        """The first member deletes the store keys of the generations before ``g - _KEYS_KEPT`` (their reshape flag,
        votes, decision, unique ids), which nobody reads any more: a job that reshaped a thousand times kept them all
        (4 keys a requested reshape, ~10 a failure). The last ones stay for a member that has not moved on yet (one
        still reading generation g - 1's unique id at g - 2's keys while the first member is at g)."""
        if not self.members or self.members[0] != self.slot:
            return
        for old in range(self._forgotten, g - _KEYS_KEPT):
            for key in self.store.list_keys(f"{self._ns}/g{old}/"):
                self.store.delete(key)
            self._forgotten = old + 1

    def _revoke_descendants(self, comm: Communicator, g: int, how: str = "fail") -> None:
        """The communicators the program made from generation ``g``'s (``group.comm.split()``: tensor- and
        data-parallel groups): an operation of theirs may wait for a member that is in the reshape now, or gone;
        they fail too (revoked, as the group's), so that whoever waits in one comes to the reshape, instead of
        waiting out its timeout (and the group's reshape with it). A requested reshape (nothing failed) records no
        failure, as for the group's own: ``how="expect"``, before this member votes, makes what their operations
        meet revoke them quietly; ``"quiet"`` (the requester once every member voted, the others in their reshape)
        revokes them so."""
        for child in comm.descendants():
            if child.state == "active" and child.failure is None:
                if how != "fail":
                    child.expect_revoke()
                    if how == "quiet":
                        self._quiet_revoke(child)
                    continue
                try:
                    child.fail(CommRevoked(f"generation {g} of {self.name!r} is being reshaped: communicator "
                                           f"{child.name!r} was made from its communicator"))
                except Exception:  # revoke unsupported: the policy aborts instead
                    _log.exception("revoking %r, made from generation %d", child.name, g)

    # -- reshape ----------------------------------------------------------------------------------

    def _agree(self, g: int, attempt: int, members: Tuple[int, ...]) -> Tuple[Tuple[int, ...], Optional[int]]:
        """Decide the survivors of ``members`` for (generation g, attempt) and the last step they all
        completed; every caller gets the same answer."""
        _fp.hit(FP_AGREE_BEFORE_VOTE)
        self._vouch(g, attempt, members)
        vote = self._vote
        if vote is not None and vote[0] == (g, attempt) and vote[2] == members and vote[3] is not None:
            decision = _mb.parse_decision(vote[3], members)  # this member's vote completed the set and decided
            _fp.hit(_mb.FP_AGREE_AFTER_DECISION, rank=self.slot)
            return decision
        # after a failed attempt, a member that failed on its own (a raise in shrink or init) comes at
        # once, the others only at their timeout: wait that long for their vouchers
        return self._agree_at(f"{self._ns}/g{g}/a{attempt}/", members, g,
                              window=None if attempt == 0 else self.timeout + self.window)

    def _agree_at(self, base: str, members: Tuple[int, ...], g: Optional[int], window: Optional[float] = None,
                  gone: Optional[Callable[[int], bool]] = None) -> Tuple[Tuple[int, ...], Optional[int]]:
        """The agreement under the keys ``base`` (:func:`pycoll.membership.agree`): vote, then the first
        live member waits for the votes (``window`` seconds at most; default: the group's window) and
        decides while the others wait for the decision -- two store round trips per member when every
        member is either alive or provably gone."""
        if g is None:
            _fp.hit(FP_AGREE_BEFORE_VOTE)
            _mb.vouch(self.store, base, self.slot, self._step())
        link = self._hub_link(g) if g is not None and window is None else None  # attempt 0: through this host's hub
        return _node.agree(link, self.store, base, self.slot, members, self._step(), gone or self._gone_test(members),
                           window=self.window if window is None else window, timeout=self.timeout,
                           hub_voted=g is not None and window is None and self._hub_voted == (g, 0))

    def _gone_test(self, members: Sequence[int]) -> Callable[[int], bool]:
        """Whether a member is provably gone: a process of this host that exited, is exiting or is stopped."""
        procs = self._proc_cache
        if not all(m in procs for m in members):
            procs = self._procs(members)

        def gone(m: int) -> bool:
            return m in procs and procs[m][0] == self._boot and _local_process_gone(procs[m][1])

        return gone

    def _hub_link(self, g: int) -> Optional[_node.NodeLink]:
        """The link to the hub of generation ``g``'s members (None: the store). The watcher renews it
        after every membership change; until then it serves if it leads to the same hub (a grow)."""
        gen, link = self._link_of
        if gen == g or link is None or self._node is None or g != self.generation:
            return link if gen == g else None
        return link if self._node.address(self.members, self._proc_cache) == link.address else None

    def _procs(self, members: Sequence[int]) -> Dict[int, Tuple[str, int]]:
        """(boot id, pid) of each member's process, as it registered in the store (one round trip)."""
        keys = [f"{self._ns}/proc/{m}" for m in members]
        out: Dict[int, Tuple[str, int]] = {}
        try:
            values = self.store.multi_get(keys, timeout=min(self.timeout, 1.0))
        except StoreError:  # a member that never registered: it can only vouch for itself
            return out
        for m, raw in zip(members, values, strict=False):
            boot, pid = raw.decode().split()
            out[m] = (boot, int(pid))
        return out

    def commit(self, step: int) -> None:
        """Record that this member completed ``step`` (its collectives succeeded and its update is applied).

        Costs nothing (no communication). At the next :meth:`reshape` the survivors agree on the
        least step they all committed (:attr:`last_committed`), so that every survivor goes on from
        the same state -- one outcome per step even when a collective completed on some members and
        failed on others. A member is never more than one step ahead of that agreement.
        """
        step = _integer(step, "commit: step", "an int >= 0", 0)
        _fp.hit(FP_COMMIT)
        self._committed = step

    @property
    def last_committed(self) -> Optional[int]:
        """The last committed step: this member's own, or after a :meth:`reshape` (or a join) the last
        step that every member completed; None when no step was committed."""
        return self._committed

    def _dumps_may_run(self) -> bool:
        """The dump gate: False from a failure until the rebuilt communicator has completed the caller's
        first operation after :meth:`reshape` (the end of the recovery)."""
        if self._stop.is_set() or self._gave_up:
            return True
        comm = self.comm
        if self._reshaping or comm.failure is not None:
            return False
        return comm.ops_issued >= self._release_at and not comm.outstanding()

    def reshape(self) -> Communicator:
        """Agree with the other survivors on the new membership and build its communicator.

        Call it from the thread that uses the communicator after a :class:`~pycoll.CommFailure`; called with
        nothing failed it asks for a new communicator of the same members (the others' operations raise
        :class:`~pycoll.CommRevoked`, which their loops handle as any failure; no failure is reported).
        Returns the new communicator (also :attr:`comm`). Raises :class:`Excluded` when this
        process was left out, and :class:`~pycoll.StoreLost` (a :class:`~pycoll.StoreError`, no
        :class:`~pycoll.CommFailure`: nothing can be agreed) when the store cannot be reached any more.

        When the loop calls :meth:`commit` at every step, the survivors also agree on the last step
        that every one of them completed, :attr:`last_committed` afterwards (None: none yet). A member
        that had completed one step more (its collective succeeded where another member's failed)
        must restore its state from before that step; every survivor resumes at
        ``last_committed + 1``.

        The failure's report and flight-recorder dumps wait until the new communicator has
        completed the caller's next operation (at most ``PYCOLL_FR_DUMP_HOLD`` seconds), so that
        they do not slow the recovery down; ``pycoll.diagnostics.get_watchdog().wait_for_dumps()``
        writes them at once.
        """
        if self._closed:
            raise CommStateError(f"group {self.name!r} (slot {self.slot}) was closed: reshape() needs an open group")
        self._reshaping, self._gave_up = True, False
        try:
            comm = self._reshape()
            self._release_at = comm.ops_issued + 1
            return comm
        except BaseException as exc:
            self._gave_up = True
            if isinstance(exc, StoreError):
                self._raise_if_store_lost(exc, "reshape")
            raise
        finally:
            self._reshaping = False
            get_watchdog().release_dumps()

    def _reshape(self) -> Communicator:
        old = self.comm
        g = self.generation
        detected = getattr(old, "failed_at", None) or time.time()
        # asked for with nothing failed (here, or by the member whose flag revoked this one): no failure, nothing
        # reported and no dump anywhere. The others' watchers see the flag, expect a revoke (Communicator.
        # expect_revoke) and vote; this member's communicator is revoked once every member voted, and what the
        # others' operations then meet revokes theirs (quietly)
        # what failed in a communicator made from the group's (not revoked by a reshape): a failure of the group's as
        # much as its own -- the others fail theirs and their descendants at the flag, and whoever waits in one for a
        # member that does not come (busy, then left out) comes to the reshape at once, not at its timeout
        seen = [c for c in old.descendants(closed=True)  # of its generation: split, not grown or shrunk from it
                if c.generation == g and c.failure is not None and not isinstance(c.failure, CommRevoked)]
        requested = old.failure is None and not seen and (old.state == "active" or self._requested[0] == g)
        # also where the watcher saw the flag after this member had moved on; this member's own request revokes them
        # once every member voted (with the group's, below): the others expect it then
        own_request = requested and self._requested[0] != g
        made_from = old.descendants()  # released with it (held until then: the program drops them as it remakes them)
        if not own_request:
            self._revoke_descendants(old, g, "quiet" if requested else "fail")
        requester = self._requested[1] if self._requested[0] == g else self.slot
        cause = (f"reshape requested by slot {requester}" if requested else str(old.failure)
                 if old.failure is not None
                 else f"{seen[0].name!r} failed (made from the group's): {seen[0].failure}" if seen
                 else f"this member's communicator was {old.state} (no failure recorded: "
                 f"{'abort()' if old.state == 'aborted' else 'closed'} called in this process)")
        t_start = time.time()
        self._announce(g, old.global_ranks, requested)  # done already when the failure was recorded
        members, parent = self.members, old
        attempt = 0
        while True:
            grew = self._others_grew(g, wait=attempt == 0)
            if not grew:
                new_members, committed = self._agree(g, attempt, members)
                grew = self._others_grew(g)  # by the end of g's agreement
            if grew:
                # this member's grow failed where the others' succeeded: they are in generation g + 1 (and
                # wait in it for this member), none in g. Reshape g + 1 as one of its members, with them,
                # never as g's last member (a second group, apart from theirs)
                members, attempt = self._failed_grow[1], 0  # type: ignore[index]
                self._failed_grow = None
                if not old.closed:
                    old.abort()  # g's communicator: nobody else uses it any more
                self.members, self.generation, g = members, g + 1, g + 1
                self._moved.set()
                self._announce(g, members)
                continue
            tr = Transition("shrink", g + 1, self.members, new_members, cause, detected=detected,
                            agreement_started=t_start, agreed=time.time(), attempts=attempt + 1,
                            committed=None if committed is None or committed < 0 else committed)
            if self.slot not in new_members:
                old.abort()
                raise Excluded(f"slot {self.slot} was left out of generation {g + 1} of {self.name!r} "
                               f"(members {list(new_members)})")
            _fp.hit(FP_REVOKE_BEFORE)
            if parent.state == "active" and requested and parent.failure is None:
                self._revoke_descendants(parent, g, "quiet")
                self._quiet_revoke(parent)
            if parent.state == "active":
                parent.fail(CommFailure("reshape"))
            if parent.state == "active":
                # another thread recorded the failure and has not applied the policy yet (a timeout
                # is reported before its policy acts): revoke now, or its revoke would land inside
                # the shrink
                try:
                    parent.revoke()
                except CommStateError:
                    pass  # that thread's policy revoked it meanwhile
                except Exception:  # as the policy does when revoke fails or is missing: abort (then re-init)
                    parent.abort()
            tr.revoked = time.time()
            # the ranks of generation g that leave (after a grow that failed here, parent is g - 1's
            # communicator, aborted: this member then meets the others at the next attempt's init)
            kept = set(new_members)
            gone = [i for i, m in enumerate(members) if m not in kept] if parent.global_ranks is not None else []
            try:
                _fp.hit(FP_SHRINK_BEFORE)
                shrink = attempt == 0 and gone and len(new_members) > 1 and self.library.has("ncclCommShrink")
                if shrink and parent.closed:
                    # the others shrink at this attempt (and fail at once without this member): meet
                    # them at the next attempt's fresh init rather than at this attempt's
                    raise CommFailure(f"slot {self.slot} cannot shrink: its communicator was aborted")
                if shrink:
                    comm = parent.shrink(gone, abort_ops=True, name=self.name, timeout=self.timeout, generation=g + 1,
                                         failure_callbacks=[self._on_comm_failure])
                    self._adopt(comm, new_members, g + 1)
                else:
                    tr.kind = "requested" if requested and new_members == self.members else "reinit"
                    self._new_comm(new_members.index(self.slot), new_members, f"{self._ns}/g{g}/a{attempt}/uid", g + 1)
                tr.comm_ready = time.time()
                # no barrier: the shrink (or init) returns on no survivor before every survivor has
                # joined it, and the caller's next operation is the new communicator's first collective
                _fp.hit(FP_SHRINK_AFTER)
                break
            except (CommFailure, NCCLError, StoreError) as exc:
                _log.warning("slot %d: reshape attempt %d of generation %d failed: %s", self.slot, attempt, g, exc)
                if self.comm is not old and self.comm is not parent:
                    self.comm.abort()
                self.comm, self.members, self.generation = old, members, g
                if isinstance(exc, StoreError):
                    self._raise_if_store_lost(exc, "reshape")  # no attempt can agree without the store
                members = new_members
                attempt += 1
                cause = f"{cause}; then during the reshape: {exc}"
        lost = sorted(self._lost) if self.rank == 0 else []  # this reshape's, and any a former rank 0 did not mark
        # off the critical path: the first collective on the new communicator need not wait for them
        threading.Thread(target=self._release, args=(old, made_from, lost, g + 1),
                         name=f"pycoll-elastic-release-{self.name}", daemon=True).start()
        self._committed = tr.committed
        self._record(tr)
        _fp.hit(FP_RESHAPE_DONE)
        return self.comm

    def _raise_if_store_lost(self, exc: StoreError, what: str) -> None:
        """Raise :class:`StoreLost` from ``exc``, with what it means for the group, when ``exc`` is one (the
        connection to the store failed): the members cannot agree on anything without the store."""
        if not isinstance(exc, StoreLost) or exc.group is not None:
            return
        lost = StoreLost(
            f"group {self.name!r} (slot {self.slot}) lost its store during the {what}: {exc}. The store's server "
            f"is gone or unreachable (with a torchrun-style rendezvous and no launcher it runs in rank 0's process, "
            f"and dies with it); without the store the members cannot agree on a membership, so the group cannot "
            f"go on. Host the store outside the ranks (pycoll-run does; or torchrun's agent store) for a job that "
            f"survives the loss of any rank")
        lost.group = self.name
        raise lost from exc

    def _others_grew(self, g: int, wait: bool = False) -> bool:
        """True when this member's grow from generation g failed and another member's built g + 1.

        ``wait``: look for their record for up to half a window, until every other member of g has
        recorded a failed grow too. The others write it right after their grow, which ended with this
        member's failed one; had this member gone into g's agreement meanwhile (where they never come),
        they would have waited in g + 1's agreement for its vote, and left it out, before it came."""
        fg = self._failed_grow
        if fg is None or fg[0] != g + 1:
            return False
        built = [f"{self._ns}/g{g + 1}/built"]
        failed = [f"{self._ns}/g{g + 1}/failed/{m}" for m in self.members if m != self.slot]
        end = time.monotonic() + (self.window / 2 if wait else 0.0)
        try:
            while True:
                if self.store.check(built):
                    return True
                if time.monotonic() >= end or (failed and self.store.check(failed)):
                    return False
                time.sleep(0.01)
        except StoreError:
            return False

    def _quiet_revoke(self, comm: Communicator) -> None:
        """Revoke ``comm`` without recording a failure (a requested reshape); abort it where revoke fails."""
        try:
            comm.revoke()
        except CommStateError:
            pass  # revoked (or failed) meanwhile
        except Exception as exc:  # no revoke in this library: abort (the reshape re-initialises)
            _log.debug("slot %d: revoking generation %d failed (%s); aborting it", self.slot, comm.generation, exc)
            comm.abort()

    def _on_comm_failure(self, comm: Communicator, exc: BaseException) -> None:
        if comm is self.comm:
            self._announce(comm.generation, comm.global_ranks)

    def _announce(self, g: int, members: Optional[Sequence[int]], requested: bool = False) -> None:
        """Start generation ``g``'s reshape in the background: vouch for this process and raise the
        reshape flag, which wakes the members that are not inside a collective (their watcher
        revokes and vouches). Called when the failure is recorded, before the caller even sees it.
        ``members``: generation g's (None: not known here; the vote then never decides). ``requested``:
        nothing failed, this member asks for the reshape (the flag says so: the others record no failure)."""
        if self._announced >= g:
            return
        self._announced = g
        self._announce_q.put((g, members, requested))  # the announcer thread (starting one here would cost ~1 ms)

    def _step(self) -> int:
        """What a voucher says: the last step this member committed (-1: none)."""
        return -1 if self._committed is None else self._committed

    def _vouch_and_flag(self, g: int, members: Optional[Sequence[int]], requested: bool = False) -> None:
        try:
            self._vouch(g, 0, members)
            _fp.hit(FP_ANNOUNCE_BEFORE_FLAG)
            vote = self._vote
            if vote is not None and vote[0] == (g, 0) and not vote[1]:
                return  # an earlier vote's member raises the flag (or, dead, fails the others' collectives)
            self.store.compare_set(f"{self._ns}/g{g}/reshape", b"", f"{self.slot}{_REQUESTED if requested else ''}")
        except Exception as exc:  # the agreement's own store calls will report a broken store
            _log.debug("slot %d: announcing the reshape of generation %d failed: %s", self.slot, g, exc)

    def _vouch(self, g: int, attempt: int, members: Optional[Sequence[int]] = None) -> None:
        """Tell the other members that this process takes part in (generation, attempt)'s agreement.

        Once per (generation, attempt), whichever thread comes first; another one waits until that
        vote has landed (what it learnt, :attr:`_vote`, is then known). ``members``: that agreement's
        members, when the caller knows them: a vote through the store that completes their set then
        proposes the decision at once (:func:`pycoll.membership.vouch_and_decide`).
        """
        with self._vote_lock:
            if self._vouched == (g, attempt):
                return
            self._vouched = (g, attempt)
            link = self._hub_link(g) if attempt == 0 else None
            try:
                if link is not None:
                    try:
                        link.vote(f"{self._ns}/g{g}/a0/", self.slot, self._step(), self.members, self.window)
                        self._hub_voted = (g, attempt)
                        return
                    except _node.HubLost:
                        pass  # the store then
                base = f"{self._ns}/g{g}/a{attempt}/"
                if members is not None:  # the last member to vote decides
                    members = tuple(members)
                    voted, decision = _mb.vouch_and_decide(self.store, base, self.slot, members, self._step(),
                                                           self._gone_test(members))
                    self._vote = ((g, attempt), len(voted) == 1, members, decision)
                else:
                    _mb.vouch(self.store, base, self.slot, self._step())
            except BaseException:
                self._vouched = (-1, -1)
                raise

    def _release(self, old: Communicator, made_from: Sequence[Communicator], lost: Sequence[int],
                 generation: int) -> None:
        """Abort the replaced communicator and those the program made from it (``made_from``: revoked with it --
        each held its segment until the process ended, and the flight recorder took its failed operations for
        unfinished ones at exit); tell the launcher which slots were lost (rank 0).

        Runs after the first operation on the new communicator (as the held dumps do), at most 2 s later.
        """
        deadline = time.monotonic() + 2.0
        while not self._dumps_may_run() and time.monotonic() < deadline:
            time.sleep(0.005)
        for comm in [*made_from, old]:
            try:
                # after an abortive shrink the parent is released with abort, never destroy (NCCL's
                # destroy barrier would wait for the dead)
                comm.abort()
            except Exception:
                _log.exception("slot %d: releasing %r of generation %d failed", self.slot, comm.name, generation - 1)
        for m in lost:
            if m in self.members:
                continue  # admitted again meanwhile (a replacement): no longer lost
            try:
                mark_lost(self.store, m, f"left out of generation {generation}")
            except (StoreError, AttributeError):
                pass

    # -- grow -------------------------------------------------------------------------------------

    def pending_joiners(self) -> List[int]:
        """Slots of processes waiting to join (read from the store)."""
        return _mb.pending_joiners(self.store, self._ns, self.members)

    def maybe_grow(self) -> bool:
        """Admit waiting joiners; every member must call it at the same step boundary.

        Returns True when the membership grew (send the joiners their state then). Rank 0 decides
        (its watcher thread looks for join requests in the background) and the decision travels
        with the communicator: one 8-byte broadcast, no store round trip, when nobody waits. A
        member that died or stopped makes it raise :class:`~pycoll.CommFailure` on the others, as a
        collective would: handle it as one (:meth:`reshape`). Call :meth:`commit` before it.
        A store that cannot be reached any more raises :class:`~pycoll.StoreLost` (no CommFailure).
        """
        if not self.comm.closed and self.comm.failure is None:
            self.comm.claim("ElasticGroup.maybe_grow")  # refused as itself, not as the broadcast it makes
        try:
            return self._maybe_grow()
        except StoreError as exc:
            self._raise_if_store_lost(exc, "grow")
            raise

    def _maybe_grow(self) -> bool:
        self._grow_calls += 1
        _fp.hit(FP_GROW_BEFORE_DECISION)
        joiners = self._grow_decision()
        if not joiners:
            return False
        _fp.hit(FP_GROW_AFTER_DECISION)
        g = self.generation
        t0 = time.time()
        old = self.comm
        members = self.members + tuple(joiners)
        kind = "grow" if self.library.has("ncclCommGrow") else "grow-reinit"
        tr = Transition(kind, g + 1, self.members, members, f"joiners {joiners}", detected=t0, agreement_started=t0,
                        committed=self._committed)
        uid_key = f"{self._ns}/g{g + 1}/uid"
        uid: Any = None
        if self.rank == 0:
            uid = old.get_unique_id() if kind == "grow" else self.library.get_unique_id()
            self.store.set(uid_key, bytes(uid))
            _fp.hit(FP_GROW_ADMIT)
            step = -1 if self._committed is None else self._committed
            _mb.admit(self.store, self._ns, joiners, g + 1, members, kind, step, self.timeout)
        # every member needs the id (for a reinit's init; for a grow, the new communicator's name, alike on
        # every rank and joiner): it travels with the communicator
        uid = B.UniqueId.from_bytes(old.broadcast_bytes(bytes(uid) if uid is not None else None, 128))
        tr.agreed = tr.revoked = time.time()
        _fp.hit(FP_GROW_BEFORE_COMM)
        guard = self._guard([m for m in members if m != self.slot], old, "grow")
        try:
            if kind == "grow":
                comm = old.grow(len(members), uid, name=self.name, timeout=self.timeout,
                                global_ranks=members, generation=g + 1, failure_callbacks=[self._on_comm_failure])
                self._adopt(comm, members, g + 1)
            else:
                comm = init(self.rank, len(members), unique_id=uid, init_timeout=self.timeout,
                            give_up=self._gone_give_up(members, "grow"), **self._comm_options(members, g + 1))
                self._adopt(comm, members, g + 1)
        except (CommFailure, NCCLError, StoreError) as exc:
            guard.set()
            _fp.hit(FP_GROW_FAILED)
            self._failed_grow = (g + 1, members)
            try:  # for the members whose grow failed too: this one is not in generation g + 1 (see _others_grew)
                self.store.set(f"{self._ns}/g{g + 1}/failed/{self.slot}", b"")
            except StoreError as sexc:
                _log.debug("slot %d: recording the failed grow of generation %d failed: %s", self.slot, g + 1, sexc)
            if old.state == "active" and old.failure is None:
                old.fail(CommFailure(f"the grow of generation {g} of {self.name!r} failed: {exc}"))
            raise CommFailure(f"the grow of generation {g} of {self.name!r} failed: {exc}") from exc
        guard.set()
        tr.comm_ready = time.time()
        _fp.hit(FP_GROW_AFTER_COMM)
        try:  # for a member whose own grow failed: generation g + 1 exists (see _reshape)
            self.store.set(f"{self._ns}/g{g + 1}/built", str(self.slot).encode())
        except StoreError as exc:
            _log.debug("slot %d: recording the grow of generation %d failed: %s", self.slot, g + 1, exc)
        # generation g's communicator: idle (no operation outstanding) and nobody uses it any more. Its
        # destroy would finalize with every old member, so a member stopped or killed right after its
        # grow would hold this one for the whole timeout; an abort frees it without waiting for anyone
        old.abort()
        _fp.hit(FP_GROW_FIRST_COLLECTIVE)
        self.comm.barrier()
        # the communicators the program made from generation g's belong to it (the program makes them again): past
        # the barrier every member is, so none of them is in use -- each kept its segment (10 MiB a grow and split)
        keep = {id(self.comm)} | {id(c) for c in self.comm.descendants(closed=True)}
        for child in old.descendants():
            if id(child) not in keep:
                child.abort()
        tr.first_collective = time.time()
        self._record(tr)
        if self.rank == 0:  # the joiners' slots take part again: for the launcher, a stop of them is no longer a hang
            for m in joiners:
                try:
                    unmark_lost(self.store, m)
                except (StoreError, AttributeError):
                    pass
        return True

    def _grow_decision(self) -> List[int]:
        """Rank 0's list of joiners to admit now, known to every member (through the communicator)."""
        joiners: List[int] = []
        if self.rank == 0 and self._joiners_seen:
            joiners = [j for j in self.pending_joiners() if not self._slot_gone(j)]
        # a count of 8 bytes when nobody waits, the joiners after it when some do (on a device through
        # the communicator's buffer: Communicator.broadcast_bytes)
        me = self.rank == 0
        count = int(np.frombuffer(self.comm.broadcast_bytes(np.int64(len(joiners)).tobytes() if me else None, 8),
                                  np.int64)[0])
        if count <= 0:
            return []
        body = self.comm.broadcast_bytes(np.array(joiners, np.int64).tobytes() if me else None, 8 * count)
        return [int(x) for x in np.frombuffer(body, np.int64)]

    # -- teardown ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the watcher and destroy the communicator (collective over the current members).

        Processes still waiting to join are told that the group has finished (they raise
        :class:`Excluded`). A member that died or stopped after the last step does not make it fail: the
        communicator is aborted instead, the member's slot is marked lost for the launcher (as a reshape
        would have), and a warning names it; a failure with every member alive raises as the destroy's does.
        Closing again does nothing. Refused (:class:`~pycoll.CommStateError`), with nothing changed, from a thread
        other than the one that has the communicator (:meth:`~pycoll.Communicator.hand_off`).
        """
        if self._closed:
            return
        healthy = not self.comm.closed and self.comm.failure is None
        if healthy:  # refused before anything changes: a refused close can be made again
            self.comm.claim("ElasticGroup.close", closing=True)
        self._closed = True
        self._stop.set()
        self._announce_q.put(None)
        get_watchdog().remove_dump_gate(self._dump_gate)
        if self.slot == self.members[0] and self.comm.failure is None:
            self._tell_joiners_finished()
        if self._watcher is not None:
            self._watcher.join(2.0)
        if self._node is not None:
            self._node.close()
        if self.comm.closed:
            return
        error: Optional[BaseException] = None
        if self.comm.state == "active" and self.comm.failure is None:
            try:
                self.comm.destroy()
                self._closed_here()
                return
            except (CommFailure, NCCLError) as exc:
                error = exc
            except KeyboardInterrupt:  # in the destroy: nothing is left half closed (a second close does nothing)
                self.comm.abort()
                raise
        if not self.comm.closed:
            self.comm.abort()  # a failed communicator (its failure was the caller's to see), or a failed destroy
        # gone, and not after a close of its own (a member that closed and ended is gone too, and no loss)
        gone = [m for m in self.members if m != self.slot and self._slot_gone(m)
                and not self._closed_there(m)]
        self._closed_here()
        if healthy and self.members[0] in gone and self.slot == min(m for m in self.members if m not in gone):
            # the member that tells waiting joiners the group finished died after the last step: the first member
            # left tells them (else a replacement of it found every member gone: a finished job failed)
            self._tell_joiners_finished()
        if not gone:
            if error is not None:
                raise error
            return
        _fp.hit(FP_CLOSE_GONE)
        _log.warning("slot %d: closing group %r: slot%s %s gone (%s); the communicator was aborted and the slot%s "
                     "marked lost", self.slot, self.name, "s" if len(gone) > 1 else "", ", ".join(map(str, gone)),
                     error or self.comm.failure, "s" if len(gone) > 1 else "")
        for m in gone:
            try:
                mark_lost(self.store, m, f"gone when group {self.name!r} closed")
            except (StoreError, AttributeError):
                pass

    def _tell_joiners_finished(self) -> None:
        """Tell the processes still waiting to join that the group finished (they raise :class:`Excluded`)."""
        try:
            self.store.set(f"{self._ns}/closed", b"1")
        except StoreError as exc:  # a store that is gone: the communicator is still released
            _log.warning("slot %d: closing group %r: could not tell waiting joiners (%s)", self.slot, self.name, exc)

    def _closed_key(self, slot: int) -> str:
        """The key a member sets once it closed this generation (a member gone after it is no loss)."""
        return f"{self._ns}/g{self.generation}/closed/{slot}"

    def _closed_here(self) -> None:
        try:
            self.store.set(self._closed_key(self.slot), b"")
        except StoreError as exc:
            _log.debug("slot %d: recording the close of group %r failed: %s", self.slot, self.name, exc)

    def _closed_there(self, slot: int) -> bool:
        try:
            return bool(self.store.check([self._closed_key(slot)]))
        except StoreError:
            return False

    def __enter__(self) -> ElasticGroup:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._stop.set()
            if self._node is not None:
                self._node.close()
            self.comm.abort()
