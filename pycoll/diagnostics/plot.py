"""A picture of a trace (:mod:`pycoll.diagnostics.trace`) for people who do not open Perfetto.

:func:`plot_trace` draws the cross-rank timeline around the first divergence: one row per rank,
its operations as bars coloured by state (completed, captured in a CUDA graph, in flight, failed; those in
flight or failed labelled with their communicator and operation), its recovery phases as a thinner bar under
them, the failures and dumps as markers and the divergence as a vertical line, named with its communicator
(each communicator's first divergence, where several diverged).
Needs matplotlib (the ``test`` and ``bench`` extras), imported only when a plot is drawn; the
figure is rendered with matplotlib's Agg canvas (no pyplot, no change to the process's backend).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["plot_trace", "plot_window", "STATE_COLOURS", "PHASE_COLOURS"]

STATE_COLOURS = {"completed": "#8fa8c8", "captured": "#c8c8c8", "in flight": "#f0a030", "failed": "#d03030"}
PHASE_COLOURS = {"to agreement": "#b8b8b8", "agreement": "#6a5acd", "revoke": "#c71585", "shrink": "#2e8b57",
                 "grow": "#3cb371", "init": "#20b2aa", "first collective": "#1e90ff"}
OPS_BEFORE = 6  # operations shown before the divergence, per rank


def _need_matplotlib() -> Any:
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("drawing a plot needs matplotlib (pip install matplotlib, or pycoll's 'test' extra): "
                          f"{e}") from e
    return Figure, FigureCanvasAgg


def _state(ev: Dict[str, Any]) -> str:
    if ev["args"].get("captured"):
        return "captured"  # recorded into a CUDA graph: it runs at the graph's replays
    if ev["name"].endswith("(failed)") or ev["args"].get("never_ran"):  # also one an abort or revoke stopped, where
        return "failed"  # its communicator did not fail (not in flight), and one of a dropped group
    return "in flight" if ev["args"].get("in_flight") else "completed"


def _comm_label(args: Dict[str, Any]) -> str:
    """``"'pair' (ranks 2-3)"`` for a first-divergence instant's arguments ('' for a trace without them)."""
    name = args.get("communicator")
    if name is None:
        return ""
    members = sorted(int(r) for r in args.get("members") or [])
    if not members:
        return repr(name)
    contiguous = members == list(range(members[0], members[-1] + 1))
    ranks = f"{members[0]}-{members[-1]}" if contiguous and len(members) > 1 else ", ".join(map(str, members))
    return f"{name!r} (ranks {ranks})"


def plot_window(trace: Dict[str, Any]) -> Tuple[float, float, Optional[float]]:
    """(start, end, divergence) in the trace's microseconds: what :func:`plot_trace` shows.

    Around the first divergence when the analyzer found one: the last few operations before it on
    every rank, through the in-flight and failed operations (those under way at it, and those after it on
    the tracks of its communicator: where each of its ranks is held), the failures and the recovery that
    follow it. The whole trace otherwise.
    """
    evs = trace.get("traceEvents", [])
    ops = [e for e in evs if e.get("ph") == "X" and e.get("cat") in ("collective", "p2p")]
    timed = [e for e in evs if e.get("ph") in ("X", "i")]
    if not timed:
        return 0.0, 1.0, None
    whole = (min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0.0) for e in timed))
    divs = [e["ts"] for e in evs if e.get("ph") == "i" and str(e.get("name", "")).startswith("first divergence")]
    if not divs:
        return whole[0], whole[1], None
    t_div = min(divs)
    before: Dict[Any, List[float]] = defaultdict(list)
    for e in ops:
        if e["ts"] < t_div:
            before[e["pid"]].append(e["ts"])
    starts = [sorted(v)[-OPS_BEFORE] if len(v) >= OPS_BEFORE else min(v) for v in before.values()]
    start = min(starts) if starts else t_div
    ends = [t_div]
    # the tracks (rank, communicator) of the divergence: a rank there may be held in a later operation (a broadcast's
    # root that ran ahead of a receiver) or have entered it well after the others (the ranks need not meet at every
    # operation)
    held = {(e["pid"], e["tid"]) for e in ops if e["args"].get("first_divergence")}
    for e in ops:
        if _state(e) in ("in flight", "failed") and (e["ts"] <= t_div + 1.0 or (e["pid"], e["tid"]) in held) \
                and e["ts"] + e["dur"] >= t_div:
            ends.append(e["ts"] + e["dur"])
    recovery = [e for e in evs if e.get("ph") == "X" and e.get("cat") == "elastic" and e["ts"] >= t_div]
    if recovery:
        first = min(e["ts"] for e in recovery)
        ends += [e["ts"] + e["dur"] for e in recovery if e["ts"] <= first + 1e5]  # the first recovery
    ends += [e["ts"] for e in evs if e.get("cat") == "failure" and t_div <= e["ts"] <= max(ends)]
    end = max(ends)
    span = max(end - start, 1.0)
    end += 0.25 * span  # a few operations after it
    return max(whole[0], start - 0.03 * span), min(whole[1], end), t_div


