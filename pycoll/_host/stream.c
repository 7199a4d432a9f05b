#include "stream.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "debug.h"
#include "env.h"
#include "failpoint.h"
#include "handles.h"
#include "wait.h"

#define STREAM_MAGIC 0x73747265616d6c76ull
#define EVENT_MAGIC 0x6576656e746c6976ull

/* A point in a stream's order that completes when the stream reaches it. */
struct marker {
  int refs;
  uint32_t done;
  uint32_t sleepers; /* threads asleep (or about to be) on `done`: a fire without any makes no syscall */
  uint64_t t_ns;
  /* the operations that ended failed on `counted_on` (NULL: in the process) as it completed: two records on one
   * stream with the same count have no failed operation of that stream between them (events_clean) */
  uint64_t failed;
  struct pycollStream* counted_on;
  struct pycollStream* stream; /* the stream whose thread fires it (a record), else NULL */
};

enum item_kind { IT_TASKS, IT_RECORD, IT_WAIT, IT_STOP };

struct item {
  int kind;
  struct task* tasks;
  struct marker* m;
  struct item* next;
};

struct pycollStream {
  uint64_t magic;
  unsigned fork_gen; /* stream_fork_gen when it was made: a forked child has none of its parent's stream threads */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work;
  pthread_cond_t idle;
  struct item *head, *tail;
  uint64_t enqueued, completed;
  bool sleeping;
  int flags;        /* PYCOLL_STREAM_* */
  bool inline_busy; /* the caller's thread is running this stream's work (see stream_submit) */
  bool running;     /* the stream's thread is running an item it took off the queue */
  /* Where the ranks outnumber the CPUs the idle thread sleeps in poll() on `kick_fd`, a timerfd, which a
   * push arms: at once, or -- work a waiter may run itself (PYCOLL_STREAM_HELP) -- after defer_ns. */
  int kick_fd;      /* -1: none (the thread sleeps on `work`) */
  bool kick_sleep;  /* the thread sleeps in poll() on kick_fd */
  uint64_t kick_at; /* when kick_fd fires (monotonic ns; 1: at once); 0: disarmed */
  /* Until when (monotonic ns; 0: no one) the work at the head, handed back by a thread that is not the stream's own
   * and will wait for it (reserve_locked), is left to that thread: the stream's thread takes it only after that */
  uint64_t reserved_until;
  /* The bound on what is queued (PYCOLL_HOST_STREAM_DEPTH): `queued` counts the task lists (an operation, or a
   * group's operations on this stream) in the queue that no thread has taken yet; a push of one more onto a full
   * queue waits (wait_room_locked) on the futex word `room`, which a thread that takes a task list off the queue
   * bumps and wakes while `room_waiters` is not 0 (room_taken_locked). `destroying`: pycollStreamDestroy has begun,
   * a waiter leaves. */
  uint64_t queued;
  uint32_t room;
  int room_waiters;
  bool destroying;
  struct pycollGraph* capture; /* the graph work submitted now is recorded into, instead of run */
  uint64_t failed; /* its operations that ended failed (stream_note_failed) */
  struct pycollStream* blocking_next; /* in the list of PYCOLL_STREAM_BLOCKING streams */
};

/* A graph: the task lists submitted to a stream while it captured, re-submitted at each launch. */
struct gnode {
  struct task* tasks;
  struct gnode* next;
};

#define GRAPH_MAGIC 0x6772617068706367ull

struct pycollGraph {
  uint64_t magic;
  struct gnode *head, *tail;
};

struct pycollEvent {
  uint64_t magic;
  uint32_t lock;    /* a spin lock (spin_lock) over m */
  struct marker* m; /* the most recent record; NULL if never recorded */
};

/* A spin lock for critical sections of a few instructions (an event's marker, a communicator's last task: every
 * operation takes such locks several times): two atomic operations, where a mutex's lock and unlock cost about 50
 * instructions; a holder descheduled meanwhile costs the others yields. */
static inline void spin_lock(uint32_t* l) {
  while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) sched_yield();
}

static inline void spin_unlock(uint32_t* l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

static struct marker* marker_new(void) {
  struct marker* m = calloc(1, sizeof *m);
  if (m) m->refs = 1;
  return m;
}

static void marker_ref(struct marker* m) { __atomic_add_fetch(&m->refs, 1, __ATOMIC_ACQ_REL); }

void marker_release(void* m_) {
  struct marker* m = m_;
  if (m && __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) free(m);
}

static uint64_t failed_count(struct pycollStream* s) {
  return __atomic_load_n(s ? &s->failed : &host_tasks_failed, __ATOMIC_SEQ_CST);
}

void stream_note_failed(pycollStream_t s) {
  if ((uintptr_t)s > 2) __atomic_add_fetch(&((struct pycollStream*)s)->failed, 1, __ATOMIC_SEQ_CST);
}

void marker_fire(void* m_) {
  struct marker* m = m_;
  if (__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) return;
  m->t_ns = now_ns();
  m->failed = failed_count(m->counted_on);
  /* sequentially consistent on both sides: a sleeper registered before this store is seen below, and
   * one registering after it sees `done` set (or its futex_wait finds the word changed) */
  __atomic_store_n(&m->done, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&m->sleepers, __ATOMIC_SEQ_CST)) futex_wake(&m->done, false);
}

/* Waits for `m` to complete, at most `timeout_ns` (UINT64_MAX: forever); true once complete. */
static bool marker_wait_for(struct marker* m, uint64_t timeout_ns) {
  if (__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) return true; /* no look at the clock */
  struct backoff b;
  backoff_reset(&b, true);
  uint64_t t0 = timeout_ns == UINT64_MAX ? 0 : now_ns();
  while (!__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) {
    uint64_t left = 10000000;
    if (timeout_ns != UINT64_MAX) {
      uint64_t spent = now_ns() - t0;
      if (spent >= timeout_ns) return false;
      if (timeout_ns - spent < left) left = timeout_ns - spent;
    }
    /* where the ranks outnumber the CPUs, the thread that fires `m` needs this CPU: no yielding round */
    enum wait_phase ph = backoff_step(&b);
    if (ph == WAIT_SLEEP || (ph == WAIT_YIELD && host_oversubscribed())) {
      __atomic_add_fetch(&m->sleepers, 1, __ATOMIC_SEQ_CST);
      if (!__atomic_load_n(&m->done, __ATOMIC_SEQ_CST)) futex_wait(&m->done, 0, left, false);
      __atomic_sub_fetch(&m->sleepers, 1, __ATOMIC_SEQ_CST);
    }
  }
  return true;
}

static void marker_wait(struct marker* m) { marker_wait_for(m, UINT64_MAX); }

/* PYCOLL_HOST_DEFER_NS: where the ranks outnumber the CPUs, how long work queued on a helping stream
 * (PYCOLL_STREAM_HELP) waits for a thread that waits for it -- which runs it in its own thread, one wake-up
 * and two thread switches fewer, on CPUs the ranks share -- before the stream's thread is woken to run it;
 * and, at any rank count, how long work handed back by the thread that will wait for it is left to that thread
 * (reserve_locked). 0: woken at once, nothing left to anyone. */
static uint64_t defer_ns = 1000000;

