/* Communicators: the process-local object behind an ncclComm_t, the registry that validates
 * handles, reference counting, and the lifecycle (init, finalize, destroy, abort, revoke). */
#ifndef PYCOLL_COMM_H
#define PYCOLL_COMM_H

#include "core.h"
#include <pthread.h>

#include "datatype.h"
#include "bootstrap.h"
#include "segment.h"

#define COMM_MAGIC 0x636f6d6d6c697665ull /* live */
#define COMM_DEAD 0x636f6d6d64656164ull  /* freed (kept a while to catch stale handles) */

enum abort_reason { AB_NONE = 0, AB_USER, AB_REVOKE, AB_SHRINK, AB_INIT };

struct peer {
  struct proc_id proc;
  int pidfd;          /* -1 when not watched so (same process, other pid namespace, no pidfd to be had) */
  bool same_process;
  bool read_proc; /* of this pid namespace but without a pidfd (the kernel refused one): /proc says when it exits */
  bool gone; /* exited: when this rank attached, or found by the exit watcher since (atomic) */
};

struct user_redop {
  bool used;
  int dtype;
  int residence;
  uint64_t scalar;      /* host-immediate value (bits in dtype) */
  const void* scalar_p; /* "device" residence: read when the operation executes */
};

struct reg_entry {
  void* buff;
  size_t size;
  struct reg_entry* next;
};

struct ncclComm {
  uint64_t magic;
  int rank, nranks, cuda_dev;
  ncclConfig_t config;
  char name[128];

  /* lifetime: the registry holds one reference; every call and queued operation holds one more */
  int refs;
  int active;      /* threads touching the segment right now (abort waits for 0) */
  int pending;     /* operations enqueued on streams and not finished */
  /* per peer: the sends, receives, puts and signals with it that count in `pending` (atomic; task_count); freed
   * with the comm, not at its teardown (an aborted comm's queued tasks still finish after it) */
  int* p2p_open;
  uint32_t abort_flag;
  int abort_reason; /* why abort_flag is set: enum abort_reason */
  int async;       /* ncclCommGetAsyncError; a futex word for pycollCommWaitReady */
  /* when `async` last became an error (now_ns; 0: it is none), written before `async` itself: an event that completed
   * before it ends an operation that completed before the failure (pycollCommEventsClean) */
  uint64_t async_err_ns;
  uint32_t async_waiters;
  int broken;      /* sticky fatal error for collectives (0 when healthy) */
  bool revoked, finalize_called, destroy_called, suspended;
  bool torn_down;

  pthread_mutex_t mu;      /* jobs, reduction ops, registrations, the segment pointer */
  pthread_mutex_t err_mu;  /* last_error */
  pthread_mutex_t exec_mu; /* one thread executes operations of this comm at a time */
  int job_running;         /* a background job (init, finalize, split, ...) runs on this comm */
  /* Its operations run in the order they were issued whatever their streams, as NCCL's do (each of its kernels waits
   * for the one before on the communicator's own stream): the last task submitted to a stream and not yet finished
   * (NULL: none), and that stream; under the spin lock order_lock (stream.c, stream_order) */
  uint32_t order_lock;
  struct task* order_last;
  struct pycollStream* order_stream;

  struct seg seg;
  struct peer* peers;
  struct ncclComm* watch_next; /* in the exit watcher's list (exitwatch.c) */
  bool watch_listed;
  bool life_linked;            /* this rank's life word is in the exit watcher's robust list */
  uint64_t nonce[2];
  uint64_t token;
  bool oversubscribed;

  /* sequencing, touched only under exec_mu */
  struct yield_record yields; /* how its operations' waits for the peers ended of late (wait.h) */
  uint64_t next_step;
  uint64_t steps_done; /* the collective steps this rank completed (atomic: read as it aborts or revokes) */
  uint64_t op_seq;
  uint64_t coll_issued; /* collectives issued, those of zero elements too (atomic): pycoll's numbering of them */
  uint64_t* send_seq;
  uint64_t* recv_seq;

  uint64_t child_count; /* reshapes of this comm (split, shrink, grow) */
  uint64_t last_grow_seq; /* sequence number of the last grow: its id cannot be used again */
  bool grow_id_pending;

  struct user_redop* redops;
  int nredops;
  struct reg_entry* regs;

  char last_error[1024];
  /* the text of the error that first put the comm in its error state (broken, or an asynchronous error): what the
   * calls this state refuses report, not whatever a later failed call left in last_error (err_mu) */
  char fail_error[1024];
};

/* ---- registry and references ---- */

/* Validates `comm` and takes a reference; on failure records a last error naming `opname`. */
ncclResult_t comm_acquire(ncclComm_t comm, const char* opname, struct ncclComm** out);
void comm_ref(struct ncclComm* c);
void comm_release(struct ncclComm* c);
struct ncclComm* comm_alloc(void);
void comm_register(struct ncclComm* c);
bool comm_unregister(struct ncclComm* c);

