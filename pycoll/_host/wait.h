/* Waiting: spin briefly, then sched_yield, then sleep on a futex with a short timeout. Posters
 * only issue a wake-up system call when someone sleeps. Peer processes are watched through their
 * life words (segment.h) and pidfds, so a dead peer (also an unreaped zombie) is noticed while waiting. */
#ifndef PYCOLL_WAIT_H
#define PYCOLL_WAIT_H

#include "core.h"

/* A futex word in shared memory plus a count of sleepers; one per segment. */
struct doorbell {
  _Alignas(64) uint32_t seq;
  _Alignas(64) uint32_t sleepers;
};

/* Wakes the sleepers of `d`, if any, after a store that they may be waiting for. */
static inline void doorbell_ring(struct doorbell* d) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (UNLIKELY(__atomic_load_n(&d->sleepers, __ATOMIC_RELAXED))) {
    void doorbell_wake(struct doorbell * d);
    doorbell_wake(d);
  }
}
void doorbell_wake(struct doorbell* d);

int futex_wait(uint32_t* addr, uint32_t expected, uint64_t timeout_ns, bool shared);
void futex_wake(uint32_t* addr, bool shared);

/* A pidfd of process `pid`, or -errno: -ESRCH where it is gone; -ENOSYS, -EPERM (a kernel before 5.3, a seccomp
 * filter), -EMFILE (out of descriptors) and the like where the process may live but cannot be watched so. */
int pidfd_open_pid(int32_t pid);
/* 1 when the process behind `fd` has exited (also as a zombie), 0 when running. */
int pidfd_exited(int fd);
/* Puts the threads of a dead peer's process (still exiting: `pidfd` not readable) on SCHED_IDLE. */
void idle_dead_process(int32_t pid, int pidfd);

/* Backoff of one waiter. `phase` tells the caller what to do next. */
enum wait_phase { WAIT_SPIN = 0, WAIT_YIELD, WAIT_SLEEP };
/* How the waits of an operation for its peers ended of late (one record per communicator, under its exec_mu), which
 * sets how long such a wait yields before it sleeps (PYCOLL_HOST_YIELD_ADAPT). Without other load, a wait that yields
 * ends before it sleeps (four ranks on two CPUs: 1-2 in 3,000 of the waits that yielded slept). Where other
 * processes compete for the CPUs, a yield mostly returns at once and the peer runs only when the scheduler gives it
 * its turn: the waiter spins through its yielding phase, taking its share of a CPU from the peers it waits for,
 * and then sleeps anyway (four ranks beside two busy processes on two CPUs: two in three); a sleeper is woken by
 * the post it waits for (the doorbell) and, having slept, runs at once. The record averages the outcomes (slept or
 * not) of the waits that yielded with the whole PYCOLL_HOST_YIELD_NS, 1/64 per wait: above one half the waits
 * yield only 25 us before they sleep ("brief"), below one quarter the whole budget again; while brief, every 32nd
 * wait yields the whole budget and is counted, so that the record sees the load go. */
struct yield_record {
  const char* name; /* whose (its communicator's name), for the log */
  uint32_t slept;   /* the average, 65536: all slept */
  uint32_t waits;   /* waits begun while brief */
  bool brief;
  bool yielded;     /* the last wait counted yielded; its outcome is not counted yet */
};

struct backoff {
  uint32_t iter;
  uint64_t start;
  uint64_t last_check;
  uint64_t sleep_ns;
  uint64_t spin_ns;
  uint64_t now; /* the clock (now_ns) as the last backoff_step read it; 0: that step read none */
  uint64_t yield_ns; /* how long this wait yields before it sleeps */
  bool oversubscribed;
  struct yield_record* record; /* its outcome counts there (backoff_reset_adaptive); NULL: not counted */
};

/* A new wait. `oversubscribed`: more ranks than CPUs, so spinning only delays the peers we wait for. */
void backoff_reset(struct backoff* b, bool oversubscribed);
/* The same for a wait of an operation for its peers, whose yielding phase adapts to how the waits counted in `r`
 * ended of late (struct yield_record); the caller holds what guards `r` (NULL: as backoff_reset). */
void backoff_reset_adaptive(struct backoff* b, bool oversubscribed, struct yield_record* r);
/* The wait yields briefly (its record says so). */
bool backoff_brief(const struct backoff* b);
/* Progress made: spin again from the start; the looks at the peers' processes (backoff_due) keep their clock. */
void backoff_restart(struct backoff* b, bool oversubscribed);
/* Waits a little according to the current phase (spin or yield) and returns the phase. When it
 * returns WAIT_SLEEP the caller should sleep (e.g. on a doorbell) for backoff_sleep_ns(). It reads the
 * clock on the first step and on every step after the first short spins, and leaves that reading in
 * `now` (0 where it read none): a waiter's loop looks at its deadline with it instead of a read of its
 * own, so that a round costs one clock read, and the first short spins none. */
enum wait_phase backoff_step(struct backoff* b);
uint64_t backoff_sleep_ns(struct backoff* b);
/* True about every `interval_ns` (for the slower checks: peer liveness), the first time `interval_ns` after
 * it was first asked in this wait: a wait that ends sooner makes no slow check (one per wait would be a
 * system call in nearly every operation where the ranks outnumber the CPUs). */
bool backoff_due(struct backoff* b, uint64_t interval_ns); /* with `now` where the last step read it */
/* How often a waiter looks for dead peers (pidfd polls), and the longest sleep between looks
 * (PYCOLL_HOST_PEER_CHECK_NS, 1 ms). A peer process of this host that exits is found at once anyway:
 * the exit watcher (exitwatch.h) wakes the waiters; the looks catch what it cannot see. */
extern uint64_t peer_check_ns;

/* Sleeps on `d` unless `still_blocked(arg)` turns false after registering as a sleeper. */
void doorbell_sleep(struct doorbell* d, uint64_t timeout_ns, bool (*still_blocked)(void*), void* arg);
/* The same, and wakes as well when the peer whose life word (segment.h) is `life` dies (futex_waitv;
 * on kernels before 5.16, or where seccomp refuses it, the plain sleep, and the periodic look at the
 * peers finds the death). Returns at once when the word already says so. `life` NULL or 0: the plain
 * sleep. */
void doorbell_sleep_on(struct doorbell* d, uint32_t* life, uint64_t timeout_ns, bool (*still_blocked)(void*),
                       void* arg);

/* Where a communicator's ranks do not outnumber the CPUs, two of them that wait for each other on one CPU share it
 * by an accident of placement: each runs only when the other yields, while another CPU runs something else. The
 * kernel's balancer leaves them so (two tasks here, one there balances as well as it can); a sleeper woken next to
 * its waker most likely puts them there. Where they outnumber the CPUs, one CPU can hold two ranks more than another
 * (three and one for four ranks on two CPUs) for as long as none of them sleeps: every operation then waits for the
 * three that take turns, while the one alone spins. Moves the calling thread off `cpu` to CPU `to` (-1: to another
 * CPU) of its own affinity mask, which it then restores as it was: true when it moved. Never where the mask holds one
 * CPU (a thread pinned stays where it is), at most once every SPREAD_EVERY_NS per thread, not at all with
 * PYCOLL_HOST_SPREAD=0. */
bool spread_from(int cpu, int to);

int host_ncpus(void);
/* A communicator of this process has more ranks on this machine than it has CPUs (set at its init, never
 * cleared): a thread that waits for work (a stream's) sleeps at once instead of spinning first. */
void host_note_oversubscribed(void);
bool host_oversubscribed(void);

#endif