/* PYCOLL_HOST_INLINE_NS: the longest the caller of an operation on an idle PYCOLL_STREAM_INLINE stream runs the
 * stream's work at a time. Then it hands what is unfinished back to the stream and goes back to its caller, which may
 * have a deadline to keep or a signal to handle; the caller's wait takes it up again (stream_help) unless the stream's
 * thread took it over by then (reserve_locked). */
static uint64_t inline_ns = 10000000;

/* PYCOLL_HOST_EAGER: small collectives queued on an idle helping stream get a pass in the caller's thread
 * first (eager_begin) */
static bool eager_pass = true;

/* PYCOLL_HOST_STREAM_DEPTH: the most task lists (operations) a stream's queue holds that no thread has begun, as a
 * GPU's launch queue holds about 1024 kernels: the thread that queues one more waits until one is taken
 * (wait_room_locked), instead of running ahead of a slow peer by as many operations as memory holds. 0: no bound. */
static uint64_t stream_depth = 1024;

__attribute__((constructor)) static void stream_tunables(void) {
  uint64_t v;
  env_u64("PYCOLL_HOST_DEFER_NS", 0, ENV_DEFER_MAX_NS, defer_ns, &defer_ns);
  env_u64("PYCOLL_HOST_STREAM_DEPTH", 0, ENV_STREAM_DEPTH_MAX, stream_depth, &stream_depth);
  env_u64("PYCOLL_HOST_INLINE_NS", ENV_INLINE_MIN_NS, ENV_NS_MAX, inline_ns, &inline_ns);
  env_u64("PYCOLL_HOST_EAGER", 0, 1, 1, &v);
  eager_pass = v != 0;
}

/* Arms the sleeping thread's timer for `at` (1: at once) unless it fires earlier already (s->mu held). Setting a
 * timerfd fails only for a bad descriptor or value, neither of which this passes. */
static void kick(struct pycollStream* s, uint64_t at) {
  if (s->kick_at && s->kick_at <= at) return;
  struct itimerspec its = {{0, 0}, {(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)}};
  if (timerfd_settime(s->kick_fd, at == 1 ? 0 : TFD_TIMER_ABSTIME, &its, NULL) == 0) s->kick_at = at;
  else WARN("pycollStream : cannot arm the stream thread's timer: %s", strerror(errno));
}

/* Wakes the stream's thread, if it sleeps, for the work queued: at once, or when `deferred` after defer_ns
 * (s->mu held). */
static void wake(struct pycollStream* s, bool deferred) {
  if (!s->sleeping) return;
  if (s->kick_sleep) kick(s, s->reserved_until ? s->reserved_until : deferred ? now_ns() + defer_ns : 1);
  else pthread_cond_signal(&s->work); /* a reservation: the thread sleeps again until it ends (stream_main) */
}

/* The stream's thread takes what is queued now, not when a deferred wake or a reservation would, unless another
 * thread runs the stream's work (which wakes it when done) (s->mu held). */
static void hurry_locked(struct pycollStream* s) {
  s->reserved_until = 0;
  if (s->head && !s->inline_busy) wake(s, false);
}

/* Work a thread that is not the stream's own hands back at the head of a helping stream (PYCOLL_STREAM_HELP) because
 * its time ran out (inline_ns, or its own deadline) is left to it for defer_ns: a blocking caller or a waiter comes
 * back for it from its wait (stream_help), after a look at its deadline and signals, and goes on running it where
 * the stream's thread would otherwise take it over -- a thread switch and, with the ranks' CPUs busy, a cold start
 * on another CPU in the middle of an operation. Who does not come back in time leaves it to the stream's thread
 * (s->mu held). */
static void reserve_locked(struct pycollStream* s) {
  if (defer_ns && (__atomic_load_n(&s->flags, __ATOMIC_RELAXED) & PYCOLL_STREAM_HELP))
    s->reserved_until = now_ns() + defer_ns;
}

/* A task list left the queue (s->mu held). A thread waiting for room (wait_room_locked, pycollStreamWaitRoom) is
 * woken once a quarter of the bound is free, not at every one: it then queues that many without waiting, instead of
 * a wake-up and two thread switches per operation on CPUs that the stream's thread shares with it. */
static void room_taken_locked(struct pycollStream* s) {
  s->queued--;
  if (UNLIKELY(s->room_waiters) && s->queued + 1 + stream_depth / 4 <= stream_depth) {
    __atomic_add_fetch(&s->room, 1, __ATOMIC_SEQ_CST);
    futex_wake(&s->room, false);
  }
}

/* What ends a wait for room besides room: the failures that make the queued work of the list's communicators fail
 * too -- aborted (also by a shrink), revoked, failed (a peer found gone, a remote error), a peer that exited or
 * failed meanwhile (looked at here as well: the work at the head may be another communicator's). The error to
 * return, ncclSuccess while none. */
static ncclResult_t room_check(struct task* list) {
  char text[512];
  for (struct task* t = list; t; t = t->next) {
    struct ncclComm* c = t->comm;
    if (t != list && c == list->comm) continue;
    if (comm_aborting(c) || COMM_FLAG(c, revoked)) {
      int why = __atomic_load_n(&c->abort_reason, __ATOMIC_ACQUIRE);
      CWARN(c, "%s : communicator was %s while the operation waited for room on its stream (PYCOLL_HOST_STREAM_DEPTH "
            "operations queued)", t->opname, why == AB_REVOKE || COMM_FLAG(c, revoked) ? "revoked" :
            why == AB_SHRINK ? "shrunk with NCCL_SHRINK_ABORT" : "aborted");
      return ncclInvalidUsage;
    }
    int b = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
    if (b) {
      comm_copy_last_error(c, text, sizeof text);
      CWARN(c, "%s : communicator failed while the operation waited for room on its stream: %s", t->opname, text);
      return (ncclResult_t)b;
    }
    if (!comm_enter(c)) continue; /* aborting now: the next look says so */
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < c->nranks && r == ncclSuccess; k++) r = comm_check_peer(c, k, false, text, sizeof text);
    comm_leave(c);
    if (r != ncclSuccess) { /* the communicator fails as the work queued before would */
      char msg[700];
      snprintf(msg, sizeof msg, "%s : %s (while this rank waited for room on its stream)", t->opname, text);
      CWARN(c, "%s", msg);
      comm_fail(c, r, msg);
      return r;
    }
  }
  return ncclSuccess;
}

/* How long a thread waiting for room sleeps before it looks at the list's communicators again (room_check): an
 * abort or a failure of the work queued before it empties the queue anyway, which wakes it sooner. */
#define ROOM_LOOK_NS 10000000ull

/* Waits until `s` has room for one more task list (s->mu held; held again on return): ncclSuccess, or the error
 * that ended the wait -- the list's communicators failed (room_check), the stream is being destroyed. A signal
 * delivered to this thread ends it too, with success: the list is queued over the bound and the call returns, so
 * that the caller's handler runs (Python's, at once; Ctrl-C raises KeyboardInterrupt there). */
