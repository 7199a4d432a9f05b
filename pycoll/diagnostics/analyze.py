"""``pycoll-fr DIR``: find where the ranks of each communicator diverged, from flight-recorder dumps.

Reads the dumps pycoll's flight recorder writes (PyTorch's schema ``"2.10"``, pickle or JSON; torch's
own dumps too, of NCCL and of gloo process groups -- whose dumps list no group's members: the report says what it took
them to be) and reports, per communicator, the first operation where the ranks part ways:

* ranks that never entered it (with their last operation of any kind and where it was issued), and what holds
  such a rank when its dump says: a send or receive of its own (with why it cannot complete: no matching peer
  operation, a mismatched one, a wrong peer) or an operation in flight on another communicator of its process,
* operation type, size and dtype mismatches (the minority is named the culprit), and reduction-op and root
  mismatches, read from the host library's mismatch text that a failed entry holds (``pycoll_error``; a rank
  that completed the operation without an error, such as a sender that compared its call with no one's, is
  said to be of unknown call), and the call of a rank whose peer went past the operation without doing its
  part for it (``"call"``: where one rank ran ahead, only the rank left waiting finds the mismatch),
* ranks still in flight in it, with the Python stack that issued it,
* ranks a failing rank's liveness check found unable to take part (stopped, exited, silent: its failure report's
  ``unable``), named first in the verdict as the cause; where it found one in this very operation well within its
  timeout (less than half of it), a rank that merely had not entered it yet is said to be slow (``not_yet``), not
  blamed (dumps of an earlier pycoll, without ``unable``, are analysed as before),
* point-to-point operations without a matching peer operation,

An operation captured in a CUDA graph (state ``captured``) never completes by design: it runs only at the
graph's replays (where a ``graph_replay`` entry of :meth:`pycoll.Communicator.watch_stream` watches it). It is
neither in flight nor a divergence; its type, size and dtype are still matched across ranks, and the report
lists it as captured.

plus dumps missing from member ranks (reported, not fatal: the store progress that the failing ranks
recorded in their dumps stands in for them) and the failure lines the watchdogs logged. An operation that
completed on every rank with a dump shows that a rank without one took part only where its completion needed
that rank: a broadcast's or scatter's root and a gather's or reduce's other ranks complete without waiting for
the ranks they send to (on the host library's eager lane up to 16 operations ahead), so where such operations
follow the last one that shows a rank without a dump took part, the report says it may have stopped as early as
the first of them (``unshown``), not only where the ranks with dumps got stuck.

A rank's dump may be older than what the others did: written on demand, on a stall or for another communicator, and
never replaced (its rank was killed, or could not dump again). Where another rank completed a later collective that
took its part, or where it was written (not at its rank's exit) well before the first failure another rank recorded,
its dump predates them (``stale_dumps``): from the first collective after the last one it shows, its rank is taken as
one without a dump -- what the others read of it in the store says what is known -- never as one that did not enter
them.

A file that is no dump the analyzer can read -- not JSON or a pickle of plain data, or one whose structure is not
the schema's (an entry that is no object or has no ``collective_seq_id``, a field of another type:
:class:`InvalidDump`) -- is reported as unreadable and its rank as one without a dump; the other ranks are analysed.

``DIR`` is a dump directory holding ``generation_<g>`` folders (each generation is analysed on its
own) or one generation's folder. Needs no torch. Pickles are loaded with a loader that refuses
anything but plain data, so a dump cannot run code.

``--trace OUT.json`` also writes every rank and generation as one Chrome trace-event file (Perfetto,
``chrome://tracing``; :mod:`pycoll.diagnostics.trace`), ``--plot OUT.png`` a picture of the ranks side by
side around the first divergence (:mod:`pycoll.diagnostics.plot`, needs matplotlib).

Exit status: 0 no problem found, 1 problems found, 2 nothing could be analysed (or the trace or plot
could not be written).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import re
import sys
from collections import Counter, defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..hooks import Progress
from .plot import plot_trace
from .stacks import is_runtime_frame
from .trace import build_trace, never_ran, write_trace

__all__ = ["load_generation", "find_generations", "analyze", "analyze_dir", "format_report", "trace_dir", "InvalidDump",
           "main"]

_GEN_RE = re.compile(r"^generation_(\d+)$")
_RANK_RE = re.compile(r"(\d+)(?:\.json)?$")
_TORCH_DIST_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")  # torch's own frames in torch's dumps


# -- loading ---------------------------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """Loads only builtin containers and scalars: a dump never needs a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a flight-recorder dump holds only plain data")


def _load_file(path: str) -> Dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    data = json.loads(raw.decode("utf-8")) if path.endswith(".json") else _PlainUnpickler(io.BytesIO(raw)).load()
    if not isinstance(data, dict) or "entries" not in data or "version" not in data:
        raise ValueError("not a flight-recorder dump (no 'entries'/'version')")
    _check(isinstance(data["entries"], list), "'entries' is not a list")
    pyc = data.get("pycoll")
    _check(pyc is None or isinstance(pyc, dict), "'pycoll' is not an object")
    _check(not isinstance(pyc, dict) or _list_of_dicts(pyc.get("other_entries")),
           "'pycoll.other_entries' is not a list of objects")
    for i, e in enumerate(data["entries"]):  # what merging them reads: their record ids
        _check(isinstance(e, dict), f"entries[{i}] is {type(e).__name__}, not an object")
        _check(_ints_where_given(e, ("record_id", "pycoll_record_id")), f"entries[{i}] has a non-integer record id")
    for i, e in enumerate((pyc or {}).get("other_entries") or []):
        _check(_ints_where_given(e, ("record_id",)), f"pycoll.other_entries[{i}] has a non-integer record id")
    data = _merged(data)
    _check_dump(data)
    return _torch_gloo(data)


class InvalidDump(ValueError):
    """A file that parses but is no flight-recorder dump of the schema the analyzer reads (a field of another type,
    a required one missing): its rank is reported as one without a readable dump."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise InvalidDump(f"invalid dump: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_of_dicts(v: Any) -> bool:
    """None, or a list of objects."""
    return v is None or (isinstance(v, list) and all(isinstance(x, dict) for x in v))


def _dict_of_dicts(v: Any) -> bool:
    """None, or an object whose values are objects."""
    return v is None or (isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()))


def _ints_where_given(d: Dict[str, Any], keys: Iterable[str], *, num: bool = False) -> bool:
    return all(d.get(k) is None or (_is_num(d[k]) if num else _is_int(d[k])) for k in keys)


def _check_dump(data: Dict[str, Any]) -> None:
    """Raise :class:`InvalidDump` where ``data`` (a dump as :func:`_merged` gives it) holds what the analysis cannot
    read: every field it reads has its schema's type where present, and every entry its ``collective_seq_id``."""
    for i, e in enumerate(data["entries"]):
        where = f"entries[{i}]"
        _check(isinstance(e, dict), f"{where} is {type(e).__name__}, not an object")
        _check(_is_int(e.get("collective_seq_id")), f"{where} has no integer 'collective_seq_id'")
        _check(_ints_where_given(e, ("record_id", "p2p_seq_id", "pycoll_root", "time_created_ns",
                                     "time_discovered_started_ns", "time_discovered_completed_ns")),
               f"{where} has a non-integer id or time")
        pg = e.get("process_group")
        _check(pg is None or (isinstance(pg, (list, tuple)) and all(isinstance(x, str) for x in pg)),
               f"{where}.process_group is not a list of strings")
        for key in ("profiling_name", "state"):
            _check(e.get(key) is None or isinstance(e[key], str), f"{where}.{key} is not a string")
        for key in ("input_sizes", "output_sizes"):
            v = e.get(key)
            _check(v is None or (isinstance(v, (list, tuple)) and all(
                isinstance(x, (list, tuple)) and all(_is_int(n) for n in x) for x in v)),
                f"{where}.{key} is not a list of shapes")
        for key in ("input_dtypes", "output_dtypes"):
            v = e.get(key)
            _check(v is None or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)),
                   f"{where}.{key} is not a list of strings")
        _check(_list_of_dicts(e.get("frames")), f"{where}.frames is not a list of objects")
    cfg = data.get("pg_config")
    _check(_dict_of_dicts(cfg), "'pg_config' is not an object of objects")
    for uid, c in (cfg or {}).items():
        _check(c.get("ranks") is None or isinstance(c["ranks"], (str, list)), f"pg_config[{uid!r}].ranks is neither "
               "a string nor a list")
    pyc = data.get("pycoll")
    if pyc is None:
        return
    _check(pyc.get("rank") is None or _is_int(pyc["rank"]), "'pycoll.rank' is not an integer")
    _check(pyc.get("time_ns") is None or _is_int(pyc["time_ns"]), "'pycoll.time_ns' is not an integer")
    for key in ("main_thread", "failures", "earlier_dumps", "transitions"):
        _check(_list_of_dicts(pyc.get(key)), f"'pycoll.{key}' is not a list of objects")
    for i, e in enumerate(pyc.get("earlier_dumps") or []):
        _check(_list_of_dicts(e.get("main_thread")), f"'pycoll.earlier_dumps[{i}].main_thread' is not a list of "
               "objects")
    comms = pyc.get("comms")
    _check(_dict_of_dicts(comms), "'pycoll.comms' is not an object of objects")
    for uid, c in (comms or {}).items():
        p = c.get("progress")
        _check(p is None or (isinstance(p, dict) and _ints_where_given(p, Progress._fields)),
               f"'pycoll.comms[{uid!r}].progress' is not an object of integers")
    for i, rep in enumerate(pyc.get("failures") or []):
        where = f"'pycoll.failures[{i}]'"
        _check(_ints_where_given(rep, ("time", "elapsed_s"), num=True) and _ints_where_given(rep, ("seq", "request")),
               f"{where} has a non-numeric time, seq or request")
        _check(_dict_of_dicts(rep.get("peers")), f"{where}.peers is not an object of objects")
        for peer in (rep.get("peers") or {}).values():
            _check(_ints_where_given(peer, (*Progress._fields, "time_ns", "request")),
                   f"{where}.peers has a non-integer progress, time or request")
        for key in ("behind", "unconfirmed", "gone", "silent", "peer_failures"):
            _check(rep.get(key) is None or isinstance(rep[key], dict), f"{where}.{key} is not an object")
        _check(all(_is_num(v) or v is None for v in (rep.get("silent") or {}).values()),
               f"{where}.silent is not an object of numbers")
        _check(_dict_of_dicts(rep.get("unable")) and all(
            _ints_where_given(v, ("pid",)) for v in (rep.get("unable") or {}).values()),
            f"{where}.unable is not an object of objects with an integer pid")


def _merged(data: Dict[str, Any]) -> Dict[str, Any]:
    """A dump as the recorder held it: the entries a pycoll dump keeps out of torch's analyzer's reach
    (``pycoll.other_entries``: sends and receives, one-sided operations, watched streams; see
    :mod:`pycoll.diagnostics.recorder`) back among its ``entries``, each with its own record id again
    (``pycoll_record_id``), in record-id order. A dump without them (torch's, an older pycoll's) stays as it is."""
    pyc = data.get("pycoll")
    other = pyc.get("other_entries") if isinstance(pyc, dict) else None
    entries = data.get("entries") or []
    if not isinstance(other, list) and not any(isinstance(e, dict) and "pycoll_record_id" in e for e in entries):
        return data
    out = dict(data)
    if isinstance(pyc, dict):
        out["pycoll"] = {k: v for k, v in pyc.items() if k != "other_entries"}
    own = [{**{k: v for k, v in e.items() if k != "pycoll_record_id"}, "record_id": e["pycoll_record_id"]}
           if isinstance(e, dict) and "pycoll_record_id" in e else e for e in entries]
    out["entries"] = sorted(own + list(other or []), key=lambda e: e.get("record_id", 0) if isinstance(e, dict) else 0)
    return out


def _torch_gloo(data: Dict[str, Any]) -> Dict[str, Any]:
    """A torch dump as the analysis reads one: torch's gloo process groups (2.13) write ``pg_config`` under one key
    ``''``, each group registered replacing the one before (its ``ranks`` ``"[]"`` for a group of every rank), while
    their entries name the groups by their own uids and ``pg_status`` by the process's own numbers of them (an
    entry's ``pg_id``: the default group's is 0); and they record neither start nor how an operation ended, only
    that it did (``retired``, a failed one too). Each group the entries (or ``pg_status``, where an entry maps its
    number to a uid) name that ``pg_config`` lacks is added without a member list (``"ranks": None``: the analysis
    guesses it, :func:`_with_members`) -- but the default group where it is the only one, whose ``''`` entry then
    lists its ranks --, a ``pg_config`` key nothing names is dropped, a retired entry is completed and one not
    retired started (gloo runs an operation as it is issued: there is no stream to wait on). ``pycoll_torch_gloo``
    marks such a dump. pycoll's dumps (with a ``pycoll`` section) and torch's NCCL dumps, where all of them agree, are
    left as they are."""
    if "pycoll" in data:
        return data
    cfg = dict(data.get("pg_config") or {})
    raw_status = data.get("pg_status")
    status: Dict[Any, Any] = raw_status if isinstance(raw_status, dict) else {}
    named = {str(pg[0]): str(pg[1]) if len(pg) > 1 else "" for e in data["entries"] if (pg := e.get("process_group"))}
    uid_of = {str(e["pg_id"]): str(e["process_group"][0]) for e in data["entries"]
              if _is_int(e.get("pg_id")) and e.get("process_group")}
    uid_of.setdefault("0", "0")  # the default group, made first: its number and its uid
    for number in status:
        if str(number) in uid_of:
            named.setdefault(uid_of[str(number)], "default_pg" if uid_of[str(number)] == "0" else "")
    unlisted = [uid for uid in named if uid not in cfg]
    if not unlisted:
        return data
    only = cfg.get("", {}).get("ranks") if set(map(str, status)) == {"0"} and named.keys() <= {"0"} else None
    for key in [k for k in cfg if k not in named]:
        del cfg[key]
    for uid in unlisted:
        listed = only if uid == "0" and _parse_members(only) else None
        cfg[uid] = {"name": uid, "desc": named[uid], "ranks": listed}
    entries = [{**e, "state": "completed" if e.get("retired") is True else "started"}
               if e.get("state") == "scheduled" else e for e in data["entries"]]
    return {**data, "pg_config": cfg, "entries": entries, "pycoll_torch_gloo": True}