void comm_set_last_error(struct ncclComm* c, const char* text);
/* Copies comm's last error if comm is live; false otherwise. */
bool comm_copy_last_error(ncclComm_t comm, char* out, size_t len);

/* ---- state ---- */

/* The flags one thread sets (ncclCommRevoke, Suspend, Resume, Finalize, Destroy) and the stream threads read:
 * relaxed atomics -- the abort flag and the async state order what must be ordered; these are never torn. */
#define COMM_FLAG(c, f) __atomic_load_n(&(c)->f, __ATOMIC_RELAXED)
#define COMM_SET_FLAG(c, f, v) __atomic_store_n(&(c)->f, (v), __ATOMIC_RELAXED)

static inline int comm_async(struct ncclComm* c) { return __atomic_load_n(&c->async, __ATOMIC_ACQUIRE); }
/* After the asynchronous state changed: wakes the threads in pycollCommWaitReady, if any. */
static inline void comm_async_changed(struct ncclComm* c) {
  if (__atomic_load_n(&c->async_waiters, __ATOMIC_SEQ_CST)) futex_wake((uint32_t*)&c->async, false);
}
/* Keeps the comm's last error as the text of its error state (fail_error) where none is kept yet; forgets it when
 * `v` is ncclSuccess and the comm is not broken. */
void comm_note_async(struct ncclComm* c, int v);
/* Keeps when the comm's asynchronous state became an error: the first such moment since it was last healthy. */
static inline void comm_note_error_time(struct ncclComm* c) {
  uint64_t none = 0;
  __atomic_compare_exchange_n(&c->async_err_ns, &none, now_ns(), false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
}
static inline void comm_set_async(struct ncclComm* c, int v) {
  if (v != ncclInProgress) comm_note_async(c, v);
  if (v != ncclSuccess && v != ncclInProgress) comm_note_error_time(c);
  else if (v == ncclSuccess && !__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
    __atomic_store_n(&c->async_err_ns, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&c->async, v, __ATOMIC_SEQ_CST);
  comm_async_changed(c);
}
static inline bool comm_aborting(struct ncclComm* c) { return __atomic_load_n(&c->abort_flag, __ATOMIC_ACQUIRE); }
/* A fatal error hit the comm: collectives fail from now on; peers waiting on us learn about it. */
void comm_fail(struct ncclComm* c, int code, const char* text);
/* Enter/leave the segment (abort waits for every thread to leave). False when aborting. */
bool comm_enter(struct ncclComm* c);
void comm_leave(struct ncclComm* c);

/* The checks NCCL's ncclCommEnsureReady performs before using a comm (init done, no error). */
ncclResult_t comm_ensure_ready(struct ncclComm* c, const char* opname);
/* A call refused by the comm's error state: its last error becomes that state's text again (fail_error), which a
 * later call's own error may have replaced; returns `code`. */
ncclResult_t comm_refuse_failed(struct ncclComm* c, int code);

/* Sets up a freshly rendezvoused comm (peers, pidfds, sequencing) and publishes RS_ACTIVE. */
ncclResult_t comm_attach(struct ncclComm* c, struct seg* s, int rank);
/* Publishes this rank's state (aborted, revoked) in the segment, if mapped, and wakes sleepers. */
void comm_publish_state(struct ncclComm* c, int state);
/* After this rank published that it aborted or revoked: wait until no peer writes into its windows (a piece
 * a peer began before it could see that), so that none does once the abort or revoke returns. Bounded: a
 * peer stopped in the middle of a piece is given up on after a second (warned). */
void comm_wait_window_writers(struct ncclComm* c);
/* Releases the segment and everything that belongs to it (idempotent). */
void comm_teardown(struct ncclComm* c, int final_state);

/* Waits until no thread is inside the comm's segment. */
void comm_wait_inactive(struct ncclComm* c);
/* Waits until every operation enqueued on a stream for this comm has finished. */
ncclResult_t comm_wait_pending(struct ncclComm* c, bool abortable);

/* True when peer `k`'s process is known to be dead: marked gone (the exit watcher saw its pidfd fire),
 * or its life word (segment.h) says so -- then it is marked gone and the segment's sleepers are woken --
 * or, with `check_process`, its pidfd is readable now (a poll), or, where it has none, /proc says it
 * exited. Two loads when alive and not checked. */
bool comm_peer_died(struct ncclComm* c, int k, bool check_process);
/* Peer health while waiting on it: ncclSuccess, or the error to report. */
ncclResult_t comm_check_peer(struct ncclComm* c, int peer, bool check_process, char* text, size_t len);

ncclResult_t parse_config(ncclConfig_t* dst, const ncclConfig_t* user, const char* opname, struct ncclComm* comm);
void config_defaults(ncclConfig_t* dst);
void config_inherit(ncclConfig_t* dst, const ncclConfig_t* parent);

#endif