def plot_trace(trace: Dict[str, Any], path: str, *, title: Optional[str] = None,
               window: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """Draw ``trace`` (around its first divergence, or in ``window``: microseconds) into the PNG ``path``.

    Returns what was drawn: ranks, operation bars per state, phase bars, the window (ms).
    Raises ImportError naming matplotlib when it is not installed.
    """
    figure_cls, canvas_cls = _need_matplotlib()
    start, end, t_div = plot_window(trace)
    if window is not None:
        start, end = window
    if end <= start:
        end = start + 1.0
    evs = trace.get("traceEvents", [])
    names = {e["pid"]: e["args"]["name"] for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"}
    # a rank that left no dump (killed) has no event, and is often the one the verdict names: a row all the same --
    # by the verdict of a divergence drawn (another generation's, in the window too, is about another communicator)
    drawn_uids = {e["args"].get("uid") for e in evs if e.get("ph") == "i" and start <= e["ts"] <= end
                  and str(e.get("name", "")).startswith("first divergence")}
    no_dump = {int(r) for e in evs if e.get("ph") == "i" and e.get("cat") == "analysis" and start <= e["ts"] <= end
               and e["args"].get("uid") in drawn_uids for r in e["args"].get("missing_dumps") or []}
    ranks = sorted({e["pid"] for e in evs if e.get("ph") in ("X", "i") and e.get("s") != "g"} | set(names) | no_dump)
    row = {r: i for i, r in enumerate(ranks)}
    zero = t_div if t_div is not None else start

    def ms(t: float) -> float:
        return (t - zero) / 1e3

    fig = figure_cls(figsize=(11, 1.2 + 0.62 * max(1, len(ranks))), dpi=100)
    canvas_cls(fig)
    ax = fig.add_subplot(1, 1, 1)
    drawn: Dict[str, Any] = {"ranks": ranks, "ops": defaultdict(int), "phases": 0,
                             "window_ms": (ms(start), ms(end)), "labels": {}, "divergence": ""}
    bars: Dict[Tuple[int, str], List[Tuple[float, float]]] = defaultdict(list)
    for e in evs:
        if e.get("ph") != "X" or e["ts"] > end or e["ts"] + e.get("dur", 0.0) < start or e["pid"] not in row:
            continue
        a, b = max(e["ts"], start), min(e["ts"] + e["dur"], end)
        width = max(ms(b) - ms(a), (ms(end) - ms(start)) / 2500)  # at least a hair, so an op shows
        if e.get("cat") in ("collective", "p2p"):
            st = _state(e)
            bars[(e["pid"], st)].append((ms(a), width))
            drawn["ops"][st] += 1
            if st in ("in flight", "failed"):  # which communicator's operation holds the rank: the verdicts name it
                label = f"{e['args'].get('communicator')!r} {e['name']}"
                ax.text(ms(a), row[e["pid"]] + 0.1, f" {label}", fontsize=7, va="center", ha="left",
                        color="white" if st == "failed" else "black", clip_on=True)
                drawn["labels"].setdefault(e["pid"], []).append(label)
        elif e.get("cat") == "elastic" and e["name"] in PHASE_COLOURS:
            y = row[e["pid"]] - 0.42
            ax.broken_barh([(ms(a), width)], (y, 0.22), facecolors=PHASE_COLOURS[e["name"]], edgecolor="none")
            drawn["phases"] += 1
    for (pid, st), spans in bars.items():
        ax.broken_barh(spans, (row[pid] - 0.15, 0.5), facecolors=STATE_COLOURS[st],
                       edgecolor="#404040" if st in ("in flight", "failed") else "none", linewidth=0.4)
    for e in evs:
        if e.get("ph") != "i" or not start <= e["ts"] <= end:
            continue
        if e.get("cat") == "failure" and e["pid"] in row:
            ax.plot([ms(e["ts"])], [row[e["pid"]] + 0.45], marker="X", color="#a00000", markersize=8, zorder=5)
        elif e.get("cat") == "dump" and e["pid"] in row:
            ax.plot([ms(e["ts"])], [row[e["pid"]] + 0.45], marker="v", color="black", markersize=6, zorder=5)
    if t_div is not None:
        ax.axvline(0.0, color="#d03030", linestyle="--", linewidth=1.2)
        # each communicator's first divergence, named with it (the line is the earliest's)
        divs: Dict[str, str] = {}
        notes: Dict[int, List[str]] = defaultdict(list)
        for e in sorted((e for e in evs if e.get("ph") == "i" and str(e.get("name", "")).startswith("first divergence")
                         and start <= e["ts"] <= end), key=lambda e: e["ts"]):
            a = e.get("args") or {}
            op = str(e["name"]).split(": ", 1)[-1]
            comm = _comm_label(a)
            what = f"{comm} {op}" if comm else op
            if divs.setdefault(str(a.get("uid", op)), what) != what:
                continue
            for r in a.get("never_entered") or []:
                note = what + (" (the recovery revoked it first)" if r in (a.get("revoked_first") or []) else "")
                if note not in notes[int(r)]:
                    notes[int(r)].append(note)
        drawn["divergence"] = "; ".join(divs.values())
        ax.text(0.0, 1.01, f"first divergence{'s' if len(divs) > 1 else ''}: {drawn['divergence']}",
                color="#d03030", fontsize=8, va="bottom", ha="center", transform=ax.get_xaxis_transform())
        drawn["notes"] = {}
        for r in sorted(set(notes) | no_dump):
            if r in row:
                text = (f"never entered {', '.join(notes[r])}" if notes[r] else "no dump: not seen entering it")
                drawn["notes"][r] = text
                y = row[r] + (0.5 if r in drawn["labels"] else 0.1)  # under the label of the op that holds it
                ax.text(0.0, y, f"  {text}", color="#d03030", fontsize=7, va="center")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([names.get(r, f"rank {r}" + (" (no dump)" if r in no_dump else "")) for r in ranks], fontsize=8)
    ax.set_ylim(-0.6, len(ranks) - 0.1)
    ax.invert_yaxis()
    ax.set_xlim(ms(start), ms(end))
    ax.set_xlabel("ms since the first divergence was enqueued" if t_div is not None else "ms")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.5)
    ax.set_axisbelow(True)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: List[Any] = [Patch(color=c, label=f"op {s}") for s, c in STATE_COLOURS.items()
                          if s != "captured" or drawn["ops"][s]]
    used = {e["name"] for e in evs if e.get("ph") == "X" and e.get("cat") == "elastic"}
    handles += [Patch(color=c, label=p) for p, c in PHASE_COLOURS.items() if p in used]
    handles += [Line2D([], [], marker="X", color="#a00000", linestyle="none", label="failure"),
                Line2D([], [], marker="v", color="black", linestyle="none", label="dump")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16 - 0.3 / max(1, len(ranks))),
              ncol=min(6, len(handles)), fontsize=7, frameon=False)
    ax.set_title(title or "pycoll flight recorder: ranks side by side", fontsize=10, pad=16)
    fig.tight_layout()
    fig.savefig(path, format="png")
    drawn["ops"] = dict(drawn["ops"])
    return drawn