def find_generations(path: str) -> List[Tuple[Optional[int], str]]:
    """``[(generation, folder)]`` under ``path``: its ``generation_<g>`` folders, else ``path`` itself.

    Generations whose pickle folder is absent but whose JSON folder (``json/generation_<g>``)
    exists are read from JSON.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a directory")
    found: Dict[int, str] = {}
    for name in os.listdir(path):
        m = _GEN_RE.match(name)
        if m and os.path.isdir(os.path.join(path, name)):
            found[int(m.group(1))] = os.path.join(path, name)
    jroot = os.path.join(path, "json")
    if os.path.isdir(jroot):
        for name in os.listdir(jroot):
            m = _GEN_RE.match(name)
            if m and int(m.group(1)) not in found:
                found[int(m.group(1))] = os.path.join(jroot, name)
    if found:
        return sorted(found.items())
    m = _GEN_RE.match(os.path.basename(os.path.normpath(path)))
    return [(int(m.group(1)) if m else None, path)]


def load_generation(folder: str, prefix: Optional[str] = None) -> Tuple[Dict[int, Dict[str, Any]], List[str]]:
    """``({global rank: dump}, [problems])`` for the dumps in ``folder`` (not recursive).

    The rank is the dump's own ``pycoll.rank`` when present, else the digits ending the file name
    (after ``prefix`` when given). Unreadable files (of another format, or of another structure than the schema's:
    :class:`InvalidDump`) are reported, not fatal. Pickles win over JSON for the same rank.
    """
    dumps: Dict[int, Dict[str, Any]] = {}
    kinds: Dict[int, str] = {}
    problems: List[str] = []
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(full):
            continue
        if prefix is not None and not name.startswith(prefix):
            continue
        m = _RANK_RE.search(name)
        if m is None:
            continue
        try:
            data = _load_file(full)
        except Exception as e:
            problems.append(f"{name}: unreadable ({type(e).__name__}: {e})")
            continue
        rank = data.get("pycoll", {}).get("rank") if isinstance(data.get("pycoll"), dict) else None
        if not isinstance(rank, int):
            rank = int(m.group(1))
        kind = "json" if name.endswith(".json") else "pickle"
        if rank in dumps and (kinds[rank] == "pickle" or kind == "json"):
            if kinds[rank] == kind:
                problems.append(f"{name}: a second dump for rank {rank}; ignored")
            continue
        dumps[rank] = data
        kinds[rank] = kind
    return dumps, problems


# -- entries --------------------------------------------------------------------------------------


def _outstanding(e: Dict[str, Any]) -> bool:
    """Whether entry ``e`` was still to run when its rank dumped: neither completed nor captured in a CUDA graph
    (a captured operation runs only at the graph's replays; its entry never completes)."""
    return e.get("state") not in ("completed", "captured")


def _op_of(entry: Dict[str, Any]) -> str:
    name = str(entry.get("profiling_name", ""))
    return name.split(":", 1)[-1].split(" ", 1)[0]


def _sizes(v: Any) -> List[List[int]]:
    return [list(s) for s in (v or [])]


def _numel(sizes: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(s) for s in sizes)


# a point-to-point entry's name: "send 0->1", "recv 1<-0", "sendrecv 0<->1" (the communicator's own ranks: this
# rank's, then its peer's); one-sided operations ("put_signal 0->1", "wait_signal 1<-0") are named alike
_PEER_RE = re.compile(r"(\w+) (\d+)(<->|->|<-)(\d+)$")
_TOWARDS = {"->": "to", "<-": "from", "<->": "with"}


def _peer(e: Dict[str, Any], members: Optional[Sequence[int]]) -> Optional[Tuple[str, int]]:
    """``(direction, the peer's global rank)`` of a point-to-point entry (None: not one)."""
    m = _PEER_RE.search(str(e.get("profiling_name", "")))
    if not e.get("is_p2p") or m is None:
        return None
    peer = int(m.group(4))
    return _TOWARDS[m.group(3)], members[peer] if members is not None and peer < len(members) else peer


def _describe(e: Dict[str, Any], members: Optional[Sequence[int]] = None) -> str:
    """``'all_reduce #3 [Float(2,)]'``; a point-to-point operation with its peer (a global rank, given the
    communicator's ``members``) and its p2p sequence number: ``'send to rank 1 (p2p #2) [Float(2,)]'``."""
    ins = _sizes(e.get("input_sizes"))
    outs = _sizes(e.get("output_sizes"))
    dts = list(e.get("input_dtypes") or e.get("output_dtypes") or [])
    shape = ins[0] if ins else (outs[0] if outs else [])
    peer = _peer(e, members)
    what = (f"{_op_of(e)} {peer[0]} rank {peer[1]} (p2p #{e.get('p2p_seq_id')})" if peer is not None
            else f"{_op_of(e)} #{e.get('collective_seq_id')}")
    return f"{what} [{dts[0] if dts else '-'}{tuple(shape)}]"


def _error_type(error: Any) -> str:
    """The type of an entry's recorded error (``'CommTimeout'`` of ``'CommTimeout: ...'``): it failed there; '' for
    none."""
    return str(error or "").split(":", 1)[0]


def _own(e: Optional[Dict[str, Any]], members: Optional[Sequence[int]] = None, issued: int = 0) -> str:
    return f"last {_describe(e, members)} {e.get('state')}" if e is not None else _nothing_recorded(issued)


def _nothing_recorded(issued: int) -> str:
    """A rank's dump holds no operation of a communicator on which it had ``issued`` some (the ring overwrote them
    with newer ones, of other communicators)."""
    if issued:
        return (f"no operation recorded: its ring no longer holds the {issued} it issued (a bigger "
                "PYCOLL_FR_BUFFER_SIZE keeps more)")
    return "no operation recorded"


def _issued(dump: Dict[str, Any], uid: str) -> int:
    """How many operations the dump's rank had issued on communicator ``uid``, by its progress counters."""
    comm = ((dump.get("pycoll") or {}).get("comms") or {}).get(uid) or {}
    progress = comm.get("progress") or {}
    return int(progress.get("coll_enqueued") or 0) + int(progress.get("p2p_enqueued") or 0)


# a module of Python's standard library (not site-packages), as another host's dump names it
_STDLIB_FRAME = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\](?!(?:site|dist)-packages[/\\])")


def _main_site(dump: Dict[str, Any]) -> str:
    """Where a dump says its main thread was (:func:`_user_site` of its ``main_thread`` frames), when it says."""
    frames = (dump.get("pycoll") or {}).get("main_thread") or []
    return _user_site([(str(fr.get("filename", "")), fr.get("line"), str(fr.get("name"))) for fr in frames])


def _earlier_site(dump: Dict[str, Any]) -> str:
    """Where the main thread was at the rank's earlier dumps of this generation (the dumps this one replaced,
    ``pycoll.earlier_dumps``): at the latest one a peer asked for (a peer's timeout, before the rank's own failure),
    else at the latest that says, with why that dump was made: ``'x.py:7 in <module> at its earlier dump (remote:
    requested by rank 0: ...)'``; '' where none says."""
    earlier = list(reversed((dump.get("pycoll") or {}).get("earlier_dumps") or []))
    for e in sorted(earlier, key=lambda e: e.get("trigger") != "remote"):  # stable: the latest first of each kind
        site = _main_site({"pycoll": e})
        if site:
            return f"{site} at its earlier dump ({_trigger(e)})"
    return ""


def _trigger(pyc: Dict[str, Any]) -> str:
    """Why a dump was made, from its ``pycoll`` section (or an entry of its ``earlier_dumps``)."""
    return f"{pyc.get('trigger', '?')}: {str(pyc.get('reason', ''))[:200]}"


def _user_site(frames: Sequence[Tuple[str, Any, str]]) -> str:
    """``'file:line in function'`` of the innermost frame of the user's code among ``frames`` ((filename, line,
    function), innermost first): neither pycoll's nor the standard library's. Where the user's code was inside a
    call of the standard library (a C loop of ``re.match`` holding the GIL, a ``time.sleep`` wrapper), that call
    follows: ``'x.py:7 in <module> (in re.match)'``; the standard library's frames that pycoll itself called (its
    exit and SIGTERM hooks waiting for the dump being written: ``threading.py in wait``) are pycoll's. Without a
    frame of the user's: the innermost one of the standard library that the user's code, not pycoll, called
    (a thread of its own), else ''."""
    names = [fn for fn, _, _ in frames]
    for i, (fn, line, func) in enumerate(frames):
        if is_runtime_frame(fn) or _STDLIB_FRAME.search(fn) or fn.startswith("<"):
            continue
        site = f"{os.path.basename(fn)}:{line} in {func}"
        inner = _STDLIB_FRAME.search(names[i - 1]) if i else None
        if inner is not None:
            module = re.sub(r"(?:[/\\]__init__)?\.py[cw]?$", "", names[i - 1][inner.end():])
            site += " (in " + re.sub(r"[/\\]", ".", module) + f".{frames[i - 1][2]})"
        return site
    first = 0
    while first < len(names) and _STDLIB_FRAME.search(names[first]):
        first += 1
    if first == len(names) or not is_runtime_frame(names[first]):
        first = 0  # no pycoll frame right outside them: the user's code called them
    for fn, line, func in frames[first:]:
        if not is_runtime_frame(fn) and not fn.startswith("<"):
            return f"{os.path.basename(fn)}:{line} in {func}"
    return ""


def _site(e: Dict[str, Any]) -> str:
    """'file:line in function' of the innermost frame outside pycoll's own modules (and torch.distributed's, in
    torch's dumps)."""
    for fr in e.get("frames") or []:
        fn = str(fr.get("filename", ""))
        if not is_runtime_frame(fn) and not _TORCH_DIST_FRAME.search(fn):
            return f"{os.path.basename(fn)}:{fr.get('line')} in {fr.get('name')}"
    return ""


def _stack(e: Dict[str, Any], limit: int) -> List[str]:
    return [f"{fr.get('name')} at {fr.get('filename')}:{fr.get('line')}" for fr in (e.get("frames") or [])[:limit]]


def _signature(e: Dict[str, Any], size: int) -> Dict[str, Any]:
    """What must agree across ranks for this operation (root-only buffers left out)."""
    op = _op_of(e)
    ins, outs = _sizes(e.get("input_sizes")), _sizes(e.get("output_sizes"))
    idt, odt = list(e.get("input_dtypes") or []), list(e.get("output_dtypes") or [])
    if op == "gather":
        outs, odt = [], []
    elif op == "scatter":
        ins, idt = [], []
    elif op in ("all_to_all", "all_to_all_single"):
        return {"numel": (_numel(ins), _numel(outs)), "dtypes": sorted(set(idt + odt))}
    # the library matches element counts, not shapes: a (2, 3) array meets a (6,) one
    return {"sizes": ([math.prod(x) for x in ins], [math.prod(x) for x in outs]), "dtypes": sorted(set(idt + odt))}


