"""``python -m pycoll.demo``: a rank dies mid-training and the job goes on, then grows back.

On the host backend (no GPU needed), ``pycoll-run`` starts 4 ranks that train a small
data-parallel linear-regression model with numpy: every step each rank computes the gradient on
its own shard and the ranks average it with ``all_reduce``. At step ``--kill-step`` rank
``--kill-rank`` kills itself with SIGKILL. The survivors' collective fails with a remote error; the
watchdog reports it and every survivor dumps its flight recorder; the survivors agree on who is
gone and shrink the communicator; rank 0 runs the flight-recorder analyzer on the dumps, which names
the lost rank. The launcher starts a replacement process, which joins at a step boundary (the
job grows back to 4 ranks) and receives the model from rank 0. At the end every rank checks that
all ranks hold identical parameters at the same step, and rank 0 prints the recovery timeline. With ``--trace
OUT.json`` every rank also dumps the generations it has not dumped yet at the end, and the demo
writes the whole run (every rank, generation and recovery phase) as a Chrome trace-event file that
Perfetto opens (:mod:`pycoll.diagnostics.trace`).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple

from . import unwritable

if TYPE_CHECKING:
    import numpy as np

    from ..elastic import ElasticGroup

__all__ = ["main"]

_DIM = 8
_SHARD = 64
_WAIT_S = 0.05  # between the step boundaries after training, while a replacement is awaited


def _shard(slot: int, true_w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    import numpy as np

    rng = np.random.default_rng(1000 + slot)
    x = rng.standard_normal((_SHARD, _DIM))
    y = x @ true_w + 0.01 * rng.standard_normal(_SHARD)
    return x, y


def _say(group: ElasticGroup, text: str) -> None:
    if group.rank == 0:
        print(text, flush=True)


def _analyze(group: ElasticGroup, dump_dir: str, generation: int) -> None:
    """Rank 0: wait briefly for the survivors' dumps of ``generation``, then print the analyzer's verdict."""
    from ..diagnostics.analyze import analyze_dir, format_report
    from ..diagnostics.files import generation_dir

    folder = generation_dir(dump_dir, generation)
    deadline = time.monotonic() + 3.0
    survivors = [m for m in group.members if m in group.transitions[-1].members_before]
    while time.monotonic() < deadline:
        present = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        if all(any(f.endswith(f"_{m}") for f in present) for m in survivors):
            break
        time.sleep(0.05)
    report = format_report(analyze_dir(folder), stacks=False)
    print(f"flight-recorder analyzer (pycoll-fr) on the generation-{generation} dumps:", flush=True)
    for line in report.splitlines():
        print("    " + line, flush=True)


def _final_dump(failed: Set[int]) -> None:
    """Dump every generation whose communicator did not fail here (the failure's dumps stay as they are;
    a generation dumped alongside them while it was young is written again, whole)."""
    from ..diagnostics import get_recorder

    rec = get_recorder()
    gens = [g for g in rec.generations() if g not in failed]
    if gens:
        rec.dump("end of the demo", trigger="manual", generations=gens)


def _sync_state(group: ElasticGroup, params: np.ndarray, step: int) -> int:
    """Rank 0 sends the model and the step to every member (a joiner receives them)."""
    import numpy as np

    state = np.concatenate([params, [float(step)]])
    group.comm.broadcast(state, root=0)
    params[:] = state[:-1]
    return int(state[-1])


def _resume(group: ElasticGroup, mine: Optional[int], params: np.ndarray, before: np.ndarray) -> int:
    """After a reshape: the step to go on from. The survivors agreed on the last step every one of them completed
    (``group.last_committed``); a member whose all_reduce of the next step completed where another survivor's
    failed (``mine``, what it had committed, is one more) takes that step back: ``params`` become ``before``."""
    agreed = -1 if group.last_committed is None else group.last_committed
    if mine is not None and mine > agreed:
        params[:] = before
        print(f"slot {group.slot}: step {mine} completed here but not on every survivor: taken back", flush=True)
    return agreed + 1


def _worker(args: argparse.Namespace) -> int:
    import numpy as np

    import pycoll

    from ..elastic import ElasticGroup

    true_w = np.linspace(-1.0, 1.0, _DIM)
    try:
        group = ElasticGroup.from_env(backend="host", timeout=args.timeout, name="demo")
    except pycoll.Excluded as exc:  # a replacement that came after the others stopped waiting (--grow-wait)
        print(f"replacement for slot {os.environ.get('PYCOLL_RANK')}: not admitted: {exc}", flush=True)
        return 0
    x, y = _shard(group.slot, true_w)
    params = np.zeros(_DIM)
    before = params.copy()  # the parameters before the last step (a member may have to take that step back)
    step = 0
    if group.rank == 0 and not group.joined:
        print(f"{group.size} ranks training a {_DIM}-parameter model (data parallel, all_reduce avg), "
              f"{args.steps} steps", flush=True)
    replaced = os.environ.get("PYCOLL_REPLACEMENT", "0") != "0"
    failed: Set[int] = set()  # generations whose communicator failed under this process
    sync = joining = group.joined  # a replacement first receives the model and the step from rank 0
    waits = 0  # step boundaries passed after training while a replacement may still be on its way
    while True:
        trained = step >= args.steps
        # after training, wait for a late replacement at further step boundaries; every member counts them
        # alike (maybe_grow() is collective), and starts again after a grow or a reshape
        if trained and not sync and (group.size >= args.ranks or waits * _WAIT_S >= args.grow_wait):
            break
        if step == args.kill_step and group.slot == args.kill_rank and not replaced:
            print(f"slot {group.slot}: killing myself with SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if sync:  # a replacement, or every member after a reshape: rank 0's model and step
                step, sync = _sync_state(group, params, step), False
                if joining:
                    print(f"replacement for slot {group.slot} joined as rank {group.rank} of generation "
                          f"{group.generation} ({group.size} ranks) at step {step}", flush=True)
                    joining = False
                continue
            if trained:
                waits += 1
                time.sleep(_WAIT_S)
            else:
                grad = x.T @ (x @ params - y) / len(y)
                group.comm.all_reduce(grad, op="avg")
                before[:] = params
                params -= args.lr * grad
                group.commit(step)  # this member completed the step
                step += 1
            if group.maybe_grow():  # a step boundary: admit a replacement, send it the model
                when = "after training" if trained else f"step {step}"
                _say(group, f"{when}: grew: {group.transitions[-1].describe()}")
                _sync_state(group, params, step)
                waits = 0
        except pycoll.CommFailure as exc:  # in the all_reduce, in maybe_grow() or in a sync
            if group.rank == 0:
                print(f"step {step}: collective failed: {type(exc).__name__}: {exc}", flush=True)
            generation = group.generation
            failed.add(generation)
            mine = group.last_committed
            group.reshape()
            _say(group, f"step {step}: reshaped: {group.transitions[-1].describe()}")
            # one outcome per step: every survivor goes on after the last step all of them completed (a
            # replacement among them may not have the model yet: rank 0 sends it first)
            step, sync, waits = _resume(group, mine, params, before), True, 0
            # the failure's dumps wait until the recovery is over; the analyzer wants them now
            pycoll.diagnostics.get_watchdog().wait_for_dumps()
            if group.rank == 0:
                _analyze(group, args.dump_dir, generation)
            continue  # redo the step on the smaller communicator
        if trained:
            continue
        if step % 10 == 0:
            loss = float(np.mean((x @ params - y) ** 2))
            _say(group, f"step {step}: {group.size} ranks, generation {group.generation}, local loss {loss:.5f}")
        time.sleep(args.step_time)
    hi, lo = np.append(params, step), np.append(params, step)  # the parameters and the step
    try:
        group.comm.all_reduce(hi, op="max")
        group.comm.all_reduce(lo, op="min")
    except pycoll.CommFailure as exc:  # a member lost after training: no verdict on the parameters
        print(f"slot {group.slot}: the final check failed: {type(exc).__name__}: {exc}", flush=True)
        group.close()
        return 1
    identical = bool(np.array_equal(hi, lo))
    if group.rank == 0:
        print("recovery timeline:", flush=True)
        for t in group.transitions:
            phases = ", ".join(f"{k} {v:.1f} ms" for k, v in t.phases_ms().items())
            print(f"    generation {t.generation} ({t.kind}): {list(t.members_before)} -> "
                  f"{list(t.members_after)}: {phases}", flush=True)
        err = float(np.max(np.abs(params - true_w)))
        verdict = "PASS" if identical and group.size == args.ranks else "FAIL"
        print(f"{verdict}: {group.size} ranks (slots {list(group.members)}) hold "
              f"{'identical' if identical else 'DIFFERENT'} parameters after {step} steps "
              f"(max |w - w_true| = {err:.4f})"
              + ("" if group.size == args.ranks else f"; the job did not grow back to {args.ranks} ranks: no "
                 f"replacement was admitted within --grow-wait {args.grow_wait:g} s after training"), flush=True)
    if args.final_dump:
        _final_dump(failed)
    group.close()
    return 0 if identical and group.size == args.ranks else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pycoll.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4, help="number of ranks (default 4)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--kill-rank", type=int, default=2, help="slot that kills itself (default 2)")
    p.add_argument("--kill-step", type=int, default=20, help="step at which it does (default 20)")
    p.add_argument("--step-time", type=float, default=0.02, help="seconds of simulated compute per step")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--timeout", type=float, default=5.0, help="per-operation timeout in seconds")
    p.add_argument("--dump-dir", default=None, help="flight-recorder dump folder (default: a new temporary one, not "
                   "PYCOLL_FR_DUMP_DIR: the analysis reads only this run's dumps)")
    p.add_argument("--trace", metavar="OUT.json", default=None,
                   help="write the run as a Chrome trace-event file (open it in ui.perfetto.dev)")
    p.add_argument("--grow-wait", type=float, default=10.0,
                   help="seconds to wait after training for a replacement that is not there yet (default 10)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--final-dump", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo (or, with ``--worker``, one of its ranks)."""
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.ranks < 2 or not 0 <= args.kill_rank < args.ranks or not 0 <= args.kill_step < args.steps:
        print("demo: need --ranks >= 2, 0 <= --kill-rank < --ranks and 0 <= --kill-step < --steps", file=sys.stderr)
        return 2
    for flag, value in (("--step-time", args.step_time), ("--grow-wait", args.grow_wait)):
        if not (math.isfinite(value) and value >= 0):
            print(f"demo: {flag} must be a finite number of seconds >= 0, got {value}", file=sys.stderr)
            return 2
    if not math.isfinite(args.lr):
        print(f"demo: --lr must be finite, got {args.lr}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        print(f"demo: --timeout must be a finite number of seconds > 0, got {args.timeout}", file=sys.stderr)
        return 2
    why = unwritable(args.trace) if args.trace else None  # written at the end: refused now, not after the run
    if why:
        print(f"demo: cannot write --trace {args.trace!r}: {why}", file=sys.stderr)
        return 2
    if args.dump_dir:
        args.dump_dir = os.path.expanduser(args.dump_dir)  # '~/...' as the ranks' recorder reads it
        try:  # every rank writes there: a folder that cannot be made fails here, not in each rank
            os.makedirs(args.dump_dir, exist_ok=True)
        except OSError as e:
            print(f"demo: cannot use --dump-dir {args.dump_dir!r}: {e}", file=sys.stderr)
            return 2
    dump_dir = args.dump_dir or tempfile.mkdtemp(prefix="pycoll-demo-")
    env = dict(os.environ, PYCOLL_FR_DUMP_DIR=dump_dir, PYCOLL_BACKEND="host")
    worker_args: List[str] = [
        "--worker", "--ranks", str(args.ranks), "--steps", str(args.steps), "--kill-rank", str(args.kill_rank),
        "--kill-step", str(args.kill_step), "--step-time", str(args.step_time), "--lr", str(args.lr),
        "--timeout", str(args.timeout), "--grow-wait", str(args.grow_wait), "--dump-dir", dump_dir,
    ]
    if args.trace:
        worker_args.append("--final-dump")
    cmd = [sys.executable, "-m", "pycoll.run", "-n", str(args.ranks), "--replace-failed", "1", "--timeout", "120",
           "-m", "pycoll.demo", *worker_args]
    print(f"pycoll demo: pycoll-run -n {args.ranks} --replace-failed 1 (host backend); slot {args.kill_rank} "
          f"dies at step {args.kill_step}; flight-recorder dumps in {dump_dir}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.call(cmd, env=env)
    print(f"pycoll demo: finished in {time.monotonic() - t0:.1f} s with exit status {rc}", flush=True)
    if not args.dump_dir:  # a folder of its own, kept for a second look: say so, and how
        print(f"pycoll demo: the dumps stay in {dump_dir} (`pycoll-fr {dump_dir}` analyses them again; remove the "
              "folder when done, or pass --dump-dir)", flush=True)
    if args.trace:
        from ..diagnostics.analyze import trace_dir
        from ..diagnostics.trace import write_trace

        trace = trace_dir(dump_dir)
        write_trace(args.trace, trace)
        n = trace["otherData"]["counts"]
        print(f"pycoll demo: wrote {args.trace}: {n['processes']} ranks, {n['tracks']} tracks, {n['slices']} "
              f"operations ({n['in_flight']} not completed), {n['phases']} recovery slices, {n['instants']} instants "
              "(open it in ui.perfetto.dev)", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
