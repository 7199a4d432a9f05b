#include "wait.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "debug.h"
#include "env.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#define WAITV_U32 0x02 /* FUTEX2_SIZE_U32 */

struct waitv { /* struct futex_waitv (Linux 5.16) */
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
static bool waitv_missing;

int futex_wait(uint32_t* addr, uint32_t expected, uint64_t timeout_ns, bool shared) {
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
  int op = shared ? FUTEX_WAIT : (FUTEX_WAIT | FUTEX_PRIVATE_FLAG);
  long r = syscall(SYS_futex, addr, op, expected, &ts, NULL, 0);
  return r == 0 ? 0 : errno;
}

void futex_wake(uint32_t* addr, bool shared) {
  int op = shared ? FUTEX_WAKE : (FUTEX_WAKE | FUTEX_PRIVATE_FLAG);
  syscall(SYS_futex, addr, op, INT_MAX, NULL, NULL, 0);
}

void doorbell_wake(struct doorbell* d) {
  __atomic_fetch_add(&d->seq, 1, __ATOMIC_SEQ_CST);
  futex_wake(&d->seq, true);
}

/* Sleeps on the doorbell (its value `seq`) and on a life word (its value `v`) at once. False when the
 * kernel has no futex_waitv (ENOSYS before Linux 5.16) or a seccomp profile that does not know it
 * refuses it (EPERM): the caller then sleeps on the doorbell alone, now and from then on (returning at
 * once instead would turn every later sleep into a spin). */
static bool sleep_waitv(struct doorbell* d, uint32_t seq, uint32_t* life, uint32_t v, uint64_t timeout_ns) {
  struct waitv w[2] = {{seq, (uintptr_t)&d->seq, WAITV_U32, 0}, {v, (uintptr_t)life, WAITV_U32, 0}};
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t end = (uint64_t)ts.tv_nsec + timeout_ns;
  ts.tv_sec += (time_t)(end / 1000000000ull);
  ts.tv_nsec = (long)(end % 1000000000ull);
  if (syscall(SYS_futex_waitv, w, 2, 0, &ts, CLOCK_MONOTONIC) < 0 && errno != EAGAIN && errno != ETIMEDOUT &&
      errno != EINTR) {
    waitv_missing = true;
    return false;
  }
  return true;
}

void doorbell_sleep_on(struct doorbell* d, uint32_t* life, uint64_t timeout_ns, bool (*still_blocked)(void*),
                       void* arg) {
  uint32_t v = life && !waitv_missing ? __atomic_load_n(life, __ATOMIC_ACQUIRE) : 0;
  if (v & FUTEX_OWNER_DIED) return; /* dead already: the caller's look at the peer says so */
  __atomic_fetch_add(&d->sleepers, 1, __ATOMIC_SEQ_CST);
  uint32_t seq = __atomic_load_n(&d->seq, __ATOMIC_SEQ_CST);
  if ((!still_blocked || still_blocked(arg)) && !(v && sleep_waitv(d, seq, life, v, timeout_ns)))
    futex_wait(&d->seq, seq, timeout_ns, true);
  __atomic_fetch_sub(&d->sleepers, 1, __ATOMIC_SEQ_CST);
}

void doorbell_sleep(struct doorbell* d, uint64_t timeout_ns, bool (*still_blocked)(void*), void* arg) {
  doorbell_sleep_on(d, NULL, timeout_ns, still_blocked, arg);
}

int pidfd_open_pid(int32_t pid) {
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -(errno ? errno : ESRCH) : (int)fd;
}

int pidfd_exited(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  int r = poll(&p, 1, 0);
  return r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) ? 1 : 0;
}

/* A peer process found dead: the kernel still has to free its memory, in the context of its last
 * thread, which can take milliseconds of CPU for a big process. Lower that to SCHED_IDLE (the
 * survivors' recovery runs first; the teardown uses idle CPU). Only while its pidfd says it has not
 * exited yet (so that the pid cannot have been reaped and reused); allowed to any process of the
 * same user. PYCOLL_HOST_IDLE_DEAD=0 leaves it alone. */
