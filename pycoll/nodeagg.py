"""Node-level aggregation of the membership protocol: one process per host talks to the store for
every member of that host.

With one store connection per member, an agreement costs the store server a wake and two requests
per member (:mod:`pycoll.membership`); at 1,024 members that alone is over 150 ms on one Python
server. A :class:`NodeHub` runs in one member process of a host (the lowest local slot: see
:class:`NodeAggregation`) and serves the other members of that host over a Unix socket (abstract
namespace, ``SOCK_SEQPACKET``: one message per send, and end-of-file when a member's process exits):

* **watch** a key: the hub waits for it in the store once for the node and hands its value to every
  local member that asked (the reshape flag, the grow decision);
* **vote**: the hub collects the local members' votes for an agreement (until every connected local
  member of it that is not known gone has voted, at most ``collect`` seconds), sends them with one
  :func:`~pycoll.membership.vouch_many`, runs :func:`~pycoll.membership.agree` speaking for them and
  hands the decision to them (a vote that comes late is appended on its own).

A member never depends on the hub for its answer: it reaches the hub through a :class:`NodeLink`,
and when the link breaks (the hub's process exited, its thread failed and closed the socket), when
the hub's process is known gone (``gone(hub slot)``: stopped) or when no decision came within the
agreement's window, it falls back to the direct store path (:func:`agree`), which every member's
decision meets at the same compare-and-set: the answer stays the same on every member.

**Where the hub lives.** In a member process (the lowest local slot of the current membership), not in
``pycoll-run``'s launcher: :class:`pycoll.ElasticGroup` then needs no launcher (SLURM, Open MPI,
``torchrun`` jobs get it too), and every local member computes the hub's address from the members'
registered processes, no store key. The launcher would outlive a member's crash, but it would be one
more process whose death or stop every member must watch, and the hub's own failure is cheap here:
the members fall back to the store for that agreement, and the next membership elects the next
lowest local slot. A hub that dies before it forwards costs its members one store round each; one
that dies after forwarding costs nothing (the votes are in the store).
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import failpoints as _fp, membership as _mb
from .errors import StoreError, StoreTimeout

__all__ = ["NodeHub", "NodeLink", "HubLost", "NodeAggregation", "agree", "hub_address"]

_log = logging.getLogger("pycoll.nodeagg")

FP_NODE_COLLECT = _fp.declare("elastic.node.collect", "the node's hub, waiting for its local members' votes")
FP_NODE_FORWARD = _fp.declare("elastic.node.forward", "the node's hub, before it sends the local votes to the store")
FP_NODE_WATCH = _fp.declare("elastic.node.watch", "the node's hub, waiting in the store for a key its members watch")
FP_NODE_FANOUT = _fp.declare("elastic.node.fanout", "the node's hub, before it hands a value to its local members")
FP_NODE_VOTE = _fp.declare("elastic.node.vote", "a member, before it sends its vote to the node's hub")
FP_NODE_WAIT = _fp.declare("elastic.node.wait", "a member, waiting for a value from the node's hub")
FP_NODE_FALLBACK = _fp.declare("elastic.node.fallback", "a member lost the node's hub: it uses the store itself")

_HELLO, _WATCH, _VOTE, _VALUE, _BYE = b"H", b"W", b"V", b"K", b"B"
_U32 = struct.Struct("!I")
_WATCH_HEAD = struct.Struct("!d")  # how long the hub waits for the key (from now)
_VOTE_HEAD = struct.Struct("!IqdI")  # slot, step, window, length of the base
_MAX_MESSAGE = 1 << 20  # what the hub reads (a vote names every member: 4 bytes each)
_MAX_VALUE = 1 << 16  # what a member reads (a decision names the members left out)


def _recv(sock: socket.socket, buf: bytearray) -> bytes:
    """One message (b"": end of file); OSError when it does not fit in ``buf``."""
    n, _, flags, _ = sock.recvmsg_into([buf])
    if flags & socket.MSG_TRUNC:
        raise OSError(f"a node hub message over {len(buf)} bytes")
    return bytes(buf[:n])
_NO_SLOT = -1


class HubLost(ConnectionError):
    """The node's hub cannot serve this member any more (its socket closed, or its process is gone)."""


