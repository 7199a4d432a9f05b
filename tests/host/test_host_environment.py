"""The host library on machines that give it less: a small ``/dev/shm``, a kernel that refuses pidfds.

* A container's ``/dev/shm`` is often 64 MiB, and the segment of a communicator of 8 ranks takes 35 MiB. Where
  room is short (less than 16 segments' worth free) the segment's pages are taken when it is created
  (``posix_fallocate``): a ``/dev/shm`` too small for it is a clear error at the communicator's creation, not a
  SIGBUS in the rank that first writes past the room there was.
* ``pidfd_open`` is refused before Linux 5.3, by some seccomp filters and under valgrind (ENOSYS, EPERM), and fails
  when a process is out of descriptors (EMFILE). A peer without a pidfd was taken for gone: the first wait for it
  long enough to look at its process (1 ms) failed with "rank k exited". Such a peer is now watched through its
  life word and /proc.

The small ``/dev/shm`` is a tmpfs mounted over it in a mount namespace of the test's own (``unshare -m``: root, or
a kernel that lets the user make one); the refused syscalls come from a ``syscall`` wrapper preloaded into the ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.fake_nccl import preload_kit
from helpers.host_util import uid

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_all(procs: list, timeout: float, groups: bool = False) -> list:
    """The (returncode, stdout, stderr) of each of ``procs``, which are killed and reaped whatever happens; with
    ``groups`` (each started in a session of its own) their process groups too: a launcher's ranks go with it."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if groups:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.kill()
            p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


# ---- a /dev/shm too small for the segment ---------------------------------------------------------------------

SHM_RANK = textwrap.dedent("""
    import sys
    import numpy as np
    import pycoll
    from pycoll.errors import CommAborted, NCCLSystemError
    try:
        comm = pycoll.init(backend="host", timeout=30, name="shm")
    except (NCCLSystemError, CommAborted) as e:  # a rank whose init found the first one's given up: CommAborted
        print("init failed:", type(e).__name__, e)
        sys.exit(0)
    x = np.ones(4 << 20, np.float32)  # 16 MiB: the chunks go through the whole of each rank's inbox
    comm.all_reduce(x)
    assert (x == comm.size).all(), x[:4]
    print("ok")
    comm.destroy()
""")


def _private_shm_ok() -> bool:
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def private_shm():
    if not _private_shm_ok():
        pytest.skip("needs a mount namespace of its own with a tmpfs over /dev/shm (unshare -m; root)")


def _ranks_in_small_shm(tmp_path, size: str, n: int) -> tuple:
    script = tmp_path / "rank.py"
    script.write_text(SHM_RANK)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # the launcher and its ranks in one mount namespace, whose /dev/shm is a fresh tmpfs of `size`; it goes with them
    cmd = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh",
           sys.executable, "-m", "pycoll.run", "-n", str(n), "--timeout", "60", str(script)]
    (rc, out, err), = _run_all([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                 text=True, start_new_session=True)], timeout=90, groups=True)
    return rc, out + err


def test_a_dev_shm_too_small_for_the_segment_fails_the_creation_clearly(private_shm, tmp_path):
    """Two ranks need a 7 MiB segment; /dev/shm has 4 MiB. Before, the segment was made sparse, the creation
    succeeded and the 16 MiB all_reduce killed a rank with SIGBUS as it wrote past 4 MiB. Now every rank's
    creation fails with an error that says what is missing and what to do."""
    rc, text = _ranks_in_small_shm(tmp_path, "4m", 2)
    assert "SIGBUS" not in text and "ok" not in text.split(), text
    assert rc == 0, text
    fails = [line for line in text.splitlines() if "init failed:" in line]
    assert len(fails) == 2, text
    for line in fails:
        assert "not enough shared memory in /dev/shm" in line, line
        assert "2 ranks need" in line and "MiB are free" in line and "--shm-size" in line, line


def test_a_dev_shm_with_room_for_the_segment_serves_it_whole(private_shm, tmp_path):
    """The same ranks with 16 MiB of /dev/shm: the segment's pages are all there, the all_reduce is right."""
    rc, text = _ranks_in_small_shm(tmp_path, "16m", 2)
    assert rc == 0, text
    assert text.split().count("ok") == 2, text


# ---- no pidfds -------------------------------------------------------------------------------------------------

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/syscall.h>
#define EXPORT __attribute__((visibility("default")))
/* the library's pidfd_open (and, with SHIM_NO_ROBUST, its exit watcher's set_robust_list) refused as by an
 * old kernel; every other syscall() goes through */
EXPORT long syscall(long n, ...) {
  static long (*real)(long, ...);
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  va_list ap;
  va_start(ap, n);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (n == 434 || (n == SYS_set_robust_list && getenv("SHIM_NO_ROBUST"))) {
    errno = ENOSYS;
    return -1;
  }
  return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
"""

PIDFD_RANK = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from pycoll._bindings import DataType, RedOp, UniqueId, load
    idhex, rank = sys.argv[1], int(sys.argv[2])
    lib = load("host")
    comm = lib.comm_init_rank(2, UniqueId(bytes.fromhex(idhex)), rank)
    a, b = np.full(4, rank + 1, np.float32), np.zeros(4, np.float32)
    def all_reduce():
        lib.all_reduce(a.ctypes.data, b.ctypes.data, 4, int(DataType.Float32), int(RedOp.Sum), comm, 0)
    for i in range(200):
        if rank == 1 and i == 100:
            time.sleep(0.2)  # rank 0 waits long enough to look at rank 1's process
        all_reduce()
        assert (b == 3).all(), b
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        all_reduce()
    except Exception as e:
        print(f"{time.monotonic() - t0:.3f} {type(e).__name__}: {e}")
    else:
        print("no error")
""")


@pytest.fixture(scope="module")
def syscall_shim(tmp_path_factory):
    return Path(preload_kit(str(tmp_path_factory.mktemp("nopidfd")), SHIM, PIDFD_RANK, "syscall wrapper"))


@pytest.mark.parametrize("robust", [True, False], ids=["life-word", "no-robust-list"])
def test_peers_without_pidfds_run_and_a_killed_one_is_found(syscall_shim, robust):
    """pidfd_open refused in both ranks: 200 all_reduce run right, one of them waited for 0.2 s (before: the first
    wait long enough to look at the peer's process failed, "rank 1 exited"), then
    rank 1 is killed while rank 0 waits in the next one, which fails within seconds: through the peer's life word
    (a robust futex), or where the exit watcher has no robust list either, through /proc (a zombie or no entry),
    read at the waiter's looks at its peers (every PYCOLL_HOST_PEER_CHECK_NS)."""
    env = dict(os.environ, LD_PRELOAD=str(syscall_shim / "shim.so"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not robust:
        env["SHIM_NO_ROBUST"] = "1"
    ident = uid().hex()
    procs = [subprocess.Popen([sys.executable, str(syscall_shim / "rank.py"), ident, str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    (rc0, out0, err0), (rc1, _, err1) = _run_all(procs, timeout=60)
    assert rc1 == -9, err1  # killed after its 200 operations, not failed before
    assert rc0 == 0, err0
    waited, kind, text = out0.split(" ", 2)
    assert kind == "RemoteError:" and "rank 1" in text and "exited" in text, out0
    assert float(waited) < 5.0, out0