static uint64_t idle_dead = 1;

void idle_dead_process(int32_t pid, int pidfd) {
  if (!idle_dead || pid <= 0 || pidfd < 0 || pidfd_exited(pidfd)) return;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR* d = opendir(path);
  if (!d) return;
  struct sched_param sp = {0};
  for (struct dirent* e; (e = readdir(d));) {
    long tid = strtol(e->d_name, NULL, 10);
    if (tid > 0) sched_setscheduler((pid_t)tid, SCHED_IDLE, &sp); /* ESRCH for a thread gone meanwhile */
  }
  closedir(d);
}

int host_ncpus(void) {
  static int n;
  if (!n) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
  }
  return n;
}

static bool oversubscribed_seen;
void host_note_oversubscribed(void) { __atomic_store_n(&oversubscribed_seen, true, __ATOMIC_RELAXED); }
bool host_oversubscribed(void) { return __atomic_load_n(&oversubscribed_seen, __ATOMIC_RELAXED); }

#define SPREAD_EVERY_NS 10000000ull
static uint64_t spread = 1; /* PYCOLL_HOST_SPREAD */

bool spread_from(int cpu, int to) {
  static __thread uint64_t last; /* this thread's last try */
  if (!spread || cpu < 0 || cpu >= CPU_SETSIZE || to >= CPU_SETSIZE || to == cpu) return false;
  uint64_t t = now_ns();
  if (last && t - last < SPREAD_EVERY_NS) return false;
  last = t;
  cpu_set_t mask, elsewhere;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0 || CPU_COUNT(&mask) < 2 || !CPU_ISSET(cpu, &mask) ||
      (to >= 0 && !CPU_ISSET(to, &mask)))
    return false;
  if (to >= 0) {
    CPU_ZERO(&elsewhere);
    CPU_SET(to, &elsewhere);
  } else {
    elsewhere = mask;
    CPU_CLR(cpu, &elsewhere);
  }
  /* the kernel moves the thread as the call returns; the mask restored, it stays there until it balances again */
  if (sched_setaffinity(0, sizeof elsewhere, &elsewhere) != 0) return false;
  if (sched_setaffinity(0, sizeof mask, &mask) != 0)
    WARN("wait : could not restore this thread's CPU affinity mask after moving it off CPU %d: %s (it keeps %d of "
         "its %d CPUs; PYCOLL_HOST_SPREAD=0 turns these moves off)", cpu, strerror(errno), CPU_COUNT(&elsewhere),
         CPU_COUNT(&mask));
  return true;
}

/* Tunables (nanoseconds): how long to spin, then to yield, before sleeping; sleep bounds. */
uint64_t peer_check_ns = 1000000;
static uint64_t spin_ns = 50000, yield_ns = 300000, sleep_min_ns = 200000, sleep_max_ns = 1000000;

/* PYCOLL_HOST_YIELD_ADAPT (wait.h: struct yield_record) */
static uint64_t yield_adapt = 1;
#define SHORT_YIELD_NS 25000ull
#define RECORD_ONE 65536u /* the record's fixed point: slept every time */
#define FULL_EVERY 32u

static void yield_record(struct yield_record* r, bool slept) {
  r->yielded = false;
  if (slept) r->slept += (RECORD_ONE - r->slept) / 64;
  else r->slept -= r->slept / 64;
  bool was = r->brief;
  if (!r->brief && r->slept > RECORD_ONE / 2) r->brief = true;
  else if (r->brief && r->slept < RECORD_ONE / 4) r->brief = false;
  if (r->brief != was)
    INFO("wait : the waits of communicator '%s' for its peers yield %s before they sleep now: %u%% of those that "
         "yielded %.3g ms slept of late (PYCOLL_HOST_YIELD_ADAPT)", r->name && r->name[0] ? r->name : "(unnamed)",
         r->brief ? "25 us" : "the whole PYCOLL_HOST_YIELD_NS", (unsigned)((uint64_t)r->slept * 100 / RECORD_ONE),
         (double)yield_ns / 1e6);
}