def hub_address(ns: str, boot: str, slot: int, pid: int) -> str:
    """The abstract Unix socket name of the hub that the process ``pid`` (slot ``slot``) hosts for
    the group under ``ns`` on the host with boot id ``boot``: every local member computes it from the
    members' registered processes, no store key needed."""
    return f"pycoll-node:{ns}:{boot[:12]}:{slot}:{pid}"


def _pack_key(kind: bytes, key: str, value: bytes = b"") -> bytes:
    k = key.encode()
    return kind + _U32.pack(len(k)) + k + value


def _unpack_key(body: bytes) -> Tuple[str, bytes]:
    (n,) = _U32.unpack_from(body)
    return body[4:4 + n].decode(), body[4 + n:]


class _Watch:
    __slots__ = ("subs", "value", "until", "waiting")

    def __init__(self) -> None:
        self.subs: List[socket.socket] = []
        self.value: Optional[bytes] = None
        self.until = 0.0  # the store waiter waits until then (members re-ask to extend it)
        self.waiting = False


class _Agreement:
    __slots__ = ("members", "window", "votes", "sent", "started")

    def __init__(self, members: Tuple[int, ...], window: float) -> None:
        self.members = members
        self.window = window
        self.votes: Dict[int, int] = {}
        self.sent: Set[int] = set()  # the votes already in the store
        self.started = time.monotonic()