static ncclResult_t wait_room_locked(struct pycollStream* s, struct task* list) {
  s->room_waiters++;
  hurry_locked(s); /* the stream's thread takes the head now, not when a deferred wake or a reservation would */
  ncclResult_t r = ncclSuccess;
  bool first = true;
  while (s->queued >= stream_depth) {
    if (s->destroying) {
      WARN("%s : the stream was destroyed while the operation waited for room on it", list->opname);
      r = ncclInvalidUsage;
      break;
    }
    uint32_t seen = __atomic_load_n(&s->room, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->mu);
    if (first) {
      first = false;
      if (UNLIKELY(fp_hit("host.stream.full"))) {
        WARN("%s : failpoint host.stream.full", list->opname);
        r = ncclSystemError;
      }
      if (r == ncclSuccess) r = room_check(list);
    }
    int e = r == ncclSuccess ? futex_wait(&s->room, seen, ROOM_LOOK_NS, false) : 0;
    /* after each wake, also the one for room: an abort or a failure empties the queue, and the operation is then
     * refused with its error rather than queued to fail */
    if (r == ncclSuccess && e != EINTR) r = room_check(list);
    pthread_mutex_lock(&s->mu);
    if (r != ncclSuccess || e == EINTR) break;
  }
  if (--s->room_waiters == 0 && s->destroying) pthread_cond_broadcast(&s->idle);
  return r;
}

/* forks of this process so far, in its line (the child's count is one more than its parent's): a stream made before a
 * fork is not the child's -- its thread stayed with the parent, so work queued on it never ran and a wait for it
 * waited for ever */
static unsigned stream_fork_gen;
static void stream_forked(void) { stream_fork_gen++; }
__attribute__((constructor)) static void stream_atfork(void) { pthread_atfork(NULL, NULL, stream_forked); }

bool stream_valid(pycollStream_t s) {
  return handle_valid(s, H_STREAM) && ((struct pycollStream*)s)->fork_gen == stream_fork_gen;
}
bool event_valid(pycollEvent_t e) { return handle_valid(e, H_EVENT); }

/* ---- the stream thread ---- */

static void stream_hurry(struct marker* m);

static void run_item(struct item* it) {
  switch (it->kind) {
    case IT_TASKS: {
      run_tasks(it->tasks); /* failures land in the comms' async errors */
      tasks_finish(it->tasks, true);
      break;
    }
    case IT_RECORD: marker_fire(it->m); break;
    case IT_WAIT:
      stream_hurry(it->m);
      marker_wait(it->m);
      break;
    default: break;
  }
  if (it->m) marker_release(it->m);
}

/* An event's record item is counted done and its marker fired together, under the stream's lock: a query of the
 * stream once the event completed finds it idle, and a query of the event once a synchronize of the stream
 * returned finds it complete (CUDA's order; fired before it was counted, a query in between saw the stream busy). */
static void* stream_main(void* arg) {
  struct pycollStream* s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    if (!s->head && !host_oversubscribed()) { /* stay responsive for a short while before sleeping (not
                                                * when the ranks outnumber the CPUs: that takes one from them) */
      pthread_mutex_unlock(&s->mu);
      uint64_t t0 = now_ns();
      while (!__atomic_load_n(&s->head, __ATOMIC_ACQUIRE) && now_ns() - t0 < 50000) sched_yield();
      pthread_mutex_lock(&s->mu);
    }
    /* another thread runs this stream's work (inline, or a waiter helping): what is queued follows it,
     * and a helper may have taken everything */
    bool took_over = false; /* the head's reservation ran out: its thread did not come back for it */
    for (;;) {
      uint64_t until = 0; /* the head's reservation (reserve_locked), while it lasts */
      if (s->head && !s->inline_busy && s->reserved_until) {
        took_over = now_ns() >= s->reserved_until;
        if (took_over) s->reserved_until = 0;
        else until = s->reserved_until;
      }
      if (s->head && !s->inline_busy && !until) break;
      if (s->kick_fd < 0 && host_oversubscribed())
        s->kick_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
      s->sleeping = true;
      if (s->kick_fd >= 0) {
        if (until) kick(s, until);
        s->kick_sleep = true;
        pthread_mutex_unlock(&s->mu);
        struct pollfd pfd = {s->kick_fd, POLLIN, 0};
        while (poll(&pfd, 1, -1) < 0 && errno == EINTR) {
        }
        pthread_mutex_lock(&s->mu);
        uint64_t fired;
        if (read(s->kick_fd, &fired, sizeof fired) == (ssize_t)sizeof fired) s->kick_at = 0; /* else re-armed */
        s->kick_sleep = false;
      } else if (until) {
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        pthread_cond_timedwait(&s->work, &s->mu, &ts); /* `work` runs on CLOCK_MONOTONIC */
      } else {
        pthread_cond_wait(&s->work, &s->mu);
      }
      s->sleeping = false;
    }
    struct item* it = s->head;
    __atomic_store_n(&s->head, it->next, __ATOMIC_RELAXED); /* read without the lock by stream_main's spin */
    if (!s->head) s->tail = NULL;
    if (it->kind == IT_TASKS) room_taken_locked(s);
    s->running = true;
    pthread_mutex_unlock(&s->mu);
    if (took_over && it->kind == IT_TASKS && UNLIKELY(fp_hit("host.stream.takeover")))
      tasks_fail_at(it->tasks, "pycollStream", "host.stream.takeover"); /* "raise": the operations fail instead */
    bool stop = it->kind == IT_STOP, record = it->kind == IT_RECORD;
    if (!record) run_item(it);
    pthread_mutex_lock(&s->mu);
    s->running = false;
    s->completed++;
    if (record) marker_fire(it->m); /* counted and fired together (above) */
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    if (record) marker_release(it->m);
    free(it);
    if (stop) return NULL;
  }
}

static ncclResult_t push_raw(struct pycollStream* s, int kind, struct task* tasks, struct marker* m) {
  /* work a waiter may run itself: where the ranks outnumber the CPUs the thread is not woken for it at once */
  bool deferred = defer_ns && (kind == IT_TASKS || kind == IT_RECORD) && host_oversubscribed() &&
                  (__atomic_load_n(&s->flags, __ATOMIC_RELAXED) & PYCOLL_STREAM_HELP);
  if (deferred && UNLIKELY(fp_hit("host.stream.defer"))) {
    WARN("pycollStream : failpoint host.stream.defer");
    return ncclSystemError;
  }
  struct item* it = calloc(1, sizeof *it);
  if (!it) {
    WARN("pycollStream : out of memory");
    return ncclSystemError;
  }
  it->kind = kind;
  it->tasks = tasks;
  it->m = m;
  pthread_mutex_lock(&s->mu);
  if (kind == IT_TASKS) {
    if (UNLIKELY(s->queued >= stream_depth && stream_depth)) {
      ncclResult_t r = wait_room_locked(s, tasks);
      if (r != ncclSuccess) {
        pthread_mutex_unlock(&s->mu);
        free(it);
        return r;
      }
    }
    s->queued++;
  }
  if (s->tail) s->tail->next = it;
  else __atomic_store_n(&s->head, it, __ATOMIC_RELEASE);
  s->tail = it;
  s->enqueued++;
  wake(s, deferred);
  pthread_mutex_unlock(&s->mu);
  return ncclSuccess;
}