__attribute__((constructor)) static void wait_tunables(void) {
  env_u64("PYCOLL_HOST_SPIN_NS", 0, ENV_NS_MAX, spin_ns, &spin_ns);
  env_u64("PYCOLL_HOST_YIELD_NS", 0, ENV_NS_MAX, yield_ns, &yield_ns);
  env_u64("PYCOLL_HOST_YIELD_ADAPT", 0, 1, yield_adapt, &yield_adapt);
  env_u64("PYCOLL_HOST_PEER_CHECK_NS", ENV_PEER_CHECK_MIN_NS, ENV_NS_MAX, peer_check_ns, &peer_check_ns);
  sleep_max_ns = peer_check_ns;
  env_u64("PYCOLL_HOST_IDLE_DEAD", 0, 1, idle_dead, &idle_dead);
  env_u64("PYCOLL_HOST_SPREAD", 0, 1, spread, &spread);
}

void backoff_reset(struct backoff* b, bool oversubscribed) {
  b->last_check = 0;
  b->record = NULL;
  b->yield_ns = yield_ns;
  backoff_restart(b, oversubscribed);
}

void backoff_reset_adaptive(struct backoff* b, bool oversubscribed, struct yield_record* r) {
  backoff_reset(b, oversubscribed);
  if (!yield_adapt || !r) return;
  if (r->yielded) yield_record(r, false); /* the last wait it counted ended while it yielded */
  if (!r->brief || ++r->waits % FULL_EVERY == 0) b->record = r;
  else b->yield_ns = MIN(yield_ns, SHORT_YIELD_NS);
}

bool backoff_brief(const struct backoff* b) { return b->yield_ns < yield_ns; }

void backoff_restart(struct backoff* b, bool oversubscribed) {
  b->iter = 0;
  b->start = b->now = 0;
  b->sleep_ns = sleep_min_ns;
  b->spin_ns = oversubscribed ? 500 : spin_ns;
  b->oversubscribed = oversubscribed;
}

enum wait_phase backoff_step(struct backoff* b) {
  b->now = b->iter == 0 ? (b->start = now_ns()) : 0;
  /* a few short spins first -- 4 rounds where the ranks outnumber the CPUs, whose spin_ns (0.5 us) 16 rounds of 4
   * `pause` would outlast before the first look at the clock -- unless the ranks outnumber the CPUs and the peer
   * waited for last ran on this CPU (spin_ns 0: spin_or_yield in enqueue.c): it runs only once this thread yields */
  if (++b->iter < (b->oversubscribed ? 4u : 16u) && !(b->oversubscribed && b->spin_ns == 0)) {
    for (int i = 0; i < 4; i++) cpu_relax();
    return WAIT_SPIN;
  }
  if (!b->now) b->now = now_ns();
  uint64_t elapsed = b->now - b->start;
  if (elapsed < b->spin_ns) {
    for (int i = 0; i < 8; i++) cpu_relax();
    return WAIT_SPIN;
  }
  if (elapsed < b->spin_ns + b->yield_ns) {
    if (b->record) b->record->yielded = true;
    sched_yield();
    return WAIT_YIELD;
  }
  /* counted once: yield_record clears `yielded`, which only a yield sets again (after progress restarted the wait) */
  if (b->record && b->record->yielded) yield_record(b->record, true);
  return WAIT_SLEEP;
}

uint64_t backoff_sleep_ns(struct backoff* b) {
  uint64_t s = b->sleep_ns;
  b->sleep_ns = MIN(b->sleep_ns * 2, sleep_max_ns);
  return s;
}

bool backoff_due(struct backoff* b, uint64_t interval_ns) {
  uint64_t t = b->now ? b->now : now_ns();
  if (b->last_check == 0) { /* the first ask starts the clock */
    b->last_check = t;
    return false;
  }
  if (t - b->last_check >= interval_ns) {
    b->last_check = t;
    return true;
  }
  return false;
}
