#!/usr/bin/env bash
# pycoll GPU check, for a machine with one NVIDIA GPU and no network access.
#
#   benchmarks/gpu_check.sh [OUTDIR]        (default: $OUT, else ./gpu_check_out)
#
# Expects Python with torch (CUDA), cupy, cuda-bindings, Cython, pytest and an NCCL wheel installed.
# Steps, each under its own timeout and all within GPU_CHECK_BUDGET seconds (default 450, so the
# whole check ends within 8 minutes):
#   env       env.json: versions, the GPU, which libnccl pycoll loads
#   build     pip install --no-build-isolation --no-deps . (falls back to an in-place build)
#   tests_one_rank    the one-rank GPU tests (tests/gpu/: default, current and side streams, graph capture
#                     and replay with a deadline, a hung op timed out and aborted, bindings, devices) -> junit xml
#   tests_multi_rank  two ranks on the one GPU (NCCL >= 2.30): collectives, shrink, abort of a hung op,
#                     put/wait-signal on a window (test_windows_gpu.py) -> junit xml
#   overhead  per-call overhead of an 8-byte allreduce: pycoll vs torch.distributed NCCL, 1 rank
#   bench1    pycoll-bench all_reduce/all_gather/broadcast, 1 rank, 8 B..64 MiB
#   bench2    pycoll-bench all_reduce, 2 ranks on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30)
# Every step writes OUTDIR/<step>.log; status.txt has one line per step (rc, seconds); summary.json
# the same as JSON. The exit status is 1 when the build or the tests failed (a test step whose tests were all
# skipped, pytest's 5 "no tests collected", did not fail: a machine without a GPU), else 0.
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET:-450}"
START=$(date +%s)
DEADLINE=$((START + BUDGET))
STATUS="$OUT_DIR/status.txt"
: > "$STATUS"
RUN_DIR="$OUT_DIR/run"          # tests run from here so that `import pycoll` finds the installed copy
mkdir -p "$RUN_DIR"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONUNBUFFERED=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"   # NCCL's own warnings land in the step logs

declare -A RC
# step NAME LIMIT CMD...: run CMD with a timeout of min(LIMIT, time left), log to OUTDIR/NAME.log
step() {
  local name=$1 limit=$2; shift 2
  local now left t0 rc
  now=$(date +%s); left=$((DEADLINE - now - 5))
  if [ "$left" -lt 10 ]; then
    echo "$name skipped: no time left" | tee -a "$STATUS"; RC[$name]=skipped; return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$(date +%s)
  echo "== $name (timeout ${limit}s): $*" >&2
  timeout -k 10 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && echo "(timed out after ${limit}s)" >> "$OUT_DIR/$name.log"
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$STATUS"
  RC[$name]=$rc
  return 0
}

cd "$REPO"
(command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1) || true

# build: the package as a user gets it; an in-place build if pip cannot
step build 240 "$PY" -m pip install --no-build-isolation --no-deps --no-index -v "$REPO"
PYTHONPATH_TESTS=""
if [ "${RC[build]}" != "0" ]; then
  step build_inplace 200 "$PY" "$REPO/setup.py" build_ext --inplace
  PYTHONPATH_TESTS="$REPO"
fi
export PYTHONPATH="${PYTHONPATH_TESTS}${PYTHONPATH:+:$PYTHONPATH}"

cd "$RUN_DIR"
step env 60 "$PY" "$REPO/benchmarks/gpu_check.py" env --out "$OUT_DIR"
TIMEOUT_OPT=()   # per-test deadlines when pytest-timeout is there; the step's timeout bounds the rest
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT_OPT=(--timeout 150)
# with pytest-xdist, the tests run in one worker process: a test that crashes it (a segfault inside a
# library) is reported as failed and the rest still run; tests/gpu/conftest.py writes each failure at once
"$PY" -c "import xdist" 2>/dev/null && TIMEOUT_OPT+=(-n 1)
# two runs, each with its own deadline and junit file: one hang cannot empty the other's results;
# faulthandler prints every thread's stack when a test runs past 100 s
MULTI="two_ranks or shrink or hung_collective"
step tests_one_rank 150 "$PY" -m pytest -p no:cacheprovider -v -rA "${TIMEOUT_OPT[@]}" -o faulthandler_timeout=100 \
  --junitxml "$OUT_DIR/gpu_tests_one_rank.xml" -k "not ($MULTI)" "$REPO/tests/gpu"
step tests_multi_rank 170 "$PY" -m pytest -p no:cacheprovider -v -rA "${TIMEOUT_OPT[@]}" -o faulthandler_timeout=140 \
  --junitxml "$OUT_DIR/gpu_tests_multi_rank.xml" -k "$MULTI" "$REPO/tests/gpu/test_gpu.py" \
  "$REPO/tests/gpu/test_windows_gpu.py"
step overhead 90 "$PY" "$REPO/benchmarks/gpu_check.py" overhead --out "$OUT_DIR"
step bench1 60 "$PY" -m pycoll.bench all_reduce,all_gather,broadcast -n 1 --backend nccl -b 8 -e 64M -f 8 \
  -N 20 -w 5 --op-timeout 30 --json "$OUT_DIR/bench1.json"
# two ranks on one GPU need NCCL >= 2.30 (older ones refuse a duplicated GPU): skipped, with the version, below
if NCCL_VERSION=$("$PY" -c "import sys, pycoll._bindings as b; v = b.load('nccl').version_tuple
print('.'.join(map(str, v))); sys.exit(tuple(v) < (2, 30, 0))" 2>/dev/null); then
  step bench2 60 env NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_CTAS=2 "$PY" -m pycoll.bench all_reduce -n 2 --backend nccl -b 8 -e 64M -f 8 -N 20 -w 5 \
    --op-timeout 30 --timeout 50 --json "$OUT_DIR/bench2.json"
else
  echo "bench2 skipped: NCCL ${NCCL_VERSION:-not found} has no multi-rank GPU support (2.30+)" | tee -a "$STATUS"
  RC[bench2]=skipped
fi

# summary
{
  echo "{"
  echo "  \"seconds\": $(( $(date +%s) - START )),"
  first=1
  for k in "${!RC[@]}"; do
    [ $first -eq 1 ] || echo ","
    printf '  "%s": "%s"' "$k" "${RC[$k]}"
    first=0
  done
  echo ""
  echo "}"
} > "$OUT_DIR/summary.json"
echo "total seconds=$(( $(date +%s) - START ))" | tee -a "$STATUS"
for t in tests_one_rank tests_multi_rank; do
  grep -E "passed|failed|skipped|error" "$OUT_DIR/$t.log" | tail -1 | sed "s/^/$t: /" >> "$STATUS" 2>/dev/null || true
done

for k in build tests_one_rank tests_multi_rank; do
  v="${RC[$k]:-missing}"
  if [ "$k" = build ] && [ "$v" != 0 ] && [ "${RC[build_inplace]:-1}" = 0 ]; then continue; fi
  if [ "$k" != build ] && [ "$v" = 5 ]; then continue; fi
  if [ "$v" != 0 ]; then exit 1; fi
done
exit 0