/* ---- the legacy default stream (configured by the emulated GPU; NULL: the host backend) ----
 * Once pycollStreamSetLegacy(L) ran, the stream handles NULL and 1 (cudaStreamLegacy) mean L and 2
 * (cudaStreamPerThread) the calling thread's own default stream, and work on L waits for the work
 * queued before it on every PYCOLL_STREAM_BLOCKING stream, and the other way round, as CUDA's legacy
 * default stream does with blocking streams. */

static struct pycollStream* legacy_stream;
static pthread_mutex_t blocking_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pycollStream* blocking_head;
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

static void per_thread_free(void* s) {
  if (s && stream_valid(s)) pycollStreamDestroy(s);
}

static void per_thread_init(void) { pthread_key_create(&per_thread_key, per_thread_free); }

pycollStream_t stream_resolve(pycollStream_t s) {
  struct pycollStream* L = __atomic_load_n(&legacy_stream, __ATOMIC_ACQUIRE);
  if (!L || (uintptr_t)s > 2) return s;
  if ((uintptr_t)s != 2) return L;
  pthread_once(&per_thread_once, per_thread_init);
  struct pycollStream* own = pthread_getspecific(per_thread_key);
  if (!own || !stream_valid(own)) {
    own = NULL;
    if (pycollStreamCreateWithFlags(&own, PYCOLL_STREAM_BLOCKING) != ncclSuccess) return s;
    pthread_setspecific(per_thread_key, own);
  }
  return own;
}

static bool stream_idle(struct pycollStream* s) {
  pthread_mutex_lock(&s->mu);
  bool idle = !s->inline_busy && s->completed == s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return idle;
}

/* Work queued on `s` from now on waits for the work queued on `other` so far. */
static void order_after(struct pycollStream* s, struct pycollStream* other) {
  if (stream_idle(other)) return;
  struct marker* m = marker_new();
  if (!m) return;
  marker_ref(m);
  if (push_raw(other, IT_RECORD, NULL, m) != ncclSuccess) {
    marker_release(m);
    marker_release(m);
    return;
  }
  if (push_raw(s, IT_WAIT, NULL, m) != ncclSuccess) marker_release(m);
}

static void implicit_sync(struct pycollStream* s) {
  struct pycollStream* L = __atomic_load_n(&legacy_stream, __ATOMIC_ACQUIRE);
  if (!L) return;
  if (s == L) {
    pthread_mutex_lock(&blocking_mu);
    for (struct pycollStream* b = blocking_head; b; b = b->blocking_next)
      if (b != L) order_after(L, b);
    pthread_mutex_unlock(&blocking_mu);
  } else if (s->flags & PYCOLL_STREAM_BLOCKING) {
    order_after(s, L);
  }
}

/* ---- a communicator's operations in the order they were issued, whatever their streams ----
 * NCCL makes each kernel of a communicator wait for the communicator's kernel before it (on the communicator's own
 * stream), whatever the streams they were issued on: the ranks' operations meet in the order each rank issued them.
 * A host stream runs its own queue only, so a task list submitted to a stream other than the one its communicator's
 * last unfinished task was submitted to waits for that task first: on its stream, behind a wait item; on the NULL
 * stream, in the calling thread. Lists a capture records are ordered when a launch submits them. */

/* The marker fired once `c`'s last submitted task has finished, a reference for the caller; NULL where none is
 * unfinished or it went to `s` (whose queue orders what follows it). Then `last` (NULL: unchanged) is `c`'s last. */
static struct marker* order_take(struct ncclComm* c, struct pycollStream* s, struct task* last) {
  struct marker* m = NULL;
  spin_lock(&c->order_lock);
  struct task* prev = c->order_last;
  if (prev && (!s || c->order_stream != s)) {
    m = prev->after;
    if (!m) {
      m = marker_new();
      if (m) m->stream = c->order_stream; /* a waiter hurries the stream that finishes it */
      else WARN("%s : out of memory: not ordered after the operation before it on another stream", prev->opname);
      prev->after = m;
    }
    if (m) marker_ref(m);
  }
  if (last) {
    last->ordered = true;
    __atomic_store_n(&c->order_last, last, __ATOMIC_RELEASE);
    c->order_stream = s;
  }
  spin_unlock(&c->order_lock);
  return m;
}

/* Orders `list`, to run on `s` (NULL: in the calling thread, now), after the earlier tasks of its communicators. */
static void stream_order(struct pycollStream* s, struct task* list) {
  for (struct task* t = list; t; t = t->next) {
    bool seen = false;
    for (struct task* u = list; u != t && !seen; u = u->next) seen = u->comm == t->comm;
    if (seen) continue;
    /* the NULL stream: nothing to wait for while no task of the comm is unfinished (a call of another thread at
     * the same time is not ordered with this one anyway) */
    if (!s && !__atomic_load_n(&t->comm->order_last, __ATOMIC_ACQUIRE)) continue;
    struct task* last = NULL;
    for (struct task* u = t; s && u; u = u->next)
      if (u->comm == t->comm) last = u;
    struct marker* m = order_take(t->comm, s, last);
    if (!m) continue;
    if (UNLIKELY(fp_hit("host.stream.order"))) /* "raise": the list's tasks of this comm fail, not wait */
      for (struct task* u = t; u; u = u->next)
        if (u->comm == t->comm && !u->done)
          task_fail(u, ncclSystemError, "%s : failpoint host.stream.order", u->opname);
    if (s && push_raw(s, IT_WAIT, NULL, m) == ncclSuccess) continue; /* the item holds the reference */
    stream_hurry(m);
    marker_wait(m);
    marker_release(m);
  }
}

void stream_order_wait(struct task* list) { stream_order(NULL, list); }

void stream_order_done(struct task* t) {
  struct ncclComm* c = t->comm;
  spin_lock(&c->order_lock);
  if (c->order_last == t) __atomic_store_n(&c->order_last, NULL, __ATOMIC_RELEASE);
  struct marker* m = t->after;
  t->after = NULL;
  t->ordered = false;
  spin_unlock(&c->order_lock);
  if (m) {
    marker_fire(m);
    marker_release(m);
  }
}

static ncclResult_t push(struct pycollStream* s, int kind, struct task* tasks, struct marker* m) {
  implicit_sync(s);
  return push_raw(s, kind, tasks, m);
}

