"""Reporting: nccl-tests' table, progress, the events relayed from rank 0, JSON, CSV and the plot."""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from typing import Any, Dict, List, Sequence, TextIO, Tuple

from .spec import _EVENT_MARK, MODES, format_size


def _fmt_time(us: float) -> str:
    if us < 1e4:
        return f"{us:8.2f}"
    if us < 1e6:
        return f"{us:8.1f}"
    return f"{us:8.0f}"


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:7.2f}" if gbps < 1e4 else f"{gbps:7.0f}"


class _Reporter:
    """Receives what rank 0 learns, in order: start(meta), section(...), row(...), progress(...), finish(...)."""

    def start(self, meta: Dict[str, Any]) -> None: ...
    def section(self, collective: str, modes: Sequence[str]) -> None: ...
    def row(self, row: Dict[str, Any]) -> None: ...
    def progress(self, done: int, total: int, label: str) -> None: ...
    def finish(self, summary: Dict[str, Any]) -> None: ...


class _EventReporter(_Reporter):
    """Rank 0 of a job pycoll-bench started itself: events as JSON lines for the parent."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def _emit(self, kind: str, **data: Any) -> None:
        self.out.write(_EVENT_MARK + json.dumps({"event": kind, **data}) + "\n")
        self.out.flush()

    def start(self, meta: Dict[str, Any]) -> None:
        self._emit("start", meta=meta)

    def section(self, collective: str, modes: Sequence[str]) -> None:
        self._emit("section", collective=collective, modes=list(modes))

    def row(self, row: Dict[str, Any]) -> None:
        self._emit("row", row=row)

    def progress(self, done: int, total: int, label: str) -> None:
        self._emit("progress", done=done, total=total, label=label)

    def finish(self, summary: Dict[str, Any]) -> None:
        self._emit("finish", summary=summary)


def _dispatch(reporter: _Reporter, event: Dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "start":
        reporter.start(event["meta"])
    elif kind == "section":
        reporter.section(event["collective"], event["modes"])
    elif kind == "row":
        reporter.row(event["row"])
    elif kind == "progress":
        reporter.progress(event["done"], event["total"], event["label"])
    elif kind == "finish":
        reporter.finish(event["summary"])


class _Progress:
    """A one-line progress display on stderr, redrawn at most 10 times a second."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done: int, total: int, label: str) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        el = int(now - self.t0)
        self.stream.write(f"\r\033[Kpycoll-bench [{done}/{total}] {label}  {el // 60}:{el % 60:02d}")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class _TableReporter(_Reporter):
    """Prints nccl-tests' table and writes the --json / --csv / --plot files at the end."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, progress: bool) -> None:
        self.args = args
        self.table = args.json != "-" and args.csv != "-"
        self.out = out
        self.meta: Dict[str, Any] = {}
        self.rows: List[Dict[str, Any]] = []
        self.modes: Sequence[str] = MODES
        self.progress_bar = _Progress(err) if progress else None
        self.summary: Dict[str, Any] = {}

    def _print(self, text: str) -> None:
        if self.progress_bar is not None:
            self.progress_bar.clear()
        if self.table:
            self.out.write(text + "\n")
            self.out.flush()

    def start(self, meta: Dict[str, Any]) -> None:
        self.meta = meta
        m = meta
        lib = m["library"]
        if lib["kind"] == "host":
            what = f"pycoll host library {lib.get('host_version', '?')}, NCCL API {lib['version']}"
        else:
            what = f"{lib['kind'].upper()} {lib['version']}"
        self._print(
            f"# pycoll-bench {','.join(m['collectives'])}: nRanks {m['nranks']} backend {m['backend']} ({what}) "
            f"api {m['api']} arrays {m['arrays']}"
        )
        step = f"{m['stepfactor']}(factor)" if m.get("stepfactor") else f"{m['stepbytes']}(bytes)"
        self._print(
            f"# minBytes {m['minbytes']} maxBytes {m['maxbytes']} step: {step} warmup iters: {m['warmup']} "
            f"iters: {m['iters']} validation: {int(m['check'])} "
            f"stream: {'yes' if m['stream'] else 'no (inline, NULL stream)'}"
        )
        self._print(f"# time: {m['time_method']}")
        self._print(f"# library: {lib['path']}")
        self._print(f"# started {m['started']} on {m['hostname']}, load average {m['loadavg']}")
        self._print("#")
        self._print("# Using devices")
        for r in m["ranks"]:
            self._print(f"#  Rank {r['rank']:2d} Pid {r['pid']:7d} on {r['hostname']:>10s} device {r['device']}")
        self._print("#")

    def section(self, collective: str, modes: Sequence[str]) -> None:
        self.modes = modes
        left = "#       size         count      type   redop    root"
        units = "#        (B)    (elements)                          "
        top = "#" + " " * (len(left) - 1)
        cols, cunits = "", ""
        for mode in modes:
            top += f"{mode:^36s}"
            cols += "     time   algbw   busbw #wrong"
            cunits += "     (us)  (GB/s)  (GB/s)       "
        self._print(f"# Collective: {collective}")
        self._print(top.rstrip())
        self._print(left + cols)
        self._print(units + cunits)

    def row(self, row: Dict[str, Any]) -> None:
        self.rows.append(row)
        text = f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8s}  {row['redop']:>6s}  {row['root']:6d}"
        for mode in self.modes:
            res = row["results"].get(mode)
            if res is None:
                text += f" {'N/A':>8s} {'N/A':>7s} {'N/A':>7s} {'N/A':>6s}"
                continue
            wrong = "N/A" if res["wrong"] is None else str(res["wrong"])
            text += (f" {_fmt_time(res['time_us'])} {_fmt_bw(res['algbw_GBps'])} {_fmt_bw(res['busbw_GBps'])}"
                     f" {wrong:>6s}")
        self._print(text)

    def progress(self, done: int, total: int, label: str) -> None:
        if self.progress_bar is not None:
            self.progress_bar.update(done, total, label)

    def finish(self, summary: Dict[str, Any]) -> None:
        self.summary = summary
        if self.progress_bar is not None:
            self.progress_bar.clear()
        wrong = summary["wrong"]
        self._print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        self._print(f"# Avg bus bandwidth    : {summary['avg_busbw_GBps']:.6g}")
        self._print("#")
        self.write_files()

    # -- files ----------------------------------------------------------------------------------

    def flat_results(self) -> List[Dict[str, Any]]:
        out = []
        for row in self.rows:
            for mode, res in row["results"].items():
                if res is None:
                    continue
                flat = {k: v for k, v in row.items() if k != "results"}
                flat["mode"] = mode
                flat.update(res)
                out.append(flat)
        return out

    def document(self) -> Dict[str, Any]:
        from ... import __version__

        return {"tool": "pycoll-bench", "version": __version__, "meta": self.meta,
                "results": self.flat_results(), "summary": self.summary}

    def write_files(self) -> None:
        a = self.args
        if a.json:
            text = json.dumps(self.document(), indent=2) + "\n"
            if a.json == "-":
                self.out.write(text)
            else:
                with open(a.json, "w") as f:
                    f.write(text)
        if a.csv:
            if a.csv == "-":
                self._write_csv(self.out)
            else:
                with open(a.csv, "w", newline="") as f:
                    self._write_csv(f)
        if a.plot:
            write_plot(self.flat_results(), self.meta, a.plot)

    _CSV_FIELDS = ("collective", "nranks", "backend", "api", "size", "count", "type", "redop", "root", "mode",
                   "time_us", "algbw_GBps", "busbw_GBps", "wrong", "time_us_mean", "time_us_min", "time_us_p90",
                   "iters")

    def _write_csv(self, f: TextIO) -> None:
        w = csv.DictWriter(f, fieldnames=self._CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in self.flat_results():
            w.writerow({**r, "nranks": self.meta.get("nranks"), "backend": self.meta.get("backend"),
                        "api": self.meta.get("api"), "wrong": "" if r["wrong"] is None else r["wrong"]})


def write_plot(results: List[Dict[str, Any]], meta: Dict[str, Any], path: str) -> None:
    """A PNG of time and bus bandwidth against size, one line per collective/type/op/mode."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series: Dict[str, List[Tuple[int, float, float]]] = {}
    for r in results:
        redop = f" {r['redop']}" if r["redop"] != "none" else ""
        label = f"{r['collective']} {r['type']}{redop} ({r['mode']})"
        series.setdefault(label, []).append((r["size"], r["time_us"], r["busbw_GBps"]))
    rows = max(1, math.ceil(len(series) / 3))
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5 + 0.22 * rows), layout="constrained")
    for label, pts in series.items():
        pts.sort()
        xs = [p[0] for p in pts]
        ax_t.plot(xs, [p[1] for p in pts], marker="o", ms=3, label=label)
        ax_b.plot(xs, [p[2] for p in pts], marker="o", ms=3, label=label)
    ticks = sorted({p[0] for pts in series.values() for p in pts})
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        if ticks and len(ticks) <= 16:
            ax.set_xticks(ticks)
            ax.set_xticklabels([format_size(t) for t in ticks], rotation=45)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (us, median of the slowest rank)")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, max(1, len(labels))), fontsize="small")
    fig.suptitle(f"pycoll-bench: {meta.get('nranks')} ranks, backend {meta.get('backend')}, api {meta.get('api')}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