class NodeHub:
    """The aggregator of one node: a thread that serves the local members' :class:`NodeLink`\\ s.

    Args:
        store: the group's store (thread-safe: the hub's waits run on their own threads).
        address: the abstract socket name (:func:`hub_address`).
        slot: the slot of the member process hosting the hub (the failpoints' rank).
        gone: the liveness rule of every member (as :func:`pycoll.membership.agree` takes it).
        collect: how long (seconds) the hub waits for its local members' votes before it sends those it
            has (default: half the agreement's window; a member known gone is not waited for).
    """

    def __init__(self, store: Any, address: str, slot: int, gone: _mb.Gone, *,
                 collect: Optional[float] = None) -> None:
        self.store, self.address, self.slot, self.gone, self.collect = store, address, slot, gone, collect
        self._buf = bytearray(_MAX_MESSAGE)
        self._lock = threading.Condition()
        self._slots: Dict[socket.socket, int] = {}  # connection -> the slot it said hello as
        self._watches: Dict[str, _Watch] = {}
        self._agreements: Dict[str, _Agreement] = {}
        self._closed = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._listener.bind("\0" + address)
            self._listener.listen(1024)
        except OSError:
            self._listener.close()
            raise
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name=f"pycoll-node-hub-{slot}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._closed

    def local_slots(self) -> Set[int]:
        """The slots of the members connected now."""
        with self._lock:
            return {s for s in self._slots.values() if s != _NO_SLOT}

    def close(self, bye: bool = True) -> None:
        """Stop serving: every connected member uses the store itself from now on (``bye``: they are
        told so first; else they see end-of-file, as when the hub's process dies)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._slots)
            self._slots.clear()
            self._lock.notify_all()
        for c in conns:
            if bye:
                self._send(c, _BYE)
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._listener.close()

    def _crash(self, where: str, exc: BaseException) -> None:
        _log.warning("node hub of slot %d failed (%s): %s; its members use the store themselves", self.slot, where, exc)
        self.close(bye=False)

    # -- the selector thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select(timeout=0.2):
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    else:
                        self._read(sock)  # type: ignore[arg-type]
        except BaseException as exc:  # a failpoint's raise, or a bug: the members fall back
            self._crash("serving", exc)
        finally:
            for c in list(self._sel.get_map().values()):
                try:
                    c.fileobj.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            self._sel.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with self._lock:
            self._slots[conn] = _NO_SLOT
        self._sel.register(conn, selectors.EVENT_READ)

    def _drop(self, conn: socket.socket) -> None:
        self._sel.unregister(conn)
        conn.close()
        with self._lock:
            self._slots.pop(conn, None)
            self._lock.notify_all()  # an agreement waiting for this member's vote need not any more

    def _read(self, conn: socket.socket) -> None:
        try:
            msg = _recv(conn, self._buf)
        except OSError:
            msg = b""
        if not msg:
            self._drop(conn)
            return
        kind, body = msg[:1], msg[1:]
        if kind == _HELLO:
            with self._lock:
                self._slots[conn] = _U32.unpack(body)[0]
        elif kind == _WATCH:
            (wait,) = _WATCH_HEAD.unpack_from(body)
            key, _ = _unpack_key(body[_WATCH_HEAD.size:])
            self._watch(conn, key, wait)
        elif kind == _VOTE:
            self._vote(conn, body)

    def _watch(self, conn: Optional[socket.socket], key: str, wait: float) -> None:
        with self._lock:
            w = self._watches.setdefault(key, _Watch())
            if w.value is not None:
                value = w.value
            else:
                if conn is not None and conn not in w.subs:
                    w.subs.append(conn)
                w.until = max(w.until, time.monotonic() + wait)
                if w.waiting or wait <= 0:
                    return
                w.waiting = True
                threading.Thread(target=self._wait_key, args=(key,), name="pycoll-node-watch", daemon=True).start()
                return
        if conn is not None:
            self._send(conn, _pack_key(_VALUE, key, value))

    def _vote(self, conn: socket.socket, body: bytes) -> None:
        slot, step, window, n = _VOTE_HEAD.unpack_from(body)
        at = _VOTE_HEAD.size
        base = body[at:at + n].decode()
        raw = body[at + n:]
        late: Dict[int, int] = {}
        with self._lock:
            a = self._agreements.get(base)
            if a is None:
                members = tuple(x for (x,) in _U32.iter_unpack(raw))
                a = self._agreements[base] = _Agreement(members, window)
                threading.Thread(target=self._agree, args=(base, a), name="pycoll-node-agree", daemon=True).start()
            a.votes[slot] = min(step, a.votes.get(slot, step))
            if a.sent and slot not in a.sent:
                late = {slot: a.votes[slot]}
                a.sent.add(slot)
            elif all(self.gone(s) for s in self._slots.values() if s in a.members and s not in a.votes):
                self._lock.notify_all()  # the last local vote: the agreement's thread forwards them
        self._watch(conn, f"{base}decision", 0.0)  # the agreement's thread hands the decision out
        if late:
            try:
                _mb.vouch_many(self.store, base, late, slot)
            except StoreError as exc:
                _log.debug("node hub of slot %d: forwarding a late vote failed: %s", self.slot, exc)

    # -- the waits (their own threads) ------------------------------------------------------------

    def _publish(self, key: str, value: bytes) -> None:
        with self._lock:
            w = self._watches.setdefault(key, _Watch())
            w.value, subs, w.subs = value, w.subs, []
            if len(self._watches) > 64:  # the old generations' keys
                for k in [k for k, x in self._watches.items() if x.value is not None][:16]:
                    del self._watches[k]
        _fp.hit(FP_NODE_FANOUT, rank=self.slot)
        msg = _pack_key(_VALUE, key, value)
        for c in subs:
            self._send(c, msg)

    def _send(self, conn: socket.socket, msg: bytes) -> None:
        try:
            conn.send(msg)
        except OSError:
            pass  # that member is gone: the selector sees it

    def _wait_key(self, key: str) -> None:
        try:
            while not self._closed:
                with self._lock:
                    w = self._watches[key]
                    left = w.until - time.monotonic()
                    if left <= 0:
                        w.waiting = False
                        return
                _fp.hit(FP_NODE_WATCH, rank=self.slot)
                try:
                    value: bytes = self.store.get(key, timeout=min(0.5, left))
                except StoreTimeout:
                    continue
                self._publish(key, value)
                return
        except BaseException as exc:
            self._crash(f"waiting for {key}", exc)

    def _agree(self, base: str, a: _Agreement) -> None:
        try:
            deadline = a.started + (a.window / 2 if self.collect is None else min(self.collect, a.window))
            _fp.hit(FP_NODE_COLLECT, rank=self.slot)
            with self._lock:
                while not self._closed:
                    local = [s for s in self._slots.values() if s in a.members]
                    missing = [s for s in local if s not in a.votes and not self.gone(s)]
                    left = deadline - time.monotonic()
                    if not missing or left <= 0:
                        break
                    self._lock.wait(left)
                votes = dict(a.votes)
                a.sent.update(votes)
            if self._closed:
                return
            _fp.hit(FP_NODE_FORWARD, rank=self.slot)
            voter = min(votes)
            # the votes travel with the wait for the decision: one store request for the node
            got = _mb.agree(self.store, base, voter, a.members, min(votes.values()), self.gone,
                            window=max(0.0, a.started + a.window - time.monotonic()), timeout=a.window,
                            speaks_for=[s for s in votes if s != voter], votes=votes)
            members, step = got
            keep = set(members)
            out = [m for m in a.members if m not in keep]  # the decision as the store holds it
            self._publish(f"{base}decision", f"x:{_mb.members_str(out)}|{'' if step is None else step}".encode())
        except BaseException as exc:
            self._crash(f"the agreement under {base}", exc)
        finally:
            with self._lock:
                if len(self._agreements) > 16:
                    self._agreements.pop(next(iter(self._agreements)))


class NodeLink:
    """A member's connection to its node's :class:`NodeHub`; thread-safe (the watcher and the
    thread that agrees share it: one of them reads the socket at a time, for both).

    ``hub_gone()``: True once the hub's process is known gone (stopped: it cannot close its socket).
    Raises :class:`HubLost` (an OSError) when the hub cannot be reached.
    """

    def __init__(self, address: str, slot: int, hub_gone: Callable[[], bool] = lambda: False) -> None:
        self.address, self.slot, self.hub_gone = address, slot, hub_gone
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect("\0" + address)
            self._sock.send(_HELLO + _U32.pack(slot))
        except OSError as exc:
            self._sock.close()
            raise HubLost(f"slot {slot}: no node hub at {address!r}: {exc}") from exc
        self._cv = threading.Condition()
        self._packed: Tuple[Tuple[int, ...], bytes] = ((), b"")  # the members of the last vote, packed
        self._buf = bytearray(_MAX_VALUE)
        self._values: Dict[str, bytes] = {}
        self._reading = False
        self._broken = False
        self._bye = False

    @property
    def broken(self) -> bool:
        return self._broken

    @property
    def closed_by_hub(self) -> bool:
        """The hub said goodbye (its group closed it): no failure."""
        return self._bye

    def close(self) -> None:
        with self._cv:
            self._broken = True
            self._cv.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _send(self, msg: bytes) -> None:
        if not self._broken and self.hub_gone():
            # a stopped hub's socket still takes messages: a vote sent there would reach no one
            self._lost()
        if self._broken:
            raise HubLost(f"slot {self.slot}: the node hub is lost")
        try:
            self._sock.send(msg)
        except OSError as exc:
            self._lost()
            raise HubLost(f"slot {self.slot}: the node hub is lost: {exc}") from exc

    def _lost(self) -> None:
        with self._cv:
            self._broken = True
            self._cv.notify_all()

    def vote(self, base: str, slot: int, step: int, members: Sequence[int], window: float) -> None:
        """Send ``slot``'s vote for the agreement under ``base`` to the hub (which waits for the
        other local members' votes, sends them together and hands the decision back)."""
        _fp.hit(FP_NODE_VOTE, rank=slot)
        b = base.encode()
        members = tuple(members)
        if self._packed[0] != members:
            self._packed = (members, struct.pack(f"!{len(members)}I", *members))
        self._send(_VOTE + _VOTE_HEAD.pack(slot, step, window, len(b)) + b + self._packed[1])

    def watch(self, key: str, timeout: float, every: float = 0.05) -> Optional[bytes]:
        """The value of ``key`` once the hub got it from the store; None after ``timeout`` seconds.
        HubLost when the hub is gone (the caller waits in the store itself), looked at every ``every``
        seconds: a hub whose process stopped would otherwise hold the watcher (ElasticGroup's, which
        also looks for joiners and follows the membership) for the whole wait."""
        self._send(_WATCH + _WATCH_HEAD.pack(max(timeout, 0.5)) + _U32.pack(len(key.encode())) + key.encode())
        return self.wait(key, timeout, every)

    def wait(self, key: str, timeout: float, every: float = 0.05) -> Optional[bytes]:
        """The value of ``key`` from the hub (asked for by :meth:`watch` or :meth:`vote`), looking at
        the hub's liveness every ``every`` seconds; None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cv:
                while True:
                    if key in self._values:
                        return self._values[key]
                    if self._broken:
                        raise HubLost(f"slot {self.slot}: the node hub is lost")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    if not self._reading:
                        self._reading = True
                        break
                    self._cv.wait(min(every, left))
                    if self.hub_gone():
                        self._broken = True
            _fp.hit(FP_NODE_WAIT, rank=self.slot)
            msg: Optional[bytes] = None
            try:
                self._sock.settimeout(max(0.001, min(every, left)))
                msg = _recv(self._sock, self._buf)
                if not msg:
                    self._broken = True
            except TimeoutError:
                if self.hub_gone():
                    self._broken = True
            except OSError:
                self._broken = True
            finally:
                with self._cv:
                    self._reading = False
                    if msg and msg[:1] == _BYE:
                        self._broken = self._bye = True
                    elif msg and msg[:1] == _VALUE:
                        k, v = _unpack_key(msg[1:])
                        self._values[k] = v
                        if len(self._values) > 64:
                            del self._values[next(iter(self._values))]
                    self._cv.notify_all()


def agree(link: Optional[NodeLink], store: Any, base: str, slot: int, members: Sequence[int], step: int,
          gone: _mb.Gone, *, window: float, timeout: float,
          hub_voted: bool = False) -> Tuple[Tuple[int, ...], Optional[int]]:
    """:func:`pycoll.membership.agree` through the node's hub: vote to the hub, get the decision from
    it; the same answer as the direct path, which this falls back to when the hub is lost (or
    ``link`` is None), or when a hub that is alive sent no decision within ``window + timeout``
    (a store that does not answer delays the hub as much as it would this member).

    ``hub_voted``: this member's vote went to a hub only (:meth:`NodeLink.vote`); with ``link`` None
    it is sent to the store first (that hub may never forward it, and the direct path waits for the
    votes in the store: the others would leave this live member out).

    A member that falls back waits a whole ``window`` for the others' votes again: the hub may have
    held this node's votes until then (with less, a store that froze for a while would make the
    first members back leave out the live ones whose votes the hub had not sent yet)."""
    members = tuple(members)
    if link is not None:
        try:
            link.vote(base, slot, step, members, window)
            raw = link.wait(f"{base}decision", window + timeout, every=_mb.wait_slice(len(members)))
            if raw is not None:
                return _mb.parse_decision(raw, members)
        except HubLost as exc:
            _log.info("%s", exc)
        _fp.hit(FP_NODE_FALLBACK, rank=slot)
        _mb.vouch(store, base, slot, step)  # voting twice is harmless
    elif hub_voted:
        _mb.vouch(store, base, slot, step)
    return _mb.agree(store, base, slot, members, step, gone, window=window, timeout=timeout)


def watch_key(link: Optional[NodeLink], store: Any, key: str, timeout: float) -> Optional[bytes]:
    """The value of ``key`` through the hub (None after ``timeout``), else from the store itself."""
    if link is not None:
        try:
            return link.watch(key, timeout)
        except HubLost:
            if not link.closed_by_hub:
                _fp.hit(FP_NODE_FALLBACK, rank=link.slot)
    try:
        value: bytes = store.get(key, timeout=timeout)
        return value
    except StoreTimeout:
        return None


_GIVE_UP = 40  # connection attempts to one hub address (the watcher tries every 50 ms while it starts)


class NodeAggregation:
    """Which member of this host hosts the hub, per membership: the lowest slot among the members
    whose process runs on this host (same boot id); none for a membership of fewer than
    ``min_members``. Used by :class:`pycoll.ElasticGroup`.

    ``procs``: slot -> (boot id, pid) of the members' processes. :meth:`link` returns this member's
    link for ``members`` (hosting the hub first when this member is the lowest local slot), or None
    when this member is alone on its host or the hub cannot be reached yet (then it uses the store).
    """

    def __init__(self, store: Any, ns: str, slot: int, boot: str, gone: _mb.Gone, min_members: int = 1) -> None:
        self.store, self.ns, self.slot, self.boot, self.gone = store, ns, slot, boot, gone
        #: memberships smaller than this agree through the store, without a hub
        self.min_members = min_members
        self.hub: Optional[NodeHub] = None
        self._link: Optional[NodeLink] = None
        self._address = ""
        #: the last :meth:`link` found no hub to reach yet (it is starting): look again soon
        self.pending = False
        self._tries = 0  # failed connections to this address (given up after 2 s of them)

    def address(self, members: Sequence[int], procs: Dict[int, Tuple[str, int]]) -> str:
        """The address of the hub of ``members``; "" when this member has none, or when a member whose
        process ``procs`` lacks has a lower slot than the lowest local one (it may be local)."""
        local = sorted(m for m in members if m in procs and procs[m][0] == self.boot and self.boot)
        if (len(members) < self.min_members or self.slot not in local or len(local) < 2
                or any(m < local[0] for m in members if m not in procs)):
            return ""
        return hub_address(self.ns, self.boot, local[0], procs[local[0]][1])

    def link(self, members: Sequence[int], procs: Dict[int, Tuple[str, int]]) -> Optional[NodeLink]:
        self.pending = False
        local = sorted(m for m in members if m in procs and procs[m][0] == self.boot and self.boot)
        if len(members) < self.min_members or self.slot not in local or len(local) < 2:
            self.close()
            return None
        host = local[0]
        address = hub_address(self.ns, self.boot, host, procs[host][1])
        if address != self._address:
            self.close()
            self._address, self._tries = address, 0
        elif self._link is not None and self._link.broken:
            if self._link.closed_by_hub:
                self._tries = _GIVE_UP  # its group closed it: the store, until the hub changes
            self._link.close()
            self._link = None
        if self._tries >= _GIVE_UP:
            return None
        if host != self.slot and self.gone(host):  # stopped: its socket would take what no one reads
            if self._link is not None:
                self._link.close()
                self._link = None
            return None
        if host == self.slot and (self.hub is None or not self.hub.alive):
            try:
                self.hub = NodeHub(self.store, address, self.slot, self.gone)
            except OSError as exc:  # the name is taken (a hub that failed and left it bound): the store it is
                _log.info("slot %d: cannot host the node hub: %s", self.slot, exc)
                return None
        if self._link is None:
            try:
                self._link = NodeLink(address, self.slot, lambda: self.gone(host))
            except HubLost:
                self._tries += 1
                self.pending = self._tries < _GIVE_UP
                return None  # not up yet: the next look tries again
        return self._link

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
        if self.hub is not None:
            self.hub.close()
            self.hub = None
        self._address = ""
