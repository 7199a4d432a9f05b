/* Operations (tasks) and the engine that runs them. A task is one collective or one send/recv,
 * written as a resumable state machine: progress() moves it as far as it can without waiting and
 * says which peer it waits for. run_tasks() drives a set of tasks (a group, possibly spanning
 * several communicators) to completion from one thread, so grouped operations in any order never
 * deadlock; collectives of one communicator run in call order, sends (receives) to one peer too. */
#ifndef PYCOLL_ENQUEUE_H
#define PYCOLL_ENQUEUE_H

#include "core.h"
#include "comm.h"

/* The root of the AllGather that ncclCommWindowRegister exchanges its windows with (window.c): no user collective's
 * (-1 for an AllGather), so that a rank registering a window while another runs an AllGather of the same size is a
 * mismatch both see, not an exchange of one with the other's data. */
#define WINDOW_EXCHANGE_ROOT (-2)

enum task_kind {
  TK_ALLREDUCE = 0,
  TK_BROADCAST,
  TK_REDUCE,
  TK_ALLGATHER,
  TK_REDUCESCATTER,
  TK_ALLTOALL,
  TK_GATHER,
  TK_SCATTER,
  TK_SEND,
  TK_RECV,
  TK_PUT, /* one-sided (signal.c): ncclPutSignal, ncclSignal, ncclWaitSignal */
  TK_SIGNAL,
  TK_WAITSIG,
  TK_COUNT
};

enum prog { PROG_DONE = 0, PROG_MOVED, PROG_BLOCKED };

struct task {
  int kind;
  const char* opname;
  struct ncclComm* comm;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  int dtype;
  int op;   /* the user's ncclRedOp_t, for messages */
  int root; /* root of rooted collectives, peer of send/recv, -1 otherwise */
  struct redop rop;
  const void* scalar_p; /* PreMulSum with ncclScalarDevice: read when the task starts */
  pycollStream_t stream;
  void* launch_marker; /* *Config variants: completes when the operation starts executing */
  struct rma_args* rma; /* one-sided operations: owned by the task (rma_release) */
  /* its communicator's last task on a stream when submitted (stream_order): `after`, made by a later operation of the
   * communicator on another stream (or the NULL stream), is fired once it has finished (tasks_finish) */
  bool ordered;
  void* after;

  /* execution state */
  bool started, done;
  bool open; /* counted in its comm's p2p_open until it is done (task_count, task_done) */
  bool prepared; /* run_tasks_until set it up (a call that returns unfinished leaves it so) */
  int algo;
  uint64_t step0;
  uint32_t nsteps, step;
  int phase;
  int wait_idx;
  int wait_peer;
  uint32_t polls; /* of the peers' arrivals at this step, while below ARRIVE_QUIET_POLLS (coll.c) */
  size_t piece; /* elements per step (per block for the block-wise collectives) */
  uint32_t nchunks; /* pipelined AllReduce/Reduce: chunks of `piece` elements (nsteps = nchunks + 1) */
  bool stream_out;  /* write the output with streaming stores */
  int timed_store;  /* one of the operations that measure which stores are faster (coll.c): which + 1, else 0 */
  uint64_t t_start; /* when it started, for that measurement */
  /* An operation that can go over windows: the windows of this comm holding the send and receive buffers
   * (referenced; NULL: none) and the buffers' offsets in them; win_key as op_desc's */
  struct ncclWindow_vidmem* win[2];
  uint64_t win_off[2];
  uint64_t win_key;
  uint64_t op_seq; /* the comm's collectives that carry data, from 0 (compared across ranks) */
  uint64_t issued; /* this collective's number among all the comm's collectives, from 1 (for messages) */
  uint64_t msg_seq;
  size_t off;
  bool first_chunk;
  ncclResult_t result;
  /* Small collectives of one group published together in one step (coll.c): where this operation's payload
   * lies in its rank's inbox; a batch's first operation (its leader) also holds how many operations it
   * publishes (1: itself only) and their key (0: no batch) */
  size_t ioff;
  uint32_t batch_n;
  uint64_t batch_key;
  struct task* lane_prev;
  struct task* lane_next; /* the next task of this lane in the list (run_tasks_until links them) */
  struct task* next;
};

const char* task_kind_name(int kind);

/* Validates and submits one operation (collective or p2p): runs it now (NULL stream), queues it on
 * its stream, or keeps it for ncclGroupEnd. `proto` is copied. */
ncclResult_t enqueue_task(const struct task* proto, const ncclCollConfig_t* cfg);

/* Runs `list` (linked by next) to completion in the calling thread. Tasks keep their comm
 * references; the caller releases them. Returns the first error. */
ncclResult_t run_tasks(struct task* list);
/* The same, but returns once `deadline` (monotonic ns), or `budget_ns` after its first look at the clock (tasks
 * that finish in the first pass make none), has passed with tasks unfinished (UINT64_MAX: none): *finished false,
 * the tasks as far as they got (their comm references and buffers still theirs); a later call on the same list,
 * in any thread, resumes them. *finished true: as run_tasks. */
ncclResult_t run_tasks_until(struct task* list, uint64_t deadline, uint64_t budget_ns, bool* finished);
/* Counts `t` in (delta 1) or out (-1) of its comm's pending work and, a task with one peer (a send, receive, put
 * or signal), of the work open with that peer (pycollCommPeerOpen), which it leaves as soon as it is done (task_done:
 * a group's tasks are finished together, at the end of the last). */
void task_count(struct task* t, int delta);
void task_done(struct task* t);
/* Releases what tasks hold (comm references, pending counts) and frees heap tasks. */
void tasks_finish(struct task* list, bool heap);

/* The settings that decide how a collective runs (its algorithm, its pieces, which lane), which every rank of a
 * communicator must share -- a rank planning alone a one-phase reduction where the others pipeline it returned
 * unreduced data -- and their variables' names (coll.c). */
void coll_plan(uint64_t plan[SEG_PLAN_N]);
extern const char* const coll_plan_names[SEG_PLAN_N];
/* The operations of this process that ended failed (finished with an error), any communicator, any stream (each
 * stream counts its own too): an event's record keeps the count as it completed, so that two events tell whether one
 * failed between them (stream.c, events_clean). */
extern uint64_t host_tasks_failed;
/* Per-kind progress (coll.c, p2p.c). */
void coll_start(struct task* t);
int coll_progress(struct task* t);
/* A collective waiting for its ranks' arrival waits for all of them, not only the first one it waits for
 * (wait_peer): the error of another one that is gone or failed (ncclSuccess: none), its text in `text`. */
ncclResult_t coll_check_waited(struct task* t, bool check_process, char* text, size_t len);
/* A collective of one step and a few KiB at most, a send or receive of one chunk of at most 32 KiB (coll.c): what one
 * pass of its rank does quickly. */
bool coll_quick(const struct task* t);
void p2p_start(struct task* t);
int p2p_progress(struct task* t);
/* One-sided operations (signal.c). */
ncclResult_t rma_validate(struct ncclComm* c, struct task* t);
int rma_progress(struct task* t);
void rma_release(struct task* t);
/* The state checks every operation makes before it is accepted (revoked, not ready, broken,
 * finalized, suspended). */
ncclResult_t task_check_comm(struct ncclComm* c, const char* opname);

/* Fails `t` with `code`; marks the comm broken unless the failure is the comm being aborted. */
int task_fail(struct task* t, int code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failpoint's "raise" where a thread takes up a task list: "`who` : failpoint `point`" logged, and every task of
 * `list` not done yet failed with it. */
void tasks_fail_at(struct task* list, const char* who, const char* point);

#endif