/* True (and the stream marked busy) when `s` is idle: the caller's thread may run the next work now. */
static bool claim_idle(struct pycollStream* s) {
  pthread_mutex_lock(&s->mu);
  bool ok = !s->inline_busy && s->completed == s->enqueued;
  if (ok) {
    s->inline_busy = true;
    s->enqueued++;
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

/* True (and the stream marked busy) when `s` may run the next work in the caller's thread now. */
static bool inline_begin(struct pycollStream* s) { return (s->flags & PYCOLL_STREAM_INLINE) && claim_idle(s); }

/* The caller's thread is done running this stream's work (s->mu held; released here): the stream's
 * thread goes on with what was queued meanwhile, woken at once or, `deferred`, as push_raw defers. */
static void inline_release_as(struct pycollStream* s, bool deferred) {
  s->inline_busy = false;
  pthread_cond_broadcast(&s->idle);
  if (s->head) wake(s, deferred);
  pthread_mutex_unlock(&s->mu);
}

static void inline_release(struct pycollStream* s) { inline_release_as(s, false); }

static void inline_end(struct pycollStream* s) {
  pthread_mutex_lock(&s->mu);
  s->completed++;
  inline_release(s);
}

/* Runs a stream's tasks in a thread that is not the stream's own, for at most `budget_ns` and not past `until`
 * (monotonic ns): true when they finished (and were released), false when they go back to the stream. */
static bool run_borrowed(struct task* list, uint64_t until, uint64_t budget_ns) {
  bool finished;
  run_tasks_until(list, until, budget_ns, &finished);
  if (finished) tasks_finish(list, true);
  return finished;
}

/* Unfinished work of a borrowed thread goes back to the head of the queue, before what was queued meanwhile, for
 * the stream's thread (s->mu held). It counts as enqueued already. */
static void hand_back_locked(struct pycollStream* s, struct item* it) {
  it->next = s->head;
  __atomic_store_n(&s->head, it, __ATOMIC_RELEASE);
  if (!s->tail) s->tail = it;
  s->queued++; /* may pass the bound by this one: it was begun already */
}

/* What the caller's thread did not finish goes to the stream's thread, ahead of what was queued meanwhile (woken
 * at once or `deferred`); with no memory for the item, the caller finishes it. */
static void hand_over(struct pycollStream* s, struct task* list, bool deferred, bool reserve) {
  struct item* it = calloc(1, sizeof *it);
  if (!it) {
    run_tasks(list); /* nowhere to hand it: finished here */
    tasks_finish(list, true);
    inline_end(s);
    return;
  }
  it->kind = IT_TASKS;
  it->tasks = list;
  pthread_mutex_lock(&s->mu);
  hand_back_locked(s, it);
  if (reserve) reserve_locked(s);
  inline_release_as(s, deferred);
}

/* Small collectives queued on an idle stream that waiters may help (PYCOLL_STREAM_HELP: the Communicator's own
 * stream, whose asynchronous operations do not run inline) get one pass in the caller's thread first: what
 * needs no waiting -- this rank's contribution published, its arrival; the whole operation where it needs no
 * peer or the peers are there already -- is done before the call returns, and the rest goes to the stream's
 * thread (woken as for work queued: where the ranks outnumber the CPUs, later). An operation that completes in
 * the pass leaves the stream's thread idle: no wake-up, no hand-over between CPUs for its waiter to wait on. */
static bool eager_begin(struct pycollStream* s, struct task* list) {
  int flags = __atomic_load_n(&s->flags, __ATOMIC_RELAXED);
  if (!eager_pass || (flags & (PYCOLL_STREAM_HELP | PYCOLL_STREAM_INLINE)) != PYCOLL_STREAM_HELP) return false;
  for (struct task* t = list; t; t = t->next)
    if (!coll_quick(t)) return false;
  return claim_idle(s);
}

static ncclResult_t eager_run(struct pycollStream* s, struct task* list) {
  bool finished;
  run_tasks_until(list, UINT64_MAX, 0, &finished);
  if (finished) {
    tasks_finish(list, true);
    inline_end(s);
    return ncclSuccess;
  }
  bool deferred = defer_ns && host_oversubscribed();
  if (deferred && UNLIKELY(fp_hit("host.stream.defer"))) { /* as push_raw: the caller finishes the tasks */
    WARN("pycollStream : failpoint host.stream.defer");
    inline_end(s);
    return ncclSystemError;
  }
  hand_over(s, list, deferred, false); /* an asynchronous operation: its caller may not wait for it soon */
  return ncclSuccess;
}

/* An idle stream with PYCOLL_STREAM_INLINE runs the work in the caller's thread (as the stream
 * would, in order: work enqueued meanwhile from other threads waits for it), for at most inline_ns:
 * the stream's thread finishes what is left then; otherwise the stream's thread runs it (a small collective on
 * a helping stream after a pass in the caller's thread: eager_begin). Either way
 * the result is reported as the stream's would be: errors land in the communicators' asynchronous
 * errors, events recorded after it complete after it. */
static bool capture_add(struct pycollStream* s, struct task* list);

ncclResult_t stream_submit(pycollStream_t s, struct task* list) {
  if (UNLIKELY(__atomic_load_n(&s->capture, __ATOMIC_ACQUIRE) != NULL) && capture_add(s, list)) return ncclSuccess;
  implicit_sync(s);
  stream_order(s, list);
  if (eager_begin(s, list)) return eager_run(s, list);
  if (inline_begin(s)) {
    if (run_borrowed(list, UINT64_MAX, inline_ns)) inline_end(s);
    else hand_over(s, list, false, true); /* a blocking caller: it waits for the rest next */
    return ncclSuccess;
  }
  return push_raw(s, IT_TASKS, list, NULL);
}

static void stream_sync(struct pycollStream* s);

ncclResult_t stream_submit_joined(pycollStream_t s, pycollStream_t const* others, int n, struct task* list,
                                  void** done) {
  /* a capture records the list into its graph, whose launches replay it on one stream: no joins to record */
  bool capturing = __atomic_load_n(&s->capture, __ATOMIC_ACQUIRE) != NULL;
  if (!capturing)
    for (int i = 0; i < n; i++) order_after(s, others[i]);
  ncclResult_t r = stream_submit(s, list);
  if (r != ncclSuccess) return r;
  if (!capturing)
    for (int i = 0; i < n; i++) order_after(others[i], s);
  if (!done) return ncclSuccess;
  /* the caller waits after it lets go of the list's communicators (group.c), when an abort of one of them may have
   * destroyed `s` already: a marker recorded on it, not `s`, tells when the list has run */
  struct marker* m = marker_new();
  if (m) {
    marker_ref(m);
    m->stream = s;
    if (push_raw(s, IT_RECORD, NULL, m) == ncclSuccess) {
      *done = m;
      return ncclSuccess;
    }
    marker_release(m);
    marker_release(m);
  }
  *done = NULL;
  stream_sync(s); /* no marker: waited for here */
  return ncclSuccess;
}

void stream_marker_wait(void* m) {
  stream_hurry(m);
  marker_wait(m);
  marker_release(m);
}

/* The stream that fires `m` (a record on a stream not yet reached), locked; NULL when none. */
static struct pycollStream* marker_stream_lock(struct marker* m) {
  struct pycollStream* s = m->stream;
  if (!s || __atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) return NULL;
  handle_lock(); /* the stream stays alive while its lock is taken */
  if (!handle_valid_locked(s, H_STREAM)) {
    handle_unlock();
    return NULL;
  }
  pthread_mutex_lock(&s->mu);
  handle_unlock();
  return s;
}

/* A thread that waits for `m` without running work: the stream's thread takes what was queued before it now
 * (not when a deferred wake would). */
static void stream_hurry(struct marker* m) {
  struct pycollStream* s = marker_stream_lock(m);
  if (!s) return;
  hurry_locked(s);
  pthread_mutex_unlock(&s->mu);
}

/* A thread waiting for `m` (pycollEventWaitRun) runs the work queued on m's stream up to m itself, when the stream has
 * PYCOLL_STREAM_HELP and its thread has not begun that work: the same order, one thread handoff less.
 * It takes only tasks and records (a wait for another stream stays with the stream's thread), stops at
 * the first other item, and hands unfinished tasks back at `until` (monotonic ns: the end of the waiter's wait,
 * which a caller of the Communicator's waits in slices of a few ms), left to the waiter for defer_ns
 * (reserve_locked): it comes back for them after a look at its deadline and signals. Its wait blocks this thread
 * until then in any case, so inline_ns, which bounds a caller's run in stream_submit, does not bound it. */
static void stream_help(struct marker* m, uint64_t until) {
  struct pycollStream* s = marker_stream_lock(m);
  if (!s) return;
  bool helps = __atomic_load_n(&s->flags, __ATOMIC_ACQUIRE) & PYCOLL_STREAM_HELP;
  if (s->running || s->inline_busy || !s->head || !helps) {
    hurry_locked(s); /* not run here: its own thread takes it now (a no-op while a thread runs the stream) */
    pthread_mutex_unlock(&s->mu);
    return;
  }
  s->inline_busy = true;
  s->reserved_until = 0; /* a reservation is this waiter's, or ends for it */
  for (;;) {
    struct item* it = s->head;
    if (!it || (it->kind != IT_TASKS && it->kind != IT_RECORD) || __atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) break;
    __atomic_store_n(&s->head, it->next, __ATOMIC_RELAXED);
    if (!s->head) s->tail = NULL;
    if (it->kind == IT_TASKS) room_taken_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (it->kind == IT_TASKS && !run_borrowed(it->tasks, until, UINT64_MAX)) {
      pthread_mutex_lock(&s->mu);
      hand_back_locked(s, it);
      reserve_locked(s); /* the waiter comes back for it unless its own deadline passed */
      break;
    }
    bool mine = it->kind == IT_RECORD && it->m == m;
    struct marker* fired = it->kind == IT_RECORD ? it->m : NULL;
    free(it);
    pthread_mutex_lock(&s->mu);
    s->completed++;
    if (fired) { /* counted and fired together, as the stream's own thread does */
      marker_fire(fired);
      marker_release(fired);
    }
    if (mine) break;
  }
  /* what is queued after `m` was queued by a thread that may come to wait for it as well: where the ranks
   * outnumber the CPUs its wake-up stays deferred, as push_raw deferred it -- woken at once, the stream's thread
   * would take the CPU this thread runs on (the kernel favours a thread it wakes) and wait for the peers there,
   * while this thread, back in its next wait, sleeps until it is done: two thread switches per operation */
  inline_release_as(s, defer_ns && host_oversubscribed());
}

static void stream_sync(struct pycollStream* s) {
  pthread_mutex_lock(&s->mu);
  hurry_locked(s);
  uint64_t target = s->enqueued;
  while (s->completed < target) pthread_cond_wait(&s->idle, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* ---- API ---- */

#define CHECK_STREAM(s, name)                                                                              \
  if (!(s) || !stream_valid(s)) {                                                                          \
    WARN("%s : stream %p is not a valid pycoll host stream (or its process's parent made it)", name, (void*)(s)); \
    return ncclInvalidArgument;                                                                            \
  }
#define CHECK_EVENT(e, name)                                                                               \
  if (!(e) || !event_valid(e)) {                                                                           \
    WARN("%s : event %p is not a valid pycoll host event", name, (void*)(e));                              \
    return ncclInvalidArgument;                                                                            \
  }

NCCL_API int pycollStreamCreate(pycollStream_t* stream) { return pycollStreamCreateWithFlags(stream, 0); }

NCCL_API int pycollStreamCreateWithFlags(pycollStream_t* stream, int flags) {
  if (!stream) {
    WARN("pycollStreamCreate : stream argument is NULL");
    return ncclInvalidArgument;
  }
  if (flags & ~(PYCOLL_STREAM_INLINE | PYCOLL_STREAM_BLOCKING | PYCOLL_STREAM_HELP)) {
    WARN("pycollStreamCreateWithFlags : unknown flags 0x%x", (unsigned)flags);
    return ncclInvalidArgument;
  }
  struct pycollStream* s = calloc(1, sizeof *s);
  if (!s) return ncclSystemError;
  s->magic = STREAM_MAGIC;
  s->fork_gen = stream_fork_gen;
  s->flags = flags;
  s->kick_fd = -1;
  pthread_mutexattr_t ma; /* adaptive: the caller's push and the stream thread's pop hold it for
                           * nanoseconds; spinning briefly beats a futex sleep and wake */
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&s->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca; /* `work`'s timed waits (a reservation's end: stream_main) count monotonic time */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->work, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&s->idle, NULL);
  int e = pthread_create(&s->thread, NULL, stream_main, s);
  if (e != 0) { /* its error number: pthread_create sets no errno */
    WARN("pycollStreamCreate : cannot start the stream thread: %s", strerror(e));
    free(s);
    return ncclSystemError;
  }
  handle_add(s, H_STREAM, 0);
  if (flags & PYCOLL_STREAM_BLOCKING) {
    pthread_mutex_lock(&blocking_mu);
    s->blocking_next = blocking_head;
    blocking_head = s;
    pthread_mutex_unlock(&blocking_mu);
  }
  *stream = s;
  return ncclSuccess;
}

NCCL_API int pycollStreamDestroy(pycollStream_t s) {
  if (!s || !handle_remove(s, H_STREAM, NULL)) {
    WARN("pycollStreamDestroy : stream %p is not a valid pycoll host stream", (void*)s);
    return ncclInvalidArgument;
  }
  if (s->flags & PYCOLL_STREAM_BLOCKING) {
    pthread_mutex_lock(&blocking_mu);
    for (struct pycollStream** p = &blocking_head; *p; p = &(*p)->blocking_next)
      if (*p == s) {
        *p = s->blocking_next;
        break;
      }
    pthread_mutex_unlock(&blocking_mu);
  }
  struct pycollStream* expected = s;
  __atomic_compare_exchange_n(&legacy_stream, &expected, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  pthread_mutex_lock(&s->mu); /* a thread waiting for room on it leaves (with an error) before it goes */
  s->destroying = true;
  __atomic_add_fetch(&s->room, 1, __ATOMIC_SEQ_CST);
  futex_wake(&s->room, false);
  while (s->room_waiters) pthread_cond_wait(&s->idle, &s->mu);
  pthread_mutex_unlock(&s->mu);
  push_raw(s, IT_STOP, NULL, NULL);
  pthread_join(s->thread, NULL);
  if (s->kick_fd >= 0) close(s->kick_fd);
  if (s->capture) pycollGraphDestroy(s->capture);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work);
  pthread_cond_destroy(&s->idle);
  s->magic = 0;
  quarantine_free(s);
  return ncclSuccess;
}

NCCL_API int pycollStreamSetFlags(pycollStream_t s, int flags) {
  CHECK_STREAM(s, "pycollStreamSetFlags");
  if (flags & ~(PYCOLL_STREAM_INLINE | PYCOLL_STREAM_HELP)) {
    WARN("pycollStreamSetFlags : unknown flags 0x%x", (unsigned)flags);
    return ncclInvalidArgument;
  }
  __atomic_store_n(&s->flags, flags | (s->flags & PYCOLL_STREAM_BLOCKING), __ATOMIC_RELEASE);
  return ncclSuccess;
}

NCCL_API int pycollStreamSynchronize(pycollStream_t s) {
  CHECK_STREAM(s, "pycollStreamSynchronize");
  stream_sync(s);
  return ncclSuccess;
}

NCCL_API int pycollStreamWaitRoom(pycollStream_t s, uint64_t timeout_ns) {
  CHECK_STREAM(s, "pycollStreamWaitRoom");
  pthread_mutex_lock(&s->mu);
  if (!stream_depth || s->queued < stream_depth || s->destroying) {
    pthread_mutex_unlock(&s->mu);
    return ncclSuccess;
  }
  s->room_waiters++;
  hurry_locked(s);
  uint32_t seen = __atomic_load_n(&s->room, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&s->mu);
  int r = ncclInProgress;
  if (UNLIKELY(fp_hit("host.stream.full"))) {
    WARN("pycollStreamWaitRoom : failpoint host.stream.full");
    r = ncclSystemError;
  }
  if (r == ncclInProgress && timeout_ns) futex_wait(&s->room, seen, timeout_ns, false);
  pthread_mutex_lock(&s->mu);
  if (r == ncclInProgress && (s->queued < stream_depth || s->destroying)) r = ncclSuccess;
  if (--s->room_waiters == 0 && s->destroying) pthread_cond_broadcast(&s->idle);
  pthread_mutex_unlock(&s->mu);
  return r;
}

NCCL_API int pycollStreamQuery(pycollStream_t s) {
  CHECK_STREAM(s, "pycollStreamQuery");
  pthread_mutex_lock(&s->mu);
  bool idle = s->completed == s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return idle ? ncclSuccess : ncclInProgress;
}

static struct marker* event_current(struct pycollEvent* e) {
  spin_lock(&e->lock);
  struct marker* m = e->m;
  if (m) marker_ref(m);
  spin_unlock(&e->lock);
  return m;
}

NCCL_API int pycollStreamWaitEvent(pycollStream_t s, pycollEvent_t e) {
  CHECK_STREAM(s, "pycollStreamWaitEvent");
  CHECK_EVENT(e, "pycollStreamWaitEvent");
  struct marker* m = event_current(e);
  if (!m) return ncclSuccess; /* never recorded: nothing to wait for */
  if (__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) { /* completed already: nothing to wait for */
    marker_release(m);
    return ncclSuccess;
  }
  ncclResult_t r = push(s, IT_WAIT, NULL, m);
  if (r != ncclSuccess) marker_release(m);
  return r;
}

NCCL_API int pycollEventCreate(pycollEvent_t* event) {
  if (!event) {
    WARN("pycollEventCreate : event argument is NULL");
    return ncclInvalidArgument;
  }
  struct pycollEvent* e = calloc(1, sizeof *e);
  if (!e) return ncclSystemError;
  e->magic = EVENT_MAGIC;
  handle_add(e, H_EVENT, 0);
  *event = e;
  return ncclSuccess;
}

NCCL_API int pycollEventDestroy(pycollEvent_t e) {
  if (!e || !handle_remove(e, H_EVENT, NULL)) {
    WARN("pycollEventDestroy : event %p is not a valid pycoll host event", (void*)e);
    return ncclInvalidArgument;
  }
  marker_release(e->m);
  e->magic = 0;
  quarantine_free(e);
  return ncclSuccess;
}

static void event_set(struct pycollEvent* e, struct marker* m) {
  spin_lock(&e->lock);
  struct marker* old = e->m;
  e->m = m;
  spin_unlock(&e->lock);
  marker_release(old);
}

/* A record that completes at once (NULL stream, idle stream): the event's marker, when it has completed and
 * nobody else holds it (a waiter or a query holds a reference while it looks), takes the new time in place --
 * what a new, fired marker would say, without an allocation and a free per record. */
static bool event_refire(struct pycollEvent* e, struct pycollStream* s) {
  spin_lock(&e->lock);
  struct marker* m = e->m;
  bool reuse = m && __atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 1 && __atomic_load_n(&m->done, __ATOMIC_ACQUIRE);
  if (reuse) {
    m->t_ns = now_ns();
    m->counted_on = s;
    m->failed = failed_count(s);
    m->stream = NULL;
  }
  spin_unlock(&e->lock);
  return reuse;
}

ncclResult_t stream_record(pycollEvent_t e, pycollStream_t s) {
  if (s) implicit_sync(s);
  bool now = !s || stream_idle(s); /* everything before the record has run: it completes now */
  if (now && event_refire(e, s)) return ncclSuccess;
  struct marker* m = marker_new();
  if (!m) return ncclSystemError;
  m->counted_on = s;
  if (now) {
    marker_fire(m);
    event_set(e, m);
    return ncclSuccess;
  }
  marker_ref(m);
  m->stream = s;
  ncclResult_t r = push_raw(s, IT_RECORD, NULL, m);
  if (r != ncclSuccess) {
    marker_release(m);
    marker_release(m);
    return r;
  }
  event_set(e, m);
  return ncclSuccess;
}

void* event_arm(pycollEvent_t e) {
  struct marker* m = marker_new();
  if (!m) return NULL;
  marker_ref(m);
  event_set(e, m);
  return m;
}

NCCL_API int pycollEventRecord(pycollEvent_t e, pycollStream_t s) {
  CHECK_EVENT(e, "pycollEventRecord");
  if (s) CHECK_STREAM(s, "pycollEventRecord");
  return stream_record(e, s);
}

NCCL_API int pycollEventQuery(pycollEvent_t e) {
  CHECK_EVENT(e, "pycollEventQuery");
  struct marker* m = event_current(e);
  int r = (!m || __atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) ? ncclSuccess : ncclInProgress;
  marker_release(m);
  return r;
}

static int event_wait(pycollEvent_t e, uint64_t timeout_ns, bool run) {
  struct marker* m = event_current(e);
  if (m && run) { /* the help counts against the wait's timeout */
    uint64_t t0 = now_ns(), until = timeout_ns > UINT64_MAX - t0 ? UINT64_MAX : t0 + timeout_ns;
    stream_help(m, until);
    if (until != UINT64_MAX && !__atomic_load_n(&m->done, __ATOMIC_ACQUIRE)) {
      uint64_t t = now_ns();
      timeout_ns = t >= until ? 0 : until - t;
    }
  } else if (m) {
    stream_hurry(m);
  }
  bool done = !m || marker_wait_for(m, timeout_ns);
  marker_release(m);
  return done ? ncclSuccess : ncclInProgress;
}

NCCL_API int pycollEventWait(pycollEvent_t e, uint64_t timeout_ns) {
  CHECK_EVENT(e, "pycollEventWait");
  return event_wait(e, timeout_ns, false);
}

NCCL_API int pycollEventWaitRun(pycollEvent_t e, uint64_t timeout_ns) {
  CHECK_EVENT(e, "pycollEventWaitRun");
  return event_wait(e, timeout_ns, true);
}

NCCL_API int pycollEventArm(pycollEvent_t e) {
  CHECK_EVENT(e, "pycollEventArm");
  void* m = event_arm(e);
  if (!m) return ncclSystemError;
  marker_release(m); /* the event holds it */
  return ncclSuccess;
}

NCCL_API int pycollEventFire(pycollEvent_t e) {
  CHECK_EVENT(e, "pycollEventFire");
  struct marker* m = event_current(e);
  if (!m) {
    WARN("pycollEventFire : the event was never armed or recorded");
    return ncclInvalidUsage;
  }
  marker_fire(m);
  marker_release(m);
  return ncclSuccess;
}

NCCL_API int pycollEventSynchronize(pycollEvent_t e) {
  CHECK_EVENT(e, "pycollEventSynchronize");
  struct marker* m = event_current(e);
  if (m) {
    stream_hurry(m);
    marker_wait(m);
  }
  marker_release(m);
  return ncclSuccess;
}

bool events_clean(pycollEvent_t start, pycollEvent_t end, uint64_t t_ns) {
  struct marker *a = event_current(start), *b = event_current(end);
  bool clean = a && b && __atomic_load_n(&a->done, __ATOMIC_ACQUIRE) && __atomic_load_n(&b->done, __ATOMIC_ACQUIRE) &&
               ((t_ns && b->t_ns < t_ns) || (a->counted_on == b->counted_on && a->failed == b->failed));
  marker_release(a);
  marker_release(b);
  return clean;
}

NCCL_API int pycollEventElapsedTime(float* ms, pycollEvent_t start, pycollEvent_t end) {
  if (!ms) {
    WARN("pycollEventElapsedTime : ms argument is NULL");
    return ncclInvalidArgument;
  }
  CHECK_EVENT(start, "pycollEventElapsedTime");
  CHECK_EVENT(end, "pycollEventElapsedTime");
  struct marker *a = event_current(start), *b = event_current(end);
  int r = ncclSuccess;
  if (!a || !b) {
    WARN("pycollEventElapsedTime : %s event was never recorded", !a ? "the start" : "the end");
    r = ncclInvalidUsage;
  } else if (!__atomic_load_n(&a->done, __ATOMIC_ACQUIRE) || !__atomic_load_n(&b->done, __ATOMIC_ACQUIRE)) {
    r = ncclInProgress;
  } else {
    *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
  }
  marker_release(a);
  marker_release(b);
  return r;
}

/* ---- the emulated GPU's legacy stream and graph capture ---- */

NCCL_API int pycollStreamSetLegacy(pycollStream_t s) {
  if (s) CHECK_STREAM(s, "pycollStreamSetLegacy");
  __atomic_store_n(&legacy_stream, s, __ATOMIC_RELEASE);
  return ncclSuccess;
}

NCCL_API int pycollStreamResolve(pycollStream_t s, pycollStream_t* out) {
  if (!out) {
    WARN("pycollStreamResolve : out argument is NULL");
    return ncclInvalidArgument;
  }
  *out = stream_resolve(s);
  if ((uintptr_t)*out <= 2) return ncclSuccess; /* no legacy stream: NULL stays NULL (1 and 2 too) */
  CHECK_STREAM(*out, "pycollStreamResolve");
  return ncclSuccess;
}

static void graph_release_tasks(struct task* list) {
  for (struct task *t = list, *next; t; t = next) {
    next = t->next;
    comm_release(t->comm);
    free(t);
  }
}

/* Keeps `list` in the capturing graph of `s` (false when `s` stopped capturing meanwhile). The tasks keep
 * their comm references; they no longer count as pending work of their communicators. */
static bool capture_add(struct pycollStream* s, struct task* list) {
  struct gnode* n = calloc(1, sizeof *n);
  if (!n) return false;
  for (struct task* t = list; t; t = t->next) {
    if (t->launch_marker) {
      marker_fire(t->launch_marker);
      marker_release(t->launch_marker);
      t->launch_marker = NULL;
    }
  }
  pthread_mutex_lock(&s->mu);
  struct pycollGraph* g = s->capture;
  if (g) {
    n->tasks = list;
    if (g->tail) g->tail->next = n;
    else g->head = n;
    g->tail = n;
  }
  pthread_mutex_unlock(&s->mu);
  if (!g) {
    free(n);
    return false;
  }
  for (struct task* t = list; t; t = t->next) task_count(t, -1);
  return true;
}

NCCL_API int pycollStreamBeginCapture(pycollStream_t s) {
  CHECK_STREAM(s, "pycollStreamBeginCapture");
  struct pycollGraph* g = calloc(1, sizeof *g);
  if (!g) return ncclSystemError;
  g->magic = GRAPH_MAGIC;
  pthread_mutex_lock(&s->mu);
  bool busy = s->capture != NULL;
  if (!busy) __atomic_store_n(&s->capture, g, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&s->mu);
  if (busy) {
    free(g);
    WARN("pycollStreamBeginCapture : stream %p is already capturing", (void*)s);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

NCCL_API int pycollStreamEndCapture(pycollStream_t s, pycollGraph_t* graph) {
  CHECK_STREAM(s, "pycollStreamEndCapture");
  if (!graph) {
    WARN("pycollStreamEndCapture : graph argument is NULL");
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&s->mu);
  struct pycollGraph* g = s->capture;
  __atomic_store_n(&s->capture, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&s->mu);
  if (!g) {
    WARN("pycollStreamEndCapture : stream %p is not capturing", (void*)s);
    return ncclInvalidUsage;
  }
  handle_add(g, H_GRAPH, 0); /* from here on a handle the user has: checked as the others are */
  *graph = g;
  return ncclSuccess;
}

NCCL_API int pycollGraphLaunch(pycollGraph_t g, pycollStream_t s) {
  if (!g || !handle_valid(g, H_GRAPH)) {
    WARN("pycollGraphLaunch : %p is not a pycoll host graph (made up, or destroyed)", (void*)g);
    return ncclInvalidArgument;
  }
  CHECK_STREAM(s, "pycollGraphLaunch");
  for (struct gnode* n = g->head; n; n = n->next) {
    struct task *copy = NULL, **tail = &copy;
    for (struct task* t = n->tasks; t; t = t->next) {
      struct task* c = malloc(sizeof *c);
      if (!c) {
        tasks_finish(copy, true);
        return ncclSystemError;
      }
      *c = *t;
      c->started = c->done = c->prepared = c->ordered = false;
      c->after = NULL;
      c->result = ncclSuccess;
      c->next = NULL;
      comm_ref(c->comm);
      task_count(c, 1);
      *tail = c;
      tail = &c->next;
    }
    ncclResult_t r = stream_submit(s, copy);
    if (r != ncclSuccess) {
      tasks_finish(copy, true);
      return r;
    }
  }
  return ncclSuccess;
}

NCCL_API int pycollGraphDestroy(pycollGraph_t g) {
  if (!g || !handle_remove(g, H_GRAPH, NULL)) {
    WARN("pycollGraphDestroy : %p is not a pycoll host graph (made up, or destroyed)", (void*)g);
    return ncclInvalidArgument;
  }
  for (struct gnode *n = g->head, *next; n; n = next) {
    next = n->next;
    graph_release_tasks(n->tasks);
    free(n);
  }
  g->magic = 0;
  quarantine_free(g); /* a stale handle does not alias a new graph */
  return ncclSuccess;
}