def _who(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {_fmt_ranks(rs)}"


def _fmt_ranks(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    if not rs:
        return "-"
    out, start, prev = [], rs[0], rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(out)


# -- analysis -------------------------------------------------------------------------------------


def _parse_members(ranks: Any) -> Optional[List[int]]:
    """A dump's member list (``pg_config[uid]["ranks"]``, ``"[0, 1]"``) as global ranks; None: unreadable."""
    try:
        return [int(x) for x in str(ranks if ranks is not None else "[]").strip("[] ").split(",") if x.strip()]
    except ValueError:
        return None


def _with_members(dumps: Dict[int, Dict[str, Any]], notes: List[str]) -> Dict[int, Dict[str, Any]]:
    """``dumps`` with a member list for each group a dump lists none of (``"ranks": None``, :func:`_torch_gloo`):
    the default group's the ranks up to the highest with a dump (a rank above it is not seen), another's the ranks
    whose dumps know it; ``notes`` says so (what the analysis assumed, no problem found). The dumps given are left as
    they are."""
    unlisted: Dict[str, List[int]] = defaultdict(list)
    for rank, d in sorted(dumps.items()):
        for key, cfg in (d.get("pg_config") or {}).items():
            if cfg.get("ranks", "[]") is None:
                unlisted[key].append(rank)
    if not unlisted:
        return dumps
    out = dict(dumps)
    for key, ranks in unlisted.items():
        desc = str(dumps[ranks[0]]["pg_config"][key].get("desc") or "")
        guess = list(range(max(dumps) + 1)) if desc == "default_pg" else ranks
        notes.append(f"group {key} ({desc or 'no description'}): its dumps list no members (torch's gloo dumps); "
                     f"taken as ranks {_fmt_ranks(guess)}" + (", up to the highest rank with a dump" if desc ==
                                                             "default_pg" else ", the ranks whose dumps know it"))
        for r in ranks:
            out[r] = {**out[r], "pg_config": {**out[r]["pg_config"], key: {**out[r]["pg_config"][key], "ranks": guess,
                                                                          "guessed": True}}}
    return out


def _groups(dumps: Dict[int, Dict[str, Any]], problems: List[str]) -> Dict[str, Dict[str, Any]]:
    groups: Dict[str, Dict[str, Any]] = {}
    for rank, d in sorted(dumps.items()):
        for key, cfg in (d.get("pg_config") or {}).items():
            members = _parse_members(cfg.get("ranks", "[]"))
            if members is None:
                problems.append(f"rank {rank}: unreadable member list {cfg.get('ranks')!r} for group {key}")
                continue
            g = groups.setdefault(key, {"uid": key, "name": cfg.get("desc", ""), "members": members, "seen_by": [],
                                        "guessed": bool(cfg.get("guessed"))})
            if g["members"] != members:
                problems.append(f"group {key}: rank {rank} lists members {members}, others {g['members']}")
            g["seen_by"].append(rank)
    return groups


def _apart(dumps: Dict[int, Dict[str, Any]], problems: List[str]) -> None:
    """Say so where the dumps fall into sets that share no communicator: the dumps of different runs (a dump
    folder used again, files copied together), which no analysis should mix."""
    sets: List[Tuple[set, List[int]]] = []  # (communicator uids, ranks)
    for rank, d in sorted(dumps.items()):
        uids = set(d.get("pg_config") or {})
        if not uids:
            continue  # knows no communicator: it says nothing either way
        joined = [i for i, (u, _) in enumerate(sets) if u & uids]
        merged: Tuple[set, List[int]] = (uids, [rank])
        for i in reversed(joined):
            u, rs = sets.pop(i)
            merged = (merged[0] | u, sorted(merged[1] + rs))
        sets.append(merged)
    if len(sets) > 1:
        # the generation each set's dumps record (pycoll's), where they agree on one
        gens = [{(dumps[r].get("pycoll") or {}).get("generation") for r in rs} for _, rs in sets]
        of_gens = all(len(g) == 1 and None not in g for g in gens) and len({next(iter(g)) for g in gens}) == len(gens)
        parts = sorted(((rs, next(iter(g))) for (_, rs), g in zip(sets, gens, strict=True)), key=lambda x: x[0])
        problems.append("the dumps share no communicator across " + " and ".join(
            (f"ranks {_fmt_ranks(rs)}" if len(rs) > 1 else f"rank {rs[0]}") + (f" (generation {g})" if of_gens else "")
            for rs, g in parts)
            + (": dumps of different generations in one folder?" if of_gens else
               ": dumps of different runs in one folder?") + " (each set is analysed apart; remove the stale files)")


def _global_keys(by_local: Any, members: List[int]) -> Dict[str, Any]:
    """A failure report's ``{local rank: value}`` (string keys) keyed by global rank (string keys); a
    ``report_age_s`` below 0 (a report made after the failure, as older pycoll wrote it) reads 0."""
    out: Dict[str, Any] = {}
    for k, v in (by_local or {}).items():
        try:
            local = int(k)
        except (TypeError, ValueError):
            continue
        if isinstance(v, dict) and isinstance(v.get("report_age_s"), (int, float)) and v["report_age_s"] < 0:
            v = {**v, "report_age_s": 0.0}
        out[str(members[local] if 0 <= local < len(members) else local)] = v
    return out


def _store_view(dumps: Dict[int, Dict[str, Any]], uid: str, local: int) -> Optional[Dict[str, Any]]:
    """A missing rank's progress as the failing ranks read it from the store (freshest report)."""
    best = None
    for rank, d in dumps.items():
        for rep in (d.get("pycoll") or {}).get("failures") or []:
            if rep.get("uid") != uid:
                continue
            p = (rep.get("peers") or {}).get(str(local))
            if p is None:
                continue
            age = None
            if isinstance(rep.get("time"), (int, float)) and isinstance(p.get("time_ns"), int):
                age = max(0.0, rep["time"] - p["time_ns"] / 1e9)  # an answer may postdate the failure
            answered = rep.get("request") is not None and int(p.get("request", -1)) >= int(rep["request"])
            cand = {"reported_by": rank, "progress": p, "silent_s": (rep.get("silent") or {}).get(str(local)),
                    "failure": (rep.get("peer_failures") or {}).get(str(local)), "age_s": age, "answered": answered,
                    "gone_pid": (rep.get("gone") or {}).get(str(local))}
            if best is None or p.get("time_ns", 0) > best["progress"].get("time_ns", 0):
                best = cand
    return best


def _analyze_group(g: Dict[str, Any], dumps: Dict[int, Dict[str, Any]], stack_limit: int,
                   stacks: Optional[Dict[int, Dict[str, Any]]] = None) -> Dict[str, Any]:
    uid, members = g["uid"], g["members"]
    size = len(members)
    local_of = {gr: i for i, gr in enumerate(members)}
    # a dump that does not know this communicator at all (another run's, left in the same folder) says nothing
    # of it: its rank counts as one without a dump, never as one that did not enter its operations
    present = [r for r in members if r in dumps and uid in (dumps[r].get("pg_config") or {})]
    foreign = [r for r in members if r in dumps and r not in present]
    res: Dict[str, Any] = {"uid": uid, "name": g["name"], "members": members, "members_guessed": g.get("guessed"),
                           "dumps_from": present,
                           "missing_dumps": [r for r in members if r not in present], "foreign_dumps": foreign,
                           "problems": [],
                           "first_divergence": None,
                           "matched_through": None, "dropped": [], "in_groups": [], "p2p": [], "failures": [],
                           "missing_dump_info": {},
                           "hosts": {r: str((dumps[r].get("pycoll") or {}).get("hostname") or "") for r in present}}
    coll: Dict[int, Dict[int, Dict[str, Any]]] = {}
    p2p: Dict[int, List[Dict[str, Any]]] = {}
    last: Dict[int, Optional[Dict[str, Any]]] = {}  # the last collective
    latest: Dict[int, Optional[Dict[str, Any]]] = {}  # the last operation of any kind
    for r in present:
        es = sorted((e for e in dumps[r].get("entries") or []
                     if (e.get("process_group") or [None])[0] == uid), key=lambda e: e.get("record_id", 0))
        coll[r] = {}
        p2p[r] = []
        for e in es:
            if e.get("is_p2p"):
                p2p[r].append(e)
            elif _op_of(e) != "coalesced":
                coll[r].setdefault(int(e.get("collective_seq_id", 0)), e)
        last[r] = max((e for e in coll[r].values()), key=lambda e: e["collective_seq_id"], default=None)
        latest[r] = next((e for e in reversed(es) if _op_of(e) != "coalesced"), None)
        for rep in (dumps[r].get("pycoll") or {}).get("failures") or []:
            if rep.get("uid") == uid:
                # the report names the communicator's own ranks; the analyzer's report, global ones throughout
                res["failures"].append({"rank": r, "error_type": rep.get("error_type"), "op": rep.get("op"),
                                        "seq": rep.get("seq"), "message": rep.get("message"), "time": rep.get("time"),
                                        "behind": _global_keys(rep.get("behind"), members),
                                        "unconfirmed": _global_keys(rep.get("unconfirmed"), members),
                                        "gone": _global_keys(rep.get("gone"), members),
                                        # absent from dumps of an earlier pycoll: its finding is only in the message
                                        "unable": _global_keys(rep.get("unable"), members),
                                        "is_p2p": bool(rep.get("is_p2p")), "timeout_s": rep.get("timeout_s"),
                                        "elapsed_s": rep.get("elapsed_s")})
    for r in res["missing_dumps"]:
        view = _store_view(dumps, uid, local_of[r])
        if view is not None:
            res["missing_dump_info"][r] = view
    # what a rank's own dump says of itself: it supersedes what the others read of it in the store
    res["own_dump"] = {}
    res["issued"] = {r: _issued(dumps[r], uid) for r in present}
    for r in present:
        res["own_dump"][r] = _own(latest[r], members, res["issued"][r])
        b = _blocked_in(dumps[r], uid, members, [], r)
        if b is not None and not b["here"]:
            res["own_dump"][r] += f", then {b['comm']!r} (ranks {_fmt_ranks(b['members'])}) {b['op']} {b['state']}"
    res["main_thread"] = {r: site for r in present if (site := _main_site(dumps[r]))}
    res["earlier_main_thread"] = {r: site for r in present if (site := _earlier_site(dumps[r]))}
    res["signal_stacks"] = _signal_stacks(stacks or {}, dumps, present)
    res["captured"] = _captured(present, coll, p2p, members)
    res["stale_dumps"] = _stale(dumps, uid, present, coll, res, local_of)

    with_entries = [r for r in present if coll[r]]
    # no dump holds an operation of it: nothing to compare (recording off, PYCOLL_FR_BUFFER_SIZE=0, or none issued)
    res["unrecorded"] = bool(present) and not with_entries and not any(p2p[r] for r in present)
    res["recording_off"] = res["unrecorded"] and all(
        (dumps[r].get("pycoll") or {}).get("buffer_size") == 0 for r in present)
    res["unshown"] = {}
    if with_entries:
        start = max(min(coll[r]) for r in with_entries)  # older entries were overwritten on some rank
        seqs = sorted({s for r in with_entries for s in coll[r] if s >= start})
        if start > 1:
            res["problems"].append(f"history starts at #{start} (older entries were overwritten on some rank)")
        # the last collective each rank without a dump is shown to have taken part in
        shown: Dict[int, int] = dict.fromkeys(res["missing_dumps"], start - 1)
        # a rank whose dump predates a collective counts, from that one on, as a rank without a dump
        shown.update({r: max(st["through"], start - 1) for r, st in res["stale_dumps"].items()})
        for s in seqs:
            outdated = [r for r, st in res["stale_dumps"].items() if s > st["through"]]
            if _dropped_everywhere(s, [r for r in present if r not in outdated], coll):
                # its group() was dropped on every rank (their blocks raised): nothing ran anywhere, which is legal and
                # no divergence; the ranks meet again at the next collective. It shows no rank's part (not ``shown``)
                res["dropped"].append(_describe(next(coll[r][s] for r in present if s in coll[r])))
                continue
            div = _check_seq(s, [r for r in present if r not in outdated], coll, last, latest, size, res, local_of,
                             stack_limit, outdated)
            if div is not None and not div["mismatch"] and _failed_with_a_later_one(s, present, coll):
                continue  # its group failed on a later collective's mismatch: that one is the divergence
            if div is not None and _waits_for_its_group(div, coll):
                # it completes with a later collective of its group: the group's divergence is there
                res["in_groups"].append({"op": div["op"], "completed": div["completed"], "ranks": {
                    r: info["group"] for r, info in div["in_flight"].items() if info["group"]}})
                continue
            if div is not None:
                res["first_divergence"] = div
                break
            res["matched_through"] = s
            done = {r: coll[r][s] for r in present if s in coll[r] and coll[r][s].get("state") == "completed"}
            for r in _parts_shown(done, res["missing_dumps"] + outdated, members):
                shown[r] = s
        res["unshown"] = _unshown(res, shown, coll, present)
    # a rank whose ring no longer holds its first sends and receives on it: their per-peer order is cut
    cut = {r: first for r in present if (first := _p2p_history_start(dumps[r], uid, p2p[r])) > 1}
    for r, first in sorted(cut.items()):
        res["problems"].append(f"point-to-point history of rank {r} starts at p2p #{first} (older entries were "
                               "overwritten): its sends and receives are not paired with their peers' (what did not "
                               "complete is named alone)")
    res["p2p"] = _check_p2p(members, present, p2p, stack_limit, cut)
    if res["first_divergence"] is not None:
        # a rank that never entered the operation because it is held in an operation of its own
        # or because the recovery stopped it first: its failure of this communicator is the revoke the elastic
        # layer makes when another member begins a reshape (CommRevoked, in no operation)
        revoked = {f["rank"] for f in res["failures"] if f.get("error_type") == "CommRevoked" and f.get("op") is None}
        for r, info in res["first_divergence"]["never_entered"].items():
            info["blocked_in"] = _blocked_in(dumps[r], uid, members, res["p2p"], r)
            info["revoked"] = r in revoked
        # an operation its rank's dump does not count as issued (the progress it gives) waits in a group() there
        # that had not ended: the group issues it as it ends (``grouped``; one of a group that ended, issued, is not:
        # its ``group`` names the collectives it completes with)
        seq = res["first_divergence"]["seq"]
        for r, info in res["first_divergence"]["in_flight"].items():
            p = ((((dumps[r].get("pycoll") or {}).get("comms") or {}).get(uid) or {}).get("progress") or {})
            info["grouped"] = info["state"] == "scheduled" and int(p.get("coll_enqueued", seq)) < seq
        _found_unable(res["first_divergence"], res["failures"])
    # a bystander: no rank recorded a failure of this communicator, and every dump was written for a failure (of
    # another communicator: an elastic group's earlier generation, whose dump was held back until after the
    # recovery; or, asked for by a rank where another communicator failed, one that names the failed ones and not
    # this). Its ranks were dumped at different moments while it ran: what is in flight on one rank and done on
    # another is no divergence (a mismatch still is)
    res["bystander"] = bool(present) and not res["failures"] and all(
        _for_another_failure(dumps[r].get("pycoll") or {}, uid)
        and not (((dumps[r].get("pycoll") or {}).get("comms") or {}).get(uid) or {}).get("failure") for r in present)
    return res


def _for_another_failure(section: Dict[str, Any], uid: str) -> bool:
    """Whether a dump (its ``pycoll`` section) was written for a failure that is not communicator ``uid``'s: its own
    rank's failure, or another rank's request that names the failed communicators (``failed_uids``) without it."""
    trigger = section.get("trigger")
    failed = section.get("failed_uids")
    return trigger == "failure" or (trigger == "remote" and isinstance(failed, list) and bool(failed)
                                    and uid not in failed)


def _signal_stacks(stacks: Dict[int, Dict[str, Any]], dumps: Dict[int, Dict[str, Any]], present: List[int]
                   ) -> Dict[int, Dict[str, Any]]:
    """The ranks of ``present`` whose process left stacks on the dump signal (:func:`find_stacks`: written from C as
    the signal came, so they show a main thread held in a C call that keeps the GIL, where the dump that its Python
    handler made later shows where it was once the call returned): rank -> that item, only where its ``pid`` is
    the one the rank's dump records (the stacks of another run's process in a dump folder used again are not
    its)."""
    out: Dict[int, Dict[str, Any]] = {}
    for r in present:
        st = stacks.get(r)
        pid = (dumps[r].get("pycoll") or {}).get("pid")
        if st is not None and st.get("site") and st.get("pid") is not None and st["pid"] == pid:
            out[r] = st
    return out


#: a dump written this much earlier (s) than the first failure another rank recorded on its communicator predates that
#: failure (the ranks' clocks may differ by less)
_STALE_MARGIN_S = 1.0


def _stale(dumps: Dict[int, Dict[str, Any]], uid: str, present: List[int], coll: Dict[int, Dict[int, Dict[str, Any]]],
           res: Dict[str, Any], local_of: Dict[int, int]) -> Dict[int, Dict[str, Any]]:
    """The ranks of ``present`` whose dump predates what the others did on communicator ``uid``: a dump its rank wrote
    earlier (on demand, on a stall, for another communicator) and never replaced -- the rank was killed, or could not
    dump again. Its rank did whatever it did after the dump unseen: it must not be taken to have never entered the
    collectives after the last its dump shows (``through``: that one, or the last its progress counters count).
    A dump predates them where another rank completed a later collective whose completion took its rank's part
    (:func:`_parts_shown`: its rank entered it after its dump), or where it was written, not at its rank's exit, more
    than :data:`_STALE_MARGIN_S` before the first failure another rank recorded on the communicator, its rank
    recording none of its own there. Rank -> ``{"through", "why", "view"}`` (``view``: its :func:`_store_view`, what
    the others read of it in the store, or None)."""
    members = res["members"]
    failed = [f for f in res["failures"] if isinstance(f.get("time"), (int, float)) and f["time"] > 0]
    out: Dict[int, Dict[str, Any]] = {}
    for r in present:
        pyc = dumps[r].get("pycoll") or {}
        comm = (pyc.get("comms") or {}).get(uid) or {}
        through = max(max(coll[r], default=0), int((comm.get("progress") or {}).get("coll_enqueued") or 0))
        later = sorted({s for q in present if q != r for s, e in coll[q].items()
                        if s > through and e.get("state") == "completed" and _parts_shown({q: e}, [r], members)})
        why: List[str] = []
        if later:
            done = sorted({q for q in present for s in later if coll[q].get(s, {}).get("state") == "completed"} - {r})
            ops = sorted({_op_of(coll[q][s]) for q in done for s in later if s in coll[q]})
            span = f"#{later[0]}" if len(later) == 1 else f"#{later[0]}-#{later[-1]}"
            why.append(f"{_who(done)} completed {'/'.join(ops)} {span} after it, which took its part")
        t = pyc.get("time_ns")
        others = [f for f in failed if f["rank"] != r]
        if isinstance(t, int) and others and not any(f["rank"] == r for f in res["failures"]) \
                and not comm.get("failure") and pyc.get("trigger") != "exit":
            first = min(others, key=lambda f: f["time"])
            ahead = first["time"] - t / 1e9
            if ahead > _STALE_MARGIN_S:
                why.append(f"written {ahead:.1f} s before rank {first['rank']}'s failure")
        if why:
            out[r] = {"through": through, "why": f"{_trigger(pyc)}; ends at #{through}; " + "; ".join(why),
                      "view": _store_view(dumps, uid, local_of[r])}
    return out


# Collectives whose senders complete without waiting for the ranks they send to: a broadcast's or scatter's root, a
# gather's or reduce's other ranks (the host library's eager lane runs them up to 16 operations ahead, as NCCL's and
# Open MPI's small messages do). Their completion on a rank shows the part of the ranks that sent to it only.
_SENDERS_RUN_AHEAD = frozenset({"broadcast", "_broadcast_oop", "scatter", "gather", "reduce", "_reduce_oop"})


def _parts_shown(done: Dict[int, Dict[str, Any]], missing: List[int], members: List[int]) -> List[int]:
    """The ranks of ``missing`` (without a dump) whose part in one collective its completion on the ranks of ``done``
    (rank -> completed entry) shows: every one for a collective that completes on no rank before every rank has
    entered it; for one whose senders run ahead (:data:`_SENDERS_RUN_AHEAD`), only a sender to a rank of ``done``:
    by the root the entries recorded (``pycoll_root``, a rank of the communicator whose ``members`` are these global
    ranks), every other rank where a gather's or reduce's root completed, the root where a broadcast's or scatter's
    receiver did. Entries without a root (dumps of an earlier pycoll): the other ranks of a gather whose root (the
    rank with an output) completed, the root of a scatter (the rank with an input) when it is the only rank without
    a dump; none for a broadcast or a reduce."""
    if not done or not missing:
        return []
    op = _op_of(next(iter(done.values())))
    if op not in _SENDERS_RUN_AHEAD:
        return list(missing)
    local = next((e["pycoll_root"] for e in done.values() if e.get("pycoll_root") is not None), None)
    if isinstance(local, int) and 0 <= local < len(members):
        root = members[local]
        if op in ("gather", "reduce", "_reduce_oop"):
            return list(missing) if root in done else []
        return [root] if root in missing and any(r != root for r in done) else []
    if op == "gather" and any(_sizes(e.get("output_sizes")) for e in done.values()):
        return list(missing)
    if op == "scatter" and len(missing) == 1 and not any(_sizes(e.get("input_sizes")) for e in done.values()):
        return list(missing)
    return []


def _unshown(res: Dict[str, Any], shown: Dict[int, int], coll: Dict[int, Dict[int, Dict[str, Any]]],
             present: List[int]) -> Dict[int, Dict[str, Any]]:
    """Rank without a dump -> the collectives up to ``matched_through`` that completed on every rank with a dump but
    do not show that it took part (``shown``: the last one that does; its store report, when it says it issued more,
    shows those too): ``{"from", "through", "ops"}`` (the operations' names), for ranks with such collectives."""
    through = res["matched_through"]
    out: Dict[int, Dict[str, Any]] = {}
    if through is None:
        return out
    for r, last in shown.items():
        stale = (res.get("stale_dumps") or {}).get(r)
        view = stale["view"] if stale is not None else res["missing_dump_info"].get(r)
        if view is not None and not view.get("failure"):
            last = max(last, int(view["progress"].get("coll_enqueued", 0) or 0))
        if last >= through:
            continue
        ops = sorted({_op_of(coll[q][s]) for q in present for s in coll[q] if last < s <= through})
        out[r] = {"from": last + 1, "through": through, "ops": ops, **({"stale": True} if stale is not None else {})}
    return out


def _unshown_label(u: Dict[str, Any]) -> str:
    """How the verdict names the rank of :func:`_unshown` item ``u``: one without a dump, or whose dump is older."""
    return "its dump predates them" if u.get("stale") else "no dump"


def _unshown_text(u: Dict[str, Any], *, short: bool = False) -> str:
    """Why a rank without a dump may have stopped before the first divergence: ``u`` is an :func:`_unshown` item;
    ``short``: the verdict's form."""
    rooted = [op for op in u["ops"] if op in _SENDERS_RUN_AHEAD]
    why = []
    if any(op in ("broadcast", "_broadcast_oop", "scatter") for op in rooted):
        why.append("a broadcast's or scatter's root completes without waiting for its receivers")
    if any(op in ("gather", "reduce", "_reduce_oop") for op in rooted):
        why.append("a gather's or reduce's other ranks complete without waiting for the root")
    span = f"{'/'.join(u['ops'])} " + (f"#{u['from']}" if u["from"] == u["through"]
                                        else f"#{u['from']}-#{u['through']}")
    if short:
        return (f"may have stopped as early as #{u['from']}: {span} completed on the ranks with dumps, which shows its "
                f"part only where it sent to them")
    return (f"its part is shown only through #{u['from'] - 1}: {span} completed on the ranks with dumps, which shows "
            f"it took part only where it sent to them ({'; '.join(why)}), so it may have stopped as early as "
            f"#{u['from']}")


def _captured(present: List[int], coll: Dict[int, Dict[int, Dict[str, Any]]], p2p: Dict[int, List[Dict[str, Any]]],
              members: List[int]) -> List[Dict[str, Any]]:
    """The operations captured in a CUDA graph (state ``captured``), in order: each with its text (``op``), the
    ranks that captured it and their captures' ids (each process numbers its own captures)."""
    found: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for r in present:
        ops: List[Tuple[Tuple[Any, ...], Dict[str, Any]]] = [(("coll", s), e) for s, e in coll[r].items()]
        ops += [(("p2p", r, e.get("p2p_seq_id")), e) for e in p2p[r]]
        for key, e in ops:
            if e.get("state") != "captured":
                continue
            item = found.setdefault(key, {"seq": e.get("collective_seq_id"), "op": _describe(e, members),
                                          "ranks": [], "capture_ids": []})
            item["ranks"].append(r)
            cid = e.get("pycoll_capture_id")
            if cid is not None and cid not in item["capture_ids"]:
                item["capture_ids"].append(cid)
    return sorted(found.values(), key=lambda i: (i["seq"] or 0, i["ranks"]))


def _captured_text(c: Dict[str, Any], limit: int = 6) -> str:
    """``'all_reduce #2 [Float(4,)] (capture 1), ...'``: communicator report ``c``'s captured operations (the
    ranks named where not every rank with a dump captured it)."""
    items = []
    for i in c.get("captured") or []:
        text = i["op"]
        if sorted(i["ranks"]) != sorted(c["dumps_from"]):
            text += f" on {_who(i['ranks'])}"
        ids = sorted(i["capture_ids"])
        if ids:
            text += f" (capture{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))})"
        items.append(text)
    return _listed(items, limit)


def _listed(items: Sequence[str], limit: int = 6) -> str:
    """``items`` joined with commas, the ones past ``limit`` counted."""
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")


def _first_p2p(c: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The point-to-point issue communicator report ``c``'s verdict names: the first one of a transfer without its
    other side or with sides that differ, where there is one, before one merely not completed (a send whose receive
    completed waits for the rest of its group: the transfer the group waits for is the one to name), else the first;
    None where there is none."""
    return next((i for i in c["p2p"] if i["kind"] != "incomplete"), c["p2p"][0] if c["p2p"] else None)


def _overtaken(c: Dict[str, Any]) -> List[int]:
    """The ranks that never entered communicator report ``c``'s first divergent operation only because the recovery
    revoked their communicator before they issued it (a reshape another member began: a peer died while they were
    between two operations), where the verdict has others to point at. Where it has none, every rank that never
    entered it was so stopped, and they stay culprits: late enough for the others to time out waiting for them."""
    d = c["first_divergence"]
    revoked = {r for r, info in d["never_entered"].items() if info.get("revoked")}
    others = ((set(d["never_entered"]) - revoked) | set(c.get("unshown") or {})
              | {r for r, t in d["missing_dumps"].items() if "not seen entering" in t}
              | set((d["mismatch"] or {}).get("culprits") or []))
    return sorted(revoked) if revoked and others else []


def _troubled(c: Dict[str, Any]) -> bool:
    """Whether communicator report ``c`` shows a problem (a bystander's in-flight differences are none)."""
    d = c["first_divergence"]
    if c.get("bystander"):
        return bool((d is not None and d["mismatch"]) or c["p2p"])
    return (d is not None or bool(c["p2p"]) or bool(c["missing_dumps"])
            or bool(c["failures"] and c.get("unrecorded")))


def _dropped_everywhere(s: int, present: List[int], coll: Dict[int, Dict[int, Dict[str, Any]]]) -> bool:
    """Whether collective #``s`` never ran on any rank of ``present`` (those with a dump that reaches it) and each of
    them recorded it so (:func:`~pycoll.diagnostics.trace.never_ran`: its group dropped or refused): every rank left
    it alike, so none waits for another there."""
    return bool(present) and all(s in coll[r] and never_ran(coll[r][s]) for r in present)


def _check_seq(s: int, present: List[int], coll: Dict[int, Dict[int, Dict[str, Any]]],
               last: Dict[int, Optional[Dict[str, Any]]], latest: Dict[int, Optional[Dict[str, Any]]], size: int,
               res: Dict[str, Any], local_of: Dict[int, int], stack_limit: int,
               outdated: Sequence[int] = ()) -> Optional[Dict[str, Any]]:
    """Collective #``s`` across the ranks of ``present`` (with a dump that reaches it; ``outdated``: the ranks whose
    dump predates it, :func:`_stale`): None where it completed on every one of them, else the divergence."""
    got = {r: coll[r][s] for r in present if s in coll[r]}
    absent = [r for r in present if s not in coll[r]]
    ref = next(iter(got.values()))
    div: Dict[str, Any] = {"seq": s, "op": _describe(ref), "never_entered": {}, "skipped": [], "mismatch": None,
                           "in_flight": {}, "completed": [], "captured": [], "missing_dumps": {}, "stale_dumps": {}}
    for r in absent:
        lc = last[r]
        if lc is not None and lc["collective_seq_id"] > s:
            div["skipped"].append(r)
            continue
        le = latest[r]  # a send or a receive after its last collective is its last operation
        info: Dict[str, Any] = {"last_op": _describe(le, res["members"]) if le else None,
                                "last_state": le.get("state") if le else None, "last_site": _site(le) if le else "",
                                "issued": res["issued"].get(r, 0)}
        div["never_entered"][r] = info
    # type, then sizes, then dtypes (then what the library's mismatch text names): the first that disagrees
    for kind in ("type", "size", "dtype"):
        if kind == "type":
            keyed = {r: _op_of(e) for r, e in got.items()}
        else:
            sig = {r: _signature(e, size) for r, e in got.items()}
            keyed = {r: json.dumps(sig[r].get("dtypes" if kind == "dtype" else "sizes", sig[r].get("numel")))
                     for r in got}
        counts = Counter(keyed.values())
        if len(counts) > 1:
            div["mismatch"] = _mismatch(kind, keyed, {r: _variant_text(kind, e) for r, e in got.items()})
            break
    if div["mismatch"] is None:  # the roots the entries recorded (a rooted collective's, every rank with a dump)
        roots = {r: e["pycoll_root"] for r, e in got.items() if e.get("pycoll_root") is not None}
        if len(set(roots.values())) > 1:
            div["mismatch"] = {**_mismatch("root", roots, {r: _root_text(v, res["members"]) for r, v in roots.items()}),
                               "known": sorted(roots)}
    if div["mismatch"] is None:
        calls = _library_calls(got, res["members"], local_of)
        for kind in ("op", "root", "count", "datatype"):
            keyed = {r: c[kind] for r, c in calls.items() if kind in c}
            if len(set(keyed.values())) > 1:
                # what a rank that completed it without an error called is known only where an error names it (a
                # broadcast's root and a gather's other ranks complete without comparing their call with anyone's)
                div["mismatch"] = {**_mismatch(kind, keyed, {r: _root_text(v, res["members"]) if kind == "root"
                                                             else f"{kind}={v}" for r, v in keyed.items()}),
                                   "known": sorted(keyed)}
                break
    if div["mismatch"] is None:
        div["mismatch"] = _went_past(got, res["members"])
    for r, e in got.items():
        if e.get("state") == "completed":
            div["completed"].append(r)
        elif e.get("state") == "captured":
            div["captured"].append(r)
        else:
            div["in_flight"][r] = {"state": e.get("state"), "site": _site(e), "stack": _stack(e, stack_limit),
                                   "error": e.get("pycoll_error"), "enqueued_ns": e.get("time_created_ns"),
                                   "group": _group_of(e)}
    if not absent and not div["mismatch"] and not div["in_flight"]:
        return None  # completed (or captured) on every rank with a dump: the ranks without one took part too
    for r in res["missing_dumps"]:
        view = res["missing_dump_info"].get(r)
        if view is None:
            div["missing_dumps"][r] = ("its dump does not know this communicator (another run's?) and no store "
                                       "report: unknown" if r in res["foreign_dumps"]
                                       else "no dump and no store report: unknown")
            continue
        div["missing_dumps"][r] = "no dump; " + _view_text(view, s)
    for r in outdated:
        st = res["stale_dumps"][r]
        div["stale_dumps"][r] = (f"its dump predates it ({st['why']}): "
                                 + (_view_text(st["view"], s) if st["view"] is not None
                                    else "what it did after is unknown (no store report)"))
    return div


def _view_text(view: Dict[str, Any], s: int) -> str:
    """What the store says of a rank's part in collective #``s``: ``view`` is its :func:`_store_view`."""
    p = view["progress"]
    if view.get("failure"):
        return f"failed: {view['failure']}"
    if p.get("coll_enqueued", 0) < s:
        if view.get("answered"):
            said = f"its answer to rank {view['reported_by']}'s dump request said #{p.get('coll_enqueued')}"
        else:
            age = view.get("age_s")
            said = ("its last report in the store"
                    + (f", {age:.1f} s old when rank {view['reported_by']} failed," if age is not None
                       else f" (read by rank {view['reported_by']})")
                    + f" said #{p.get('coll_enqueued')}")
        gone = (f"its process (pid {view['gone_pid']}) was gone when rank {view['reported_by']} looked; "
                if view.get("gone_pid") is not None else "")
        return (f"{gone}not seen entering it: {said}"
                + (f", and it had been silent for {view['silent_s']:.1f} s" if view.get("silent_s") else ""))
    return f"had issued it per the store (read by rank {view['reported_by']})"


#: a rank that had not entered a collective when a peer's watchdog failed it this early (a fraction of that
#: collective's timeout, from the peer's issue of it) while it found another rank unable to take part is not behind:
#: it had most of its timeout left, and the rank found unable explains the failure
_NOT_YET_FRACTION = 0.5


def _found_unable(d: Dict[str, Any], failures: List[Dict[str, Any]]) -> None:
    """Set the first divergence ``d``'s ``found_unable`` and ``not_yet`` from its communicator's ``failures``.

    ``found_unable``: rank -> ``{"why", "pid", "by", "op", "seq", "is_p2p", "elapsed_s", "timeout_s"}``, the ranks a
    failing rank's liveness check found unable to take part (stopped, exited, silent: its report's ``unable``, the
    cause of its PeerFailure) that did not complete ``d``'s collective (they never entered it, are in flight in it,
    left no dump or one that predates it); the earliest report naming a rank is kept. ``not_yet``: rank ->
    ``{"by", "elapsed_s", "timeout_s"}``, where one of them was found so in ``d``'s collective itself before
    :data:`_NOT_YET_FRACTION` of its timeout had passed, the ranks that merely had not entered it yet (neither held in
    an operation of their own nor found unable themselves): slow, not the cause. Dumps of an earlier pycoll have no
    ``unable``: both stay empty."""
    found: Dict[int, Dict[str, Any]] = {}
    d["found_unable"], d["not_yet"] = found, {}
    candidates = (set(d["never_entered"]) | set(d["in_flight"]) | set(d["missing_dumps"])
                  | set(d.get("stale_dumps") or {}))
    for f in sorted(failures, key=lambda f: f["time"] if _is_num(f.get("time")) else 0.0):
        for k, v in (f.get("unable") or {}).items():
            r = int(k)
            if r in candidates and r not in found and isinstance(v, dict):
                found[r] = {"why": str(v.get("why") or "unable to take part"), "pid": v.get("pid"), "by": f["rank"],
                            "op": f.get("op"), "seq": f.get("seq"), "is_p2p": bool(f.get("is_p2p")),
                            "elapsed_s": f.get("elapsed_s"), "timeout_s": f.get("timeout_s")}
    early = next((u for _, u in sorted(found.items()) if _in_it(u, d) and _is_num(u["elapsed_s"])
                  and _is_num(u["timeout_s"]) and u["elapsed_s"] < _NOT_YET_FRACTION * u["timeout_s"]), None)
    if early is not None:
        d["not_yet"] = {r: {k: early[k] for k in ("by", "elapsed_s", "timeout_s")}
                        for r, info in sorted(d["never_entered"].items())
                        if r not in found and not info.get("blocked_in")}


def _in_it(u: Dict[str, Any], d: Dict[str, Any]) -> bool:
    """Whether the rank that found a peer unable (``u``, a :func:`_found_unable` item) failed in ``d``'s collective."""
    return u["op"] is not None and not u["is_p2p"] and u["seq"] == d["seq"]


def _unable_text(r: int, u: Dict[str, Any], d: Dict[str, Any], name: str) -> str:
    """The verdict on rank ``r``, which a peer's liveness check found unable to take part (:func:`_found_unable`)."""
    where = ("inside" if r in d["in_flight"] else "before it entered" if r in d["never_entered"]
             else "while the others waited in")
    pid = f" (pid {u['pid']})" if u.get("pid") is not None else ""
    when = (f", {u['elapsed_s']:.2f} s into its {u['timeout_s']:g} s timeout" if _in_it(u, d)
            and _is_num(u["elapsed_s"]) and _is_num(u["timeout_s"])
            else f", in its {u['op']} #{u['seq']}" if u["op"] is not None and not _in_it(u, d) else "")
    return (f"rank {r} was found {u['why']}{pid} {where} {d['op']} on {name!r} by rank {u['by']}'s watchdog{when}: "
            f"it could not take part -- the cause")


def _mismatch(kind: str, keyed: Dict[int, Any], texts: Dict[int, str]) -> Dict[str, Any]:
    """The mismatch record of ``kind``: the variants (largest first) and, when one value has a strict majority
    of the ranks, the others as culprits."""
    counts = Counter(keyed.values())
    majority, n_major = counts.most_common(1)[0]
    tie = sum(1 for c in counts.values() if c == n_major) > 1
    variants: Dict[Any, List[int]] = defaultdict(list)
    for r, k in keyed.items():
        variants[k].append(r)
    return {
        "kind": kind,
        "variants": [{"ranks": sorted(rs), "value": texts[rs[0]]} for k, rs in
                     sorted(variants.items(), key=lambda kv: (-len(kv[1]), kv[1]))],
        "culprits": [] if tie else sorted(r for r, k in keyed.items() if k != majority),
    }


# The host library's text for a mismatched collective: "... rank A called Op(count=.., datatype=.., op=..) but
# rank B called Op(...)" (ranks are the communicator's own).
_CALLS_RE = re.compile(r"rank (\d+) called (\w+)\(([^)]*)\) but rank (\d+) called (\w+)\(([^)]*)\)")
_AT_RE = re.compile(r"collective mismatch at collective #(\d+)")


# The host library's text where a rank waits for a peer that went past the collective without doing its part for it
# (the peer called another operation or other arguments there: arguments that differ can send ranks down different
# paths, a small broadcast's over the eager lane and a larger one's steps): "... rank A called Op(...) but rank B went
# past it (...)" (ranks are the communicator's own).
_PASSED_RE = re.compile(r"rank (\d+) called (\w+\([^)]*\)) but rank (\d+) went past it")


def _went_past(got: Dict[int, Dict[str, Any]], members: List[int]) -> Optional[Dict[str, Any]]:
    """The mismatch record (kind ``"call"``) of the library's "went past it" errors among the entries ``got`` (global
    rank -> entry), None without one: each rank that waited, with what it called. Its culprits: those ranks, where
    they are fewer than the others with a dump and every other one completed the operation."""
    found: Dict[int, Tuple[str, int]] = {}  # global rank that waited -> (its call, the global rank that went past)
    for e in got.values():
        m = _PASSED_RE.search(str(e.get("pycoll_error") or ""))
        if m is None:
            continue
        a, b = int(m.group(1)), int(m.group(3))
        if 0 <= a < len(members) and 0 <= b < len(members):
            found.setdefault(members[a], (m.group(2), members[b]))
    if not found:
        return None
    others = [r for r in got if r not in found]
    done = bool(others) and len(found) < len(others) and all(got[r].get("state") == "completed" for r in others)
    return {"kind": "call",
            "variants": [{"ranks": [a], "value": f"called {call}; rank {b} went past it without doing its part for "
                                                 f"rank {a} (it called another operation or other arguments there)"}
                         for a, (call, b) in sorted(found.items())],
            "culprits": sorted(found) if done else []}


def _parse_call(args: str) -> Dict[str, str]:
    out = {}
    for part in args.split(","):
        key, sep, value = part.strip().partition("=")
        if sep and key in ("count", "datatype", "op", "root"):
            out[key] = value.strip()
    return out


def _root_text(root: Any, members: List[int]) -> str:
    """A root as the mismatch lines give it: a rank of its communicator, with its job-wide rank where that differs
    (the lines are labelled with job-wide ranks)."""
    try:
        g = members[int(root)] if 0 <= int(root) < len(members) else None
    except (TypeError, ValueError):
        g = None
    return f"root={root}" + (f" (global {g})" if g is not None and g != int(root) else "")


def _mismatch_at(e: Dict[str, Any]) -> Optional[int]:
    """The collective number the library's mismatch text in entry ``e``'s error names, or None."""
    m = _AT_RE.search(str(e.get("pycoll_error") or ""))
    return int(m.group(1)) if m else None


def _failed_with_a_later_one(s: int, present: List[int], coll: Dict[int, Dict[int, Dict[str, Any]]]) -> bool:
    """Whether collective #``s`` failed, on every rank with a dump that entered it, with the library's mismatch of
    one later collective (a group's operations fail together: its first one carries the text of the one that
    differs)."""
    at = {_mismatch_at(coll[r][s]) for r in present if s in coll[r]}
    n = at.pop() if len(at) == 1 else None
    return n is not None and n > s and all(n in coll[r] for r in present)


# a group's timeout names the operations that complete with the one it gave up: "... it completes with its group:
# all_reduce #2, all_reduce #3, send #1 with peer 1" (its collectives' numbers are the communicator's)
_GROUP_RE = re.compile(r"it completes with its group: ([^;]*)")
_GROUP_COLL_RE = re.compile(r"\b(\w+) #(\d+)\b(?! with)")  # \b: "send #15 with" is not "#1"


def _group_of(e: Dict[str, Any]) -> List[int]:
    """The collective numbers of the group whose operations complete with entry ``e``'s (they share its end event,
    ARCHITECTURE.md), as the timeout in its error names them; [] where it names none (not grouped, or not failed
    by a timeout: the dump keeps no other trace of a group)."""
    m = _GROUP_RE.search(str(e.get("pycoll_error") or ""))
    return sorted(int(n) for _, n in _GROUP_COLL_RE.findall(m.group(1))) if m else []


def _waits_for_its_group(div: Dict[str, Any], coll: Dict[int, Dict[int, Dict[str, Any]]]) -> bool:
    """Whether divergence ``div`` (of collective #s) is only that of a later collective of a group: every rank with a
    dump entered #s alike, and a rank where it did not complete has it in a group (:func:`_group_of`) with a later
    collective it issued. The group's operations complete (or fail) together, so #s waits for that one -- which
    another rank may never have issued (it grouped fewer): the divergence is there, where the analysis goes on. Not
    where #s never ran on a rank (its group dropped there): that is the divergence."""
    if div["never_entered"] or div["skipped"] or div["mismatch"] or not div["in_flight"]:
        return False
    s = div["seq"]
    if any(never_ran(coll[r][s]) for r in div["in_flight"]):
        return False
    return any(any(t > s and t in coll[r] for t in info["group"]) for r, info in div["in_flight"].items())


def _library_calls(got: Dict[int, Dict[str, Any]], members: List[int], local_of: Dict[int, int]
                   ) -> Dict[int, Dict[str, str]]:
    """Global rank -> the call the library saw it make (count, datatype, op, root), from the entries' errors (those
    naming this collective: a group's other operations carry the text too)."""
    calls: Dict[int, Dict[str, str]] = {}
    told: Dict[int, Dict[str, str]] = {}  # what a rank's peer said it called, for ranks that did not say so
    for r, e in got.items():
        m = _CALLS_RE.search(str(e.get("pycoll_error") or ""))
        if m is None:
            continue
        at = _mismatch_at(e)
        if at is not None and at != e.get("collective_seq_id"):
            continue
        for local_s, args in ((m.group(1), m.group(3)), (m.group(4), m.group(6))):
            local = int(local_s)
            if not 0 <= local < len(members):
                continue
            g = members[local]
            (calls if local == local_of.get(r) else told).setdefault(g, _parse_call(args))
    for g, c in told.items():
        calls.setdefault(g, c)
    return calls


def _variant_text(kind: str, e: Dict[str, Any]) -> str:
    if kind == "type":
        return _op_of(e)
    if kind == "dtype":
        return f"in {list(e.get('input_dtypes') or [])} out {list(e.get('output_dtypes') or [])}"
    return f"in {_sizes(e.get('input_sizes'))} out {_sizes(e.get('output_sizes'))}"


_P2P_RE = re.compile(r"(sendrecv|send|recv) (\d+)(<->|->|<-)(\d+)")


def _side(x: Optional[Dict[str, Any]], rank: int) -> Optional[Dict[str, Any]]:
    """One side of a transfer, as an issue names it: the rank, its entry's record and p2p ids, where it was issued."""
    if x is None:
        return None
    return {"rank": rank, "record_id": x.get("record_id"), "p2p_seq": x.get("p2p_seq_id"), "site": _site(x),
            "state": x.get("state")}


def _p2p_history_start(dump: Dict[str, Any], uid: str, held: List[Dict[str, Any]]) -> int:
    """The p2p number of the first send or receive on communicator ``uid`` that a rank's dump holds (``held``, in
    order): 1 where its ring still holds them all; past the last it issued (its progress counters) where it holds
    none of them."""
    if held:
        return min(int(e.get("p2p_seq_id") or 0) for e in held)
    progress = ((((dump.get("pycoll") or {}).get("comms") or {}).get(uid) or {}).get("progress") or {})
    return int(progress.get("p2p_enqueued") or 0) + 1


def _cut_pair_issue(src: int, dst: int, ss: List[Dict[str, Any]], rr: List[Dict[str, Any]], stack_limit: int
                    ) -> Optional[Dict[str, Any]]:
    """The issue of transfers ``src`` -> ``dst`` (its sends ``ss``, its receives ``rr``) where a ring cut either side's
    history: the two rings hold different stretches, and a small send completes before its receive exists (the eager
    lane), so neither their order nor their completion pairs them -- a pairing gave a dtype mismatch as "no matching
    send", and a receiver that was merely slow as a size mismatch. Only what did not complete is said, without its
    partner: the first operation of either side still outstanding (the receive first), with its error; None where
    both sides completed what they hold."""
    for side, xs, rank, other in (("recv", rr, dst, src), ("send", ss, src, dst)):
        x = next((x for x in xs if _outstanding(x)), None)
        if x is None:
            continue
        partner = "send" if side == "recv" else "recv"
        detail = f"{side} {x.get('state')}"
        issue = (f"{side} (p2p #{x.get('p2p_seq_id')}) on rank {rank} {'from' if side == 'recv' else 'to'} rank "
                 f"{other} not completed ({detail}); a flight-recorder ring cut the history of these transfers, so "
                 f"its {partner} on rank {other} is not identified")
        if x.get("pycoll_error"):
            detail = f"the {side} failed with {str(x['pycoll_error'])[:300]}"
            issue += f": {detail}"
        return {"src": src, "dst": dst, "index": 0, "issue": issue, "kind": "incomplete", "detail": detail,
                "send": _side(x, src) if side == "send" else None, "recv": _side(x, dst) if side == "recv" else None,
                "site": _site(x), "stack": _stack(x, stack_limit)}
    return None


def _check_p2p(members: List[int], present: List[int], p2p: Dict[int, List[Dict[str, Any]]],
               stack_limit: int, cut: Optional[Dict[int, int]] = None) -> List[Dict[str, Any]]:
    """Pair the k-th send src->dst with the k-th recv at dst from src (a sendrecv a<->b is a send a->b and a recv at
    a from b); report the first problem per pair. Operations that never ran (their group dropped: nothing was
    transferred) pair with nothing. Where either rank's history is ``cut`` (rank -> the p2p number its dump starts at,
    :func:`_p2p_history_start`), nothing is paired: :func:`_cut_pair_issue` says what did not complete.

    An issue's ``kind``: ``no_recv`` (a send with no matching recv), ``no_send``, ``mismatch`` (sizes or dtypes;
    ``detail`` says how), ``incomplete`` (matched, not completed); ``send`` and ``recv`` are its two sides
    (:func:`_side`, None where there is none)."""
    sends: Dict[Tuple[int, int], List[Dict[str, Any]]] = defaultdict(list)
    recvs: Dict[Tuple[int, int], List[Dict[str, Any]]] = defaultdict(list)
    for rank in present:
        for e in p2p[rank]:
            m = _P2P_RE.search(str(e.get("profiling_name", "")))
            if not m or int(m.group(2)) >= len(members) or int(m.group(4)) >= len(members) or never_ran(e):
                continue
            kind, a, b = m.group(1), members[int(m.group(2))], members[int(m.group(4))]
            if kind != "recv":
                sends[(a, b)].append(e)
            if kind != "send":
                recvs[(b, a)].append(e)
    out = []
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        ss, rr = sends.get(pair, []), recvs.get(pair, [])
        if src in (cut or {}) or dst in (cut or {}):
            cut_issue = _cut_pair_issue(src, dst, ss, rr, stack_limit)
            if cut_issue is not None:
                out.append(cut_issue)
            continue
        for k in range(max(len(ss), len(rr))):
            s = ss[k] if k < len(ss) else None
            r = rr[k] if k < len(rr) else None
            issue = kind = detail = None
            if s is None and dst in present and src in present:
                kind = "no_send"
                issue = f"recv #{k + 1} on rank {dst} from rank {src} has no matching send on rank {src}"
            elif r is None and src in present and dst in present:
                kind = "no_recv"
                issue = f"send #{k + 1} from rank {src} to rank {dst} has no matching recv on rank {dst}"
            elif s is not None and r is not None and (  # element counts, as the library matches them (not shapes)
                    _numel(_sizes(s.get("input_sizes"))) != _numel(_sizes(r.get("output_sizes")))
                    or list(s.get("input_dtypes") or []) != list(r.get("output_dtypes") or [])):
                kind = "mismatch"
                detail = (f"send of {_sizes(s.get('input_sizes'))} {s.get('input_dtypes')} "
                          f"vs recv of {_sizes(r.get('output_sizes'))} {r.get('output_dtypes')}")
                issue = f"send #{k + 1} {src}->{dst} of {detail[len('send of '):]}"
            elif any(x is not None and _outstanding(x) for x in (s, r)):
                def state(x: Optional[Dict[str, Any]], rank: int) -> str:
                    return str(x.get("state")) if x is not None else f"unknown: no dump from rank {rank}"

                kind = "incomplete"
                detail = f"send {state(s, src)}, recv {state(r, dst)}"
                issue = f"transfer #{k + 1} {src}->{dst} not completed ({detail})"
                # what the library said where it failed (a size mismatch, a dead peer): the transfer's cause
                failed = [(side, x) for side, x in (("send", s), ("recv", r))
                          if x is not None and x.get("pycoll_error")]
                if failed:
                    side, x = failed[0]
                    detail = f"the {side} failed with {str(x['pycoll_error'])[:300]}"
                    issue += f": {detail}"
            if issue:
                # where it was issued: the side still in flight, else the side there is
                bad = next((x for x in (s, r) if x is not None and _outstanding(x)), s or r)
                out.append({"src": src, "dst": dst, "index": k + 1, "issue": issue, "kind": kind, "detail": detail,
                            "send": _side(s, src), "recv": _side(r, dst),
                            "site": _site(bad) if bad else "", "stack": _stack(bad, stack_limit) if bad else []})
                break
    return out


def _blocked_in(dump: Dict[str, Any], uid: str, members: List[int], issues: List[Dict[str, Any]],
                rank: int) -> Optional[Dict[str, Any]]:
    """What holds ``rank`` (of communicator ``uid``, whose ``members`` are given), by its ``dump``: its newest
    operation when that did not complete and is a send or receive on ``uid`` (``why`` it cannot complete, from
    the point-to-point ``issues``) or any operation on another communicator (``comm``, its name and members).
    None when its newest operation completed or was captured in a graph (it is elsewhere in its own code) or is
    none of these."""
    es = [e for e in dump.get("entries") or [] if _op_of(e) != "coalesced"]
    e = max(es, key=lambda e: e.get("record_id", 0), default=None)
    if e is None or not _outstanding(e):
        return None
    pg = e.get("process_group") or [None]
    group = (pg[0], pg[1] if len(pg) > 1 else "")
    out = {"uid": group[0], "comm": group[1], "members": members, "here": group[0] == uid, "op": "",
           "state": e.get("state"), "site": _site(e), "why": "",
           "failed": _error_type(e.get("pycoll_error"))}
    if out["here"]:
        if _peer(e, members) is None:
            return None
        mine = [i for i in issues if any(i[side] is not None and i[side]["rank"] == rank
                                         and i[side]["record_id"] == e.get("record_id") for side in ("send", "recv"))]
        out["why"] = _p2p_why(mine[0], issues) if mine else ""
    else:
        cfg = (dump.get("pg_config") or {}).get(group[0]) or {}
        out["members"] = _parse_members(cfg.get("ranks")) or []
    out["op"] = _describe(e, out["members"])
    return out


def _held(b: Dict[str, Any]) -> str:
    """``'it is in 'pair' (ranks 2-3) all_reduce #2 [..] issued at x.py:3 in f, still in flight (state started)'``
    for :func:`_blocked_in`'s record ``b``."""
    where = "" if b["here"] else f"{b['comm']!r} (ranks {_fmt_ranks(b['members'])}) "
    site = f" issued at {b['site']}" if b["site"] else ""
    if b["why"]:
        return f"it is stuck in {where}{b['op']}{site} (state {b['state']}): {b['why']}"
    if b.get("failed"):
        return f"it failed in {where}{b['op']}{site} ({b['failed']}; state {b['state']})"
    return f"it is in {where}{b['op']}{site}, still in flight (state {b['state']})"


def _p2p_ref(op: Dict[str, Any]) -> str:
    """A send's or receive's number, and where it was issued when known."""
    return f"p2p #{op['p2p_seq']}" + (f", issued at {op['site']}" if op["site"] else "")


def _p2p_why(i: Dict[str, Any], issues: List[Dict[str, Any]]) -> str:
    """Why the transfer of issue ``i`` is stuck, with the send or receive that a wrong peer may have gone to."""
    src, dst = i["src"], i["dst"]
    if i["kind"] == "no_recv":
        why = f"rank {dst} posted no matching recv"
        astray = [j for j in issues if j["kind"] == "no_send" and j["src"] == src and j["dst"] != dst]
        if astray:
            j = astray[0]
            why += (f"; rank {j['dst']} waits for a recv from rank {src} ({_p2p_ref(j['recv'])}) that no send "
                    "matches: a wrong peer?")
        elsewhere = [j for j in issues if j["kind"] == "no_send" and j["dst"] == dst and j["src"] != src]
        if elsewhere and not astray:  # the receiver named another sender
            j = elsewhere[0]
            why += (f"; it receives from rank {j['src']} instead ({_p2p_ref(j['recv'])}), which sent it nothing: a "
                    "wrong peer?")
        return why
    if i["kind"] == "no_send":
        why = f"rank {src} posted no matching send"
        astray = [j for j in issues if j["kind"] == "no_recv" and j["dst"] == dst and j["src"] != src]
        if astray:
            j = astray[0]
            why += f"; rank {j['src']} sent to rank {dst} ({_p2p_ref(j['send'])}) but no recv matches it: a wrong peer?"
        elsewhere = [j for j in issues if j["kind"] == "no_recv" and j["src"] == src and j["dst"] != dst]
        if elsewhere and not astray:  # the sender sent to another rank
            j = elsewhere[0]
            why += (f"; it sent to rank {j['dst']} instead ({_p2p_ref(j['send'])}), which received nothing: a wrong "
                    "peer?")
        return why
    if i["kind"] == "mismatch":
        return (f"size or dtype mismatch between rank {src}'s send ({_p2p_ref(i['send'])}) and rank {dst}'s recv "
                f"({_p2p_ref(i['recv'])}): {i['detail']}")
    return f"transfer {src}->{dst} not completed: {i['detail']}"


def analyze(dumps: Dict[int, Dict[str, Any]], *, stack_limit: int = 8,
            stacks: Optional[Dict[int, Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Analyse one generation's dumps (``{global rank: dump}``); returns a JSON-ready report.

    Ranks are global throughout. Each of ``communicators`` carries its ``verdict`` (the text ``pycoll-fr``
    prints) and ``culprits`` (:func:`_culprits`), besides the facts they come from (``first_divergence``,
    ``p2p``, ``failures``, ``missing_dumps``, ...); ``ok`` is False when any communicator shows a problem.
    ``notes`` says what the analysis assumed where the dumps do not say (torch's gloo dumps: the groups' members),
    which is no problem. ``stacks``: the stacks the processes wrote on the dump signal (:func:`find_stacks`), which
    the verdict on a late rank names where they are its process's.
    """
    problems: List[str] = []
    versions = {str(d.get("version")) for d in dumps.values()}
    if len(versions) > 1:
        problems.append(f"dumps disagree on the schema version: {sorted(versions)}")
    notes: List[str] = []
    if any(d.get("pycoll_torch_gloo") for d in dumps.values()):
        notes.append("torch's gloo dumps say that an operation ended, not how: one that failed (a peer gone) counts "
                     "as completed")
    dumps = _with_members(dumps, notes)
    groups = _groups(dumps, problems)
    _apart(dumps, problems)
    report: Dict[str, Any] = {"ranks": sorted(dumps), "versions": sorted(versions), "problems": problems,
                              "notes": notes, "communicators": [], "triggers": {}}
    for r, d in sorted(dumps.items()):
        pyc = d.get("pycoll") or {}
        if pyc:
            earlier = pyc.get("earlier_dumps") or []
            report["triggers"][r] = _trigger(pyc) + (
                f" (replacing its dump{'s' if len(earlier) > 1 else ''} of {'; '.join(map(_trigger, earlier))})"
                if earlier else "")
    for _uid, g in sorted(groups.items(), key=lambda kv: (kv[1]["name"], kv[0])):
        c = _analyze_group(g, dumps, stack_limit, stacks)
        c["verdict"] = _verdict(c)
        c["culprits"] = _culprits(c)
        # its first_divergence is only where its ranks were at the dumps (a bystander that did not fail)
        c["not_a_divergence"] = bool(c["first_divergence"] is not None and c.get("bystander") and not _troubled(c))
        report["communicators"].append(c)
    report["ok"] = not problems and not any(_troubled(c) for c in report["communicators"])
    return report


_STACKS_HEAD = re.compile(r"^pycoll rank (\d+) pid (\d+) host (\S+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)')


def find_stacks(path: str) -> Dict[int, Dict[str, Any]]:
    """rank -> {"path", "site", "pid"} for the stacks faulthandler wrote on the dump signal (``<dump dir>/stacks``,
    next to ``path`` or above it); ``site`` is where the main thread was, the last time; ``pid``, the process's."""
    out: Dict[int, Dict[str, Any]] = {}
    for folder in (os.path.join(path, "stacks"), os.path.join(os.path.dirname(os.path.normpath(path)), "stacks")):
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            full = os.path.join(folder, name)
            try:
                with open(full, errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            m = _STACKS_HEAD.match(lines[0]) if lines else None
            if m is None:
                continue
            blocks: List[List[Tuple[str, str, str]]] = []
            for line in lines[1:]:
                head = _STACKS_HEAD.match(line)
                if head is not None:  # the rank became known after the first line (see DumpSignal.retitle)
                    m = head
                    continue
                if line.startswith(("Thread ", "Current thread ")):
                    blocks.append([])
                fm = _FH_FRAME.match(line)
                if fm and blocks:
                    blocks[-1].append((fm.group(1), fm.group(2), fm.group(3)))
            main = [b for b in blocks if b and b[-1][2] == "<module>"]
            site = _user_site(main[-1]) if main else ""
            if blocks:
                out[int(m.group(1))] = {"path": full, "site": site, "pid": int(m.group(2))}
        break
    return out


def analyze_dir(path: str, *, prefix: Optional[str] = None, stack_limit: int = 8) -> List[Dict[str, Any]]:
    """Analyse every generation under ``path``; one report per generation (with its folder)."""
    out = []
    stacks = find_stacks(path)
    for gen, folder in find_generations(path):
        dumps, problems = load_generation(folder, prefix)
        rep: Dict[str, Any] = analyze(dumps, stack_limit=stack_limit, stacks=stacks) if dumps else {
            "ranks": [], "versions": [], "problems": [], "notes": [], "communicators": [], "triggers": {},
            "ok": False}
        rep["problems"] = problems + rep["problems"]
        if not dumps:
            rep["problems"].append("no dumps found")
        rep["generation"] = gen
        rep["folder"] = folder
        rep["stacks"] = {r: v for r, v in stacks.items() if r not in dumps}
        out.append(rep)
    return out


# -- text ------------------------------------------------------------------------------------------


def format_report(reports: List[Dict[str, Any]], *, stacks: bool = True) -> str:
    """The human-readable form of :func:`analyze_dir`'s reports."""
    lines: List[str] = []
    for rep in reports:
        gen = "" if rep.get("generation") is None else f" (generation {rep['generation']})"
        lines.append(f"== {rep['folder']}{gen}: dumps from ranks {_fmt_ranks(rep['ranks'])}"
                     + (f", schema {', '.join(rep['versions'])}" if rep["versions"] else ""))
        for p in rep["problems"]:
            lines.append(f"  ! {p}")
        for n in rep.get("notes") or ():
            lines.append(f"  note: {n}")
        for c in rep["communicators"]:
            lines.append(f"communicator {c['name']!r} (uid {c['uid']}, {len(c['members'])} ranks: "
                         f"{_fmt_ranks(c['members'])})")
            if c["missing_dumps"]:
                lines.append(f"  missing dumps: ranks {_fmt_ranks(c['missing_dumps'])}")
            for r, st in sorted((c.get("stale_dumps") or {}).items()):
                lines.append(f"  rank {r}: its dump predates what the others did ({st['why']}): what it did after #"
                             f"{st['through']} its dump does not show")
            for p in c["problems"]:
                lines.append(f"  ! {p}")
            if c["matched_through"] is not None:
                lines.append(f"  ops up to #{c['matched_through']} match and completed on every rank with a dump"
                             + (" (or were captured in a graph)" if any(
                                 i["seq"] and i["seq"] <= c["matched_through"] for i in c.get("captured") or [])
                                else ""))
                for r, u in sorted((c.get("unshown") or {}).items()):
                    lines.append(f"    rank {r} ({_unshown_label(u)}): {_unshown_text(u)}")
            for g in c.get("in_groups") or []:
                alike: Dict[Tuple[int, ...], List[int]] = defaultdict(list)
                for r, seqs in sorted(g["ranks"].items()):
                    alike[tuple(seqs)].append(r)
                lines.append(f"  {g['op']}: " + (f"completed on {_who(g['completed'])}; " if g["completed"] else "")
                             + "; ".join(f"{_who(rs)} in a group of #{', #'.join(map(str, seqs))}, which completes "
                                         "as one" for seqs, rs in alike.items()))
            if c.get("dropped"):
                lines.append("  never ran on any rank with a dump, its group() dropped on each (not a divergence): "
                             + _listed(c["dropped"]))
            if c.get("captured"):
                lines.append("  captured in a CUDA graph, not in flight (each runs at the graph's replays, which "
                             f"watch_stream puts a deadline on): {_captured_text(c)}")
            d = c["first_divergence"]
            if d is None:
                if c.get("unrecorded"):
                    lines.append("  no operation recorded (recording off)" if c.get("recording_off") else
                                 "  no operation recorded: none was issued on it (or all were overwritten)")
                elif c["matched_through"] is not None or not c["p2p"]:
                    lines.append("  no divergence among the collectives")
            elif c.get("bystander") and not _troubled(c):
                lines.append(f"  at the dumps (not a divergence: this communicator did not fail), {d['op']}:")
                where = [f"{_who(d['never_entered'])}: not entered yet"] if d["never_entered"] else []
                for state in sorted({info["state"] for info in d["in_flight"].values()}):
                    where.append(f"{_who(r for r, i in d['in_flight'].items() if i['state'] == state)}: in flight "
                                 f"(state {state})")
                if d["completed"]:
                    where.append(f"{_who(d['completed'])}: completed")
                lines.append("    " + "; ".join(where))
            else:
                lines.append(f"  FIRST DIVERGENCE at {d['op']}:")
                for r, info in sorted(d["never_entered"].items()):
                    last = (f"last op {info['last_op']} {info['last_state']}"
                            + (f", issued at {info['last_site']}" if info["last_site"] else "")
                            if info["last_op"] else _nothing_recorded(info.get("issued", 0)))
                    held = info.get("blocked_in")
                    if held and held["here"]:  # its last operation, named just before
                        held_text = f"; held there: {held['why']}" if held["why"] else ""
                    else:
                        held_text = f"; {_held(held)}" if held else ""
                    if info.get("revoked"):
                        held_text += "; the recovery revoked it first (a reshape another member began)"
                    ny = (d.get("not_yet") or {}).get(r)
                    if ny:
                        held_text += (f"; not yet when rank {ny['by']} gave it up {ny['elapsed_s']:.2f} s into its "
                                      f"{ny['timeout_s']:g} s timeout (slow, not stuck)")
                    if r in c.get("main_thread", {}):
                        held_text += f"; when it dumped, its main thread was at {c['main_thread'][r]}"
                    elif r in c.get("earlier_main_thread", {}):
                        held_text += f"; its main thread was at {c['earlier_main_thread'][r]}"
                    lines.append(f"    rank {r}: never entered it ({last}){held_text}")
                if d["skipped"]:
                    lines.append(f"    {_who(d['skipped'])}: later operations recorded but not this one")
                m = d["mismatch"]
                if m:
                    what = _MISMATCH_NAMES.get(m["kind"], m["kind"])
                    lines.append(f"    {what.upper()} MISMATCH:"
                                 + (f" culprit {_who(m['culprits'])}" if m["culprits"] else " no majority"))
                    for v in m["variants"]:
                        lines.append(f"      {_who(v['ranks'])}: {v['value']}")
                if d["completed"]:
                    lines.append(f"    completed on {_who(d['completed'])}")
                if d.get("captured"):
                    lines.append(f"    captured in a graph on {_who(d['captured'])} (it runs there when the graph "
                                 "is replayed)")
                same: Dict[Tuple[Any, ...], List[int]] = defaultdict(list)
                for r, info in sorted(d["in_flight"].items()):
                    failed = _error_type(info.get("error"))
                    same[(info["state"], info["site"], tuple(info["stack"]), failed)].append(r)
                for (state, site, stack, failed), rs in same.items():
                    who = _who(rs)
                    lines.append(f"    {who}: " + (f"failed in it ({failed}; state {state})" if failed
                                                   else f"still in flight (state {state})")
                                 + (f", issued at {site}" if site else ""))
                    if stacks:
                        for fr in stack:
                            lines.append(f"        {fr}")
                for r, u in sorted((d.get("found_unable") or {}).items()):
                    pid = f" (pid {u['pid']})" if u.get("pid") is not None else ""
                    at = f" in {u['op']} #{u['seq']}" if u["op"] is not None else ""
                    lines.append(f"    rank {r}: found {u['why']}{pid} by rank {u['by']}'s watchdog (its liveness "
                                 f"check){at}")
                for r, text in sorted(_undumped(d).items()):
                    lines.append(f"    rank {r}: {text}")
                    st = rep.get("stacks", {}).get(r)
                    if st:
                        lines.append(f"    rank {r}: its Python stacks, written from C on the dump signal: {st['path']}"
                                     + (f" (main thread at {st['site']})" if st["site"] else ""))
            for p in c["p2p"]:
                lines.append(f"  P2P: {p['issue']}" + (f" (issued at {p['site']})" if p["site"] else ""))
            for f in c["failures"]:
                if f.get("op"):
                    what = f"{f['error_type']} in {f['op']} #{f['seq']}" + (
                        f" after {f['elapsed_s']:.2f} s" if isinstance(f.get("elapsed_s"), (int, float)) else "")
                else:
                    what = f"{f['error_type']}: {f['message']}"
                what += _claims(f, c)
                lines.append(f"  watchdog on rank {f['rank']}: {what}")
            lines.append(f"  verdict: {c['verdict'] if 'verdict' in c else _verdict(c)}")
        if rep["triggers"]:
            lines.append("dumps were triggered by:")
            for r, t in sorted(rep["triggers"].items()):
                lines.append(f"  rank {r}: {t}")
        lines.append("")
    return "\n".join(lines)


def _claims(f: Dict[str, Any], c: Dict[str, Any]) -> str:
    """What a failing rank's watchdog said of the others, each with its basis: a rank's own dump wins
    over what was read of it in the store; a store report is given with its age."""
    own = c.get("own_dump", {})
    out = []
    # a send's or receive's watchdog lists its peers there, behind or not (the line's "peer:"), by their p2p numbers
    p2p = bool(f.get("is_p2p"))
    for key, label in (("behind", "its peers" if p2p else "it saw behind"), ("unconfirmed", "not confirmed")):
        items = []
        for r, v in sorted((f.get(key) or {}).items(), key=lambda kv: int(kv[0])):
            last = v.get("last_issued") if isinstance(v, dict) else v
            last = f"p2p #{last}" if p2p else f"#{last}"
            age = v.get("report_age_s") if isinstance(v, dict) else None
            rank = int(r)
            if rank in own and rank not in (c.get("stale_dumps") or {}):
                items.append(f"rank {rank} (its own dump: {own[rank]})")
            elif isinstance(v, dict) and v.get("answered"):
                items.append(f"rank {rank} (answered: {last})")
            elif isinstance(age, (int, float)):
                gone = " (its process is gone)" if str(rank) in (f.get("gone") or {}) else ""
                items.append(f"rank {rank} (report {age:.1f} s old said {last}){gone}")
            else:
                items.append(f"rank {rank} (last reported {last})")
        if items:
            out.append(f"; {label}: " + ", ".join(items))
    unable = []  # whom its liveness check found unable to take part: its failure's cause
    for r, v in sorted((f.get("unable") or {}).items(), key=lambda kv: int(kv[0])):
        if isinstance(v, dict):
            pid = "" if v.get("pid") is None else f"pid {v['pid']}, "
            unable.append(f"rank {r} ({pid}{v.get('why') or 'unable to take part'})")
    if unable:
        out.append("; it found unable to take part: " + ", ".join(unable))
    return "".join(out)


_MISMATCH_NAMES = {"type": "operation type", "size": "size", "dtype": "dtype", "op": "reduction op",
                   "root": "root", "count": "count", "datatype": "datatype", "call": "collective call"}


def _late(c: Dict[str, Any], d: Dict[str, Any]) -> Tuple[Dict[int, float], Optional[Dict[str, Any]]]:
    """The ranks that entered the divergence's collective only after another rank's watchdog had given it up at its
    timeout, with how many seconds after it, and the first such timeout report: they were late, not stuck in it --
    their entry failed on the aborted communicator, which reads as every rank having entered it. Only where every
    rank with a dump entered it and none completed it."""
    if d["never_entered"] or d["completed"] or c["missing_dumps"] or d.get("stale_dumps"):
        return {}, None
    # a group's timeout is reported at its last operation, after the divergence's
    gave_up = [f for f in c["failures"] if f.get("error_type") == "CommTimeout" and isinstance(f.get("seq"), int)
               and f["seq"] >= d["seq"] and isinstance(f.get("time"), (int, float))]
    if not gave_up:
        return {}, None
    first = min(gave_up, key=lambda f: f["time"])
    timed_out = {f["rank"] for f in gave_up}  # in it, as their own timeouts say
    hosts = c.get("hosts") or {}
    # only ranks on the timed-out rank's host, whose entry failed on the communicator the timeout ended (a peer's abort
    # or revoke; not its own wait in a live one: under on_failure="report" nothing was ended). One host has one clock
    # (the entries' times and the report's are both its wall clock), so any entry after the report is after it: no
    # margin for clocks that differ, which would hide a rank entering a tenth of a second late. Across hosts the
    # dumps' times are raw, and nothing is said
    late = {r: info["enqueued_ns"] / 1e9 - first["time"] for r, info in d["in_flight"].items()
            if r not in timed_out and isinstance(info.get("enqueued_ns"), int)
            and info["enqueued_ns"] / 1e9 > first["time"]
            and hosts.get(r) and hosts.get(r) == hosts.get(first["rank"])
            and str(info.get("error") or "").startswith(("RemoteError", "CommAborted", "CommRevoked"))}
    return late, first


def _seconds(t: float) -> str:
    """A short time as a verdict says it: ``1.2 s``, ``0.05 s`` (no "0.0 s", which reads as "at once")."""
    return f"{t:.1f} s" if t >= 0.95 else f"{t:.2g} s"


def _late_text(c: Dict[str, Any], d: Dict[str, Any]) -> str:
    """The verdict on the ranks :func:`_late` finds, or "" where it finds none."""
    late, first = _late(c, d)
    if not late or first is None:
        return ""
    one = len(late) == 1
    sites = "; ".join(_late_site(c, r) for r in sorted(late)
                      if r in c.get("earlier_main_thread", {}) or r in (c.get("signal_stacks") or {}))
    return (f"rank{'' if one else 's'} {_fmt_ranks(list(late))} entered {d['op']} on {c['name']!r} only "
            f"{_seconds(max(late.values()))} after rank {first['rank']} gave it up at its timeout: late, not stuck in "
            f"it (not the transport) -- look at what {'that rank' if one else 'those ranks'} did before it"
            + (f" ({sites})" if sites else ""))


def _late_site(c: Dict[str, Any], r: int) -> str:
    """Where late rank ``r``'s main thread was: by the stacks its process wrote from C on the dump signal, where it
    left them (the moment the signal came; a C call holding the GIL shows there, while its Python handler's dump
    ran only once the call returned), then by its earlier dump."""
    st = (c.get("signal_stacks") or {}).get(r)
    earlier = c.get("earlier_main_thread", {}).get(r)
    if st is None:
        return f"rank {r}'s main thread was at {earlier}"
    return (f"rank {r}'s main thread was at {st['site']} when the dump signal came (its stacks, written from C: "
            f"{st['path']})" + (f"; at {earlier}" if earlier else ""))


def _verdict(c: Dict[str, Any]) -> str:
    d = c["first_divergence"]
    name = c["name"]
    if c.get("bystander") and d is not None and not _troubled(c):
        return (f"no failure of {name!r} (uid {c['uid']}) was recorded: its ranks were dumped for another "
                f"communicator's failure, at different moments while it ran, so what is in flight on some and done "
                f"on others is no divergence")
    unshown = c.get("unshown") or {}
    if d is None:
        first = _first_p2p(c)
        if first:
            return f"point-to-point problem on {name!r}: {first['issue']}"
        if c["missing_dumps"]:
            return (f"no divergence among the dumps present; ranks {_fmt_ranks(c['missing_dumps'])} left no dump"
                    + "".join(f"; rank {r} {_unshown_text(u, short=True)}" for r, u in sorted(unshown.items())))
        if c["failures"] and c.get("unrecorded"):
            why = ("recording was off: PYCOLL_FR_BUFFER_SIZE=0" if c.get("recording_off")
                   else "none recorded: none issued, or all overwritten")
            return (f"{name!r} failed on {_who(sorted({f['rank'] for f in c['failures']}))}, but no dump holds its "
                    f"operations ({why}): what the watchdog said above is all there is to go on")
        return f"no problem found on {name!r}"
    overtaken = _overtaken(c)
    # the ranks a failing rank's liveness check found unable to take part (stopped, exited, silent) come first: the
    # cause; a rank that merely had not entered it yet, far within its timeout, is none
    found = d.get("found_unable") or {}
    not_yet = {r: v for r, v in (d.get("not_yet") or {}).items() if r not in overtaken}
    out = [_unable_text(r, u, d, name) for r, u in sorted(found.items())]
    # ranks whose state in it no dump gives: none, or one that predates it
    unknown = bool(c["missing_dumps"] or d.get("stale_dumps"))
    held = {r: info["blocked_in"] for r, info in d["never_entered"].items()
            if info.get("blocked_in") and r not in overtaken and r not in found}
    behind = sorted(r for r in d["never_entered"]
                    if r not in held and r not in overtaken and r not in found and r not in not_yet)
    if behind:
        out.append(f"rank{'s' if len(behind) > 1 else ''} {_fmt_ranks(behind)} never entered {d['op']} on {name!r}")
    for r, b in sorted(held.items()):
        out.append(f"rank {r} never entered {d['op']} on {name!r}: {_held(b)}")
    if not_yet:
        first = next(iter(not_yet.values()))
        out.append(f"rank{'s' if len(not_yet) > 1 else ''} {_fmt_ranks(not_yet)} had not entered it yet when rank "
                   f"{first['by']} gave it up {first['elapsed_s']:.2f} s into its {first['timeout_s']:g} s timeout: "
                   f"slow, not stuck (not the cause)")
    for texts, stale in ((d["missing_dumps"], False), (d.get("stale_dumps") or {}, True)):
        unseen = sorted(r for r, t in texts.items() if "not seen entering" in t and r not in found)
        if unseen:
            one = len(unseen) == 1
            why = f"{'its' if one else 'their'} dump predates it" if stale else "no dump"
            out.append(f"rank{'' if one else 's'} {_fmt_ranks(unseen)} ({why}) {'was' if one else 'were'} not seen "
                       f"entering {d['op']} on {name!r}")
    m = d["mismatch"]
    if m:
        who = (_who(m["culprits"]) + (" differs" if len(m["culprits"]) == 1 else " differ") if m["culprits"]
               else "no majority")
        known = m.get("known")
        entered = set(d["in_flight"]) | set(d["completed"]) | set(d.get("captured") or [])
        if not m["culprits"] and known and not entered <= set(known):
            rest = entered - set(known)
            who += (f" among {_who(known)}, whose {_MISMATCH_NAMES.get(m['kind'], m['kind'])} the library's errors "
                    f"give ({_who(rest)} completed it: what {'it' if len(rest) == 1 else 'they'} called is not in "
                    "the dumps)")
        out.append(f"{_MISMATCH_NAMES.get(m['kind'], m['kind'])} mismatch in {d['op']} on {name!r}: {who}")
    if not out and d["in_flight"]:
        # an operation that never started on its stream (NCCL's "scheduled") waits for work queued before it on
        # that rank's stream or device, while the ranks where it started wait for that rank
        grouped = sorted(r for r, info in d["in_flight"].items() if info.get("grouped"))
        # enqueued and never run: its group() was dropped (its block raised) or refused there (a CommStateError)
        dropped = {r: info["error"] for r, info in d["in_flight"].items()
                   if str(info.get("error") or "").startswith("CommStateError") and "never ran" in info["error"]}
        waiting = sorted(r for r, info in d["in_flight"].items()
                         if info["state"] == "scheduled" and r not in grouped and r not in dropped)
        started = sorted(r for r in d["in_flight"] if r not in waiting and r not in grouped and r not in dropped)
        late = _late_text(c, d)
        if dropped:
            one = len(dropped) == 1
            out.append(f"rank{'' if one else 's'} {_fmt_ranks(list(dropped))} never ran {d['op']} on {name!r}: "
                       + "; ".join(f"rank {r}: {why}" for r, why in sorted(dropped.items()))
                       + (f"; rank{'' if len(started) == 1 else 's'} {_fmt_ranks(started)} started it and "
                          f"wait{'s' if len(started) == 1 else ''} for {'it' if one else 'them'}" if started else ""))
        elif grouped:
            one = len(grouped) == 1
            out.append(f"rank{'' if one else 's'} {_fmt_ranks(grouped)} never issued {d['op']} on {name!r}: it waited "
                       f"in a group() that had not ended there (a group issues its operations as it ends) -- look at "
                       f"what {'that rank' if one else 'those ranks'} did inside the group"
                       + (f"; rank{'' if len(started) == 1 else 's'} {_fmt_ranks(started)} started it and "
                          f"wait{'s' if len(started) == 1 else ''} for {'it' if one else 'them'}" if started else ""))
        elif late:  # before "never started": a late entry can fail on the ended communicator still queued
            out.append(late)
        # (not where it completed on other ranks: every rank's part ran, and a revoke can fail a rank's operation
        # before that rank saw it start)
        elif waiting and started and not d["completed"]:
            one = len(waiting) == 1
            out.append(f"rank{'' if one else 's'} {_fmt_ranks(waiting)} entered {d['op']} on {name!r} but "
                       f"{'its' if one else 'their'} operation never started: work queued before it on "
                       f"{'its' if one else 'their'} stream or device has not finished (a hung kernel, a wait "
                       f"on an event) -- look there; rank{'' if len(started) == 1 else 's'} {_fmt_ranks(started)} "
                       f"started it and wait{'s' if len(started) == 1 else ''} for {'it' if one else 'them'}")
        elif waiting and not d["never_entered"] and not d["completed"] and not unknown:
            out.append(f"every rank entered {d['op']} on {name!r} and on none did it start: work queued before it "
                       f"on their streams or devices has not finished (a hung kernel, a wait on an event) -- look "
                       f"there, not at the transport")
        elif d.get("captured"):
            out.append(f"{d['op']} on {name!r} was captured in a graph on {_who(d['captured'])} (it runs there only "
                       f"when the graph is replayed) but issued directly on {_who(d['in_flight'])}, where it did not "
                       f"complete")
        elif not d["never_entered"] and not d["completed"] and not unknown and c.get("members_guessed"):
            out.append(f"every rank whose dump knows {name!r} entered {d['op']} and none completed it: a member that "
                       "issued nothing on it, which no dump shows (torch's gloo dumps list no members), may not have "
                       "entered it -- else suspect the transport or a dependency outside this group")
        elif not d["never_entered"] and not d["completed"] and not unknown:
            out.append(f"every rank entered {d['op']} on {name!r} and none completed it: not a desync (suspect the "
                       f"transport, the device or a dependency outside this communicator)")
        elif d["completed"]:
            out.append(f"{d['op']} on {name!r} completed on ranks {_fmt_ranks(d['completed'])} but not on "
                       f"{_fmt_ranks(d['in_flight'])}")
        elif c["missing_dumps"]:
            out.append(f"{d['op']} on {name!r} did not complete on ranks {_fmt_ranks(d['in_flight'])}; ranks "
                       f"{_fmt_ranks(c['missing_dumps'])} left no dump of {name!r}")
    if not out and (d["missing_dumps"] or d.get("stale_dumps")):
        out.append(f"{d['op']} on {name!r}: " + "; ".join(f"rank {r}: {t}" for r, t in sorted(_undumped(d).items())))
    # a rank without a dump whose part in the collectives before it no dump shows: where it stopped is open
    out += [f"rank {r} ({_unshown_label(u)}) {_unshown_text(u, short=True)}" for r, u in sorted(unshown.items())]
    return "; ".join(out)


def _undumped(d: Dict[str, Any]) -> Dict[int, str]:
    """The ranks whose state in divergence ``d`` no dump gives -- none, or one that predates it -- and what the store
    says of them."""
    return {**d["missing_dumps"], **(d.get("stale_dumps") or {})}


def _culprits(c: Dict[str, Any]) -> List[int]:
    """The ranks communicator report ``c``'s verdict points at: those a failing rank's liveness check found unable to
    take part (stopped, exited, silent) and did not complete the first divergent operation, those that never entered
    it (but not those that merely had not yet, ``not_yet``) or were not seen entering it (no dump), the minority of
    a mismatch, those whose operation never started on their stream, those without a dump that may have stopped
    before it (``unshown``); for a point-to-point problem alone, both ends of the first transfer in question. Empty
    where it points at none (every rank stuck alike, no majority, no problem)."""
    d = c["first_divergence"]
    if c.get("bystander") and not _troubled(c):
        return []
    if d is None:
        first = _first_p2p(c)
        return sorted({first["src"], first["dst"]}) if first else sorted(c.get("unshown") or {})
    out = set(d["never_entered"]) - set(_overtaken(c)) - set(d.get("not_yet") or {})
    out |= {r for r, t in _undumped(d).items() if "not seen entering" in t}
    out |= set(d.get("found_unable") or {})
    out |= set(c.get("unshown") or {})
    if d["mismatch"]:
        out |= set(d["mismatch"]["culprits"])
    if not out and d["in_flight"]:
        waiting = {r for r, info in d["in_flight"].items() if info["state"] == "scheduled"}
        late = set(_late(c, d)[0])
        if late:  # as the verdict
            out |= late
        elif waiting and len(waiting) < len(d["in_flight"]) and not d["completed"]:  # as the verdict
            out |= waiting
    return sorted(out)


def trace_dir(path: str, *, prefix: Optional[str] = None) -> Dict[str, Any]:
    """Every generation's dumps under ``path`` as one Chrome trace-event object (:mod:`pycoll.diagnostics.trace`),
    with the analyzer's first divergences and verdicts."""
    loaded, reports = [], []
    stacks = find_stacks(path)
    for gen, folder in find_generations(path):
        dumps, _ = load_generation(folder, prefix)
        loaded.append((gen, dumps))
        if dumps:
            rep = analyze(dumps, stack_limit=0, stacks=stacks)
            rep["generation"] = gen
            reports.append(rep)
    return build_trace(loaded, reports)


def _frame_count(text: str) -> int:
    """``--stack-depth``'s value: an int, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of frames, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"a number of frames is 0 or more, got {n}")
    return n


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pycoll-fr",
        description="Find where the ranks diverged, from pycoll (or PyTorch) flight-recorder dumps.")
    parser.add_argument("dir", help="a dump directory (with generation_<g> folders) or one generation's folder")
    parser.add_argument("-p", "--prefix", default=None, help="only read files whose name starts with this prefix")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (each communicator with its verdict and culprits)")
    parser.add_argument("--no-stacks", action="store_true", help="leave the stacks of in-flight operations out")
    parser.add_argument("--stack-depth", type=_frame_count, default=6, metavar="N",
                        help="frames shown per stack of an in-flight operation (default 6; 0 shows none, as "
                             "--no-stacks)")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="also write every rank and generation as a Chrome trace-event file (Perfetto)")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="also draw the cross-rank timeline around the first divergence (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        # --no-stacks is --stack-depth 0 in both forms (--json printed the stacks it was told to leave out)
        reports = analyze_dir(args.dir, prefix=args.prefix, stack_limit=0 if args.no_stacks else args.stack_depth)
    except (FileNotFoundError, NotADirectoryError) as e:
        print(f"pycoll-fr: {e}", file=sys.stderr)
        return 2
    if args.trace or args.plot:
        trace = trace_dir(args.dir, prefix=args.prefix)
        try:
            if args.trace:
                write_trace(args.trace, trace)
                n = trace["otherData"]["counts"]
                print(f"pycoll-fr: wrote {args.trace} ({n['slices']} operations, {n['phases']} recovery slices, "
                      f"{n['instants']} instants; open it in ui.perfetto.dev)", file=sys.stderr)
            if args.plot:
                name = os.path.basename(os.path.normpath(args.dir))
                plot_trace(trace, args.plot, title=f"pycoll flight recorder: {name}")
                print(f"pycoll-fr: wrote {args.plot}", file=sys.stderr)
        except (ImportError, OSError) as e:
            print(f"pycoll-fr: {e}", file=sys.stderr)
            return 2
    try:
        if args.json:
            print(json.dumps(reports, indent=2, default=str))
        else:
            print(format_report(reports, stacks=not args.no_stacks), end="")
        sys.stdout.flush()
    except BrokenPipeError:  # `pycoll-fr DIR | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- stdout for the rest of the process (its flush at exit)
    if not any(rep["ranks"] for rep in reports):
        return 2
    return 0 if all(rep["ok"] for rep in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
