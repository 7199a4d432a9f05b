/* The collective and p2p entry points: argument checks, then run now (NULL stream), queue on a
 * host stream, or keep for ncclGroupEnd; and the engine that runs a set of tasks. */
#include "enqueue.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "debug.h"
#include "failpoint.h"
#include "group.h"
#include "handles.h"
#include "stream.h"
#include "window.h"

const char* task_kind_name(int kind) {
  static const char* names[TK_COUNT] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                                        "AlltoAll",  "Gather",    "Scatter", "Send",      "Recv",
                                        "PutSignal", "Signal",    "WaitSignal"};
  return (kind >= 0 && kind < TK_COUNT) ? names[kind] : "Invalid";
}

uint64_t host_tasks_failed = 0;

static void finish_task(struct task* t, int code) {
  t->result = (ncclResult_t)code;
  if (code != ncclSuccess) { /* before its end event completes */
    __atomic_add_fetch(&host_tasks_failed, 1, __ATOMIC_SEQ_CST);
    stream_note_failed(t->stream);
  }
  task_done(t);
}

int task_fail(struct task* t, int code, const char* fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  CWARN(t->comm, "%s", text);
  comm_fail(t->comm, code, text);
  finish_task(t, code);
  return PROG_DONE;
}

void tasks_fail_at(struct task* list, const char* who, const char* point) {
  WARN("%s : failpoint %s", who, point);
  for (struct task* u = list; u; u = u->next)
    if (!u->done) task_fail(u, ncclSystemError, "%s : failpoint %s", u->opname, point);
}

/* The comm is being aborted, revoked or shrunk with NCCL_SHRINK_ABORT under this task. */
static void fail_aborted(struct task* t) {
  struct ncclComm* c = t->comm;
  switch (__atomic_load_n(&c->abort_reason, __ATOMIC_ACQUIRE)) {
    case AB_REVOKE:
      CWARN(c, "%s : communicator was revoked while the operation was in flight", t->opname);
      finish_task(t, ncclInvalidUsage);
      break;
    case AB_SHRINK:
      task_fail(t, ncclInvalidUsage, "%s : operation aborted by ncclCommShrink(NCCL_SHRINK_ABORT)", t->opname);
      break;
    default:
      CWARN(c, "%s : communicator was aborted (ncclCommAbort) while the operation was in flight", t->opname);
      finish_task(t, ncclInvalidUsage);
      break;
  }
}

/* Conditions that make a task fail before it starts (checked again at execution time, since a
 * queued task may start long after it was enqueued). */
static bool precheck(struct task* t) {
  struct ncclComm* c = t->comm;
  if (COMM_FLAG(c, revoked)) {
    CWARN(c, "%s: communicator was revoked", t->opname);
    finish_task(t, ncclInvalidUsage);
    return false;
  }
  int b = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  if (b) {
    finish_task(t, b);
    return false;
  }
  if (COMM_FLAG(c, suspended)) {
    CWARN(c, "%s : communicator is suspended (ncclCommSuspend); call ncclCommResume first", t->opname);
    finish_task(t, ncclInvalidUsage);
    return false;
  }
  return true;
}

static int task_progress(struct task* t) {
  if (!t->started && t->launch_marker) marker_fire(t->launch_marker);
  if (t->kind >= TK_PUT) return rma_progress(t);
  return t->kind < TK_SEND ? coll_progress(t) : p2p_progress(t);
}

static bool eligible(const struct task* t) { return !t->done && (!t->lane_prev || t->lane_prev->done); }

/* One pass over the tasks; returns how many are unfinished and whether any moved. */
static int pass(struct task* list, bool* moved) {
  int remaining = 0;
  for (struct task* t = list; t; t = t->next) {
    if (t->done) continue;
    if (!eligible(t)) {
      remaining++;
      continue;
    }
    struct ncclComm* c = t->comm;
    if (UNLIKELY(comm_aborting(c))) {
      fail_aborted(t);
      *moved = true;
      continue;
    }
    int b = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
    if (UNLIKELY(b)) { /* another task of this comm failed */
      finish_task(t, b);
      *moved = true;
      continue;
    }
    int r = task_progress(t);
    if (r == PROG_DONE) {
      task_done(t);
      *moved = true;
    } else {
      if (r == PROG_MOVED) *moved = true;
      remaining++;
    }
  }
  return remaining;
}

struct sleep_ctx {
  struct task* list;
};

static bool still_blocked(void* arg) {
  struct sleep_ctx* ctx = arg;
  bool moved = false;
  int remaining = pass(ctx->list, &moved);
  return remaining && !moved;
}

/* Checks the peers that blocked tasks wait for; fails tasks whose peer is gone. */
static void check_peers(struct task* list, bool check_process) {
  char text[512];
  for (struct task* t = list; t; t = t->next) {
    if (!eligible(t) || !t->started) continue;
    if (UNLIKELY(fp_hit("host.wait.check_peer"))) {
      task_fail(t, ncclSystemError, "%s : failpoint host.wait.check_peer", t->opname);
      continue;
    }
    int waited = t->wait_peer;
    ncclResult_t err = comm_check_peer(t->comm, waited, check_process, text, sizeof text);
    if (err == ncclSuccess && t->kind < TK_SEND) err = coll_check_waited(t, check_process, text, sizeof text);
    if (err == ncclSuccess) continue;
    /* the peer may have published what we wait for right before leaving: the task then gets past it, to its end
     * or to another peer it waits for (a receiver that checked a sender's part, not taken it, reports no move) */
    int r = task_progress(t);
    if (r == PROG_BLOCKED && t->wait_peer == waited) task_fail(t, err, "%s : %s", t->opname, text);
    else if (r == PROG_DONE) task_done(t);
  }
}

/* Publishes `cpu` as where the waiting tasks' ranks wait; the first of those tasks (NULL: none). */
static struct task* publish_cpu(struct task* list, int cpu) {
  struct task* blocked = NULL;
  for (struct task* t = list; t; t = t->next) {
    if (!eligible(t) || !t->started) continue;
    struct rank_ctrl* me = &t->comm->seg.ctrl[t->comm->rank];
    if (__atomic_load_n(&me->cpu, __ATOMIC_RELAXED) != cpu) __atomic_store_n(&me->cpu, cpu, __ATOMIC_RELAXED);
    if (!blocked) blocked = t;
  }
  return blocked;
}

/* Where the ranks outnumber the CPUs, at the first wait of this thread and every 64th after: a CPU of this thread's
 * mask where at least two fewer of c's ranks last waited than on `cpu` (this rank's), if this rank is the highest
 * there (one of them moves, not all); -1: none. */
static int emptier_cpu(struct ncclComm* c, int cpu) {
  static __thread unsigned waits;
  if ((waits++ & 63) != 0 || cpu < 0 || cpu >= CPU_SETSIZE) return -1;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0 || CPU_COUNT(&mask) < 2) return -1;
  uint16_t on[CPU_SETSIZE];
  memset(on, 0, sizeof on);
  for (int k = 0; k < c->nranks; k++) {
    int w = __atomic_load_n(&c->seg.ctrl[k].cpu, __ATOMIC_RELAXED);
    if (w < 0 || w >= CPU_SETSIZE) continue;
    if (w == cpu && k > c->rank) return -1;
    on[w]++;
  }
  int to = -1;
  for (int x = 0; x < CPU_SETSIZE; x++)
    if (x != cpu && CPU_ISSET(x, &mask) && (to < 0 || on[x] < on[to])) to = x;
  return to >= 0 && on[to] + 2 <= on[cpu] ? to : -1;
}

/* Spinning only helps when the peer we wait for runs on another CPU. Publish where we wait; where the ranks
 * outnumber the CPUs and this CPU holds two of them more than another, move there (spread_from); when the peer last
 * waited on this CPU, move to another CPU where the ranks do not outnumber the CPUs (they share this one by
 * accident), else yield at once (it needs ours to make progress). */
static void spin_or_yield(struct task* list, struct backoff* b) {
  int cpu = sched_getcpu();
  struct task* blocked = publish_cpu(list, cpu);
  if (!blocked) return;
  int to = b->oversubscribed ? emptier_cpu(blocked->comm, cpu) : -1;
  if (to >= 0 && spread_from(cpu, to)) publish_cpu(list, cpu = sched_getcpu());
  if (blocked->wait_peer < 0 ||
      __atomic_load_n(&blocked->comm->seg.ctrl[blocked->wait_peer].cpu, __ATOMIC_RELAXED) != cpu)
    return;
  if (!b->oversubscribed && spread_from(cpu, -1))
    publish_cpu(list, sched_getcpu());
  else
    b->spin_ns = 0;
}

/* The peer the first blocked task waits for (-1: none known); its death wakes the sleep. */
static int first_wait_peer(struct task* list) {
  for (struct task* t = list; t; t = t->next)
    if (eligible(t) && t->started && t->wait_peer >= 0 && t->wait_peer != t->comm->rank) return t->wait_peer;
  return -1;
}

static int cmp_ptr(const void* a, const void* b) {
  uintptr_t x = (uintptr_t) * (void* const*)a, y = (uintptr_t) * (void* const*)b;
  return x < y ? -1 : x > y;
}

static int lane_of(const struct task* t) {
  if (t->kind == TK_WAITSIG) return -2;
  if (t->kind >= TK_PUT) return -3 - t->root; /* puts and signals to one peer stay in order */
  return t->kind < TK_SEND ? -1 : (t->kind == TK_SEND ? 2 * t->root : 2 * t->root + 1);
}

ncclResult_t run_tasks(struct task* list) {
  bool finished;
  return run_tasks_until(list, UINT64_MAX, UINT64_MAX, &finished);
}

/* A list of several communicators' tasks (a group's) holds each one entered and its exec_mu until the whole list
 * is done: an abort or revoke of one waits for that (comm_wait_inactive). Where one of them is aborting and its
 * tasks in the list are done (they fail at once), it is let go here (comms[i] set to NULL), so that its abort does
 * not wait for the other communicators' operations -- an alive but slow peer of those, for their whole timeout.
 * NCCL's abort of one communicator of a group does not wait for the others' kernels either. */
static void let_go_aborted(struct task* list, struct ncclComm** comms, bool* entered, int nc) {
  for (int i = 0; i < nc; i++) {
    struct ncclComm* c = comms[i];
    if (!c || !comm_aborting(c)) continue;
    bool open = false;
    for (struct task* t = list; t && !open; t = t->next) open = t->comm == c && !t->done;
    if (open) continue;
    if (entered[i]) comm_leave(c);
    pthread_mutex_unlock(&c->exec_mu);
    comms[i] = NULL;
  }
}

ncclResult_t run_tasks_until(struct task* list, uint64_t deadline, uint64_t budget_ns, bool* finished) {
  struct ncclComm* stack_comms[8];
  struct ncclComm** comms = stack_comms;
  int nc = 0, cap = 8;
  for (struct task* t = list; t; t = t->next) {
    int i = 0;
    while (i < nc && comms[i] != t->comm) i++;
    if (i < nc) continue;
    if (nc == cap) {
      struct ncclComm** bigger = malloc(sizeof *bigger * (size_t)cap * 2);
      memcpy(bigger, comms, sizeof *comms * (size_t)nc);
      if (comms != stack_comms) free(comms);
      comms = bigger;
      cap *= 2;
    }
    comms[nc++] = t->comm;
  }
  if (nc > 1) qsort(comms, (size_t)nc, sizeof *comms, cmp_ptr);
  bool entered_stack[8];
  bool* entered = nc <= 8 ? entered_stack : malloc(sizeof(bool) * (size_t)nc);
  bool oversub = false;
  /* budget 0: a caller's pass before the stream's thread takes over (stream.c), which must not wait -- not for
   * another thread running these comms' work either (it leaves the tasks untouched then) -- and hands back
   * without the handback failpoint */
  bool one_pass = budget_ns == 0;
  *finished = false;
  for (int i = 0; i < nc; i++) {
    if (!one_pass) {
      pthread_mutex_lock(&comms[i]->exec_mu);
    } else if (pthread_mutex_trylock(&comms[i]->exec_mu) != 0) {
      while (i-- > 0) {
        if (entered[i]) comm_leave(comms[i]);
        pthread_mutex_unlock(&comms[i]->exec_mu);
      }
      if (entered != entered_stack) free(entered);
      if (comms != stack_comms) free(comms);
      return ncclSuccess;
    }
    entered[i] = comm_enter(comms[i]);
    oversub |= comms[i]->oversubscribed;
  }
  for (struct task* t = list; t; t = t->next) {
    int i = 0;
    while (comms[i] != t->comm) i++;
    if (t->prepared) { /* an earlier call ran it part of the way: its state stands */
      if (!t->done && !entered[i]) fail_aborted(t);
      continue;
    }
    t->prepared = true;
    t->done = false;
    t->wait_peer = -1;
    t->lane_prev = t->lane_next = NULL;
    if (!entered[i]) fail_aborted(t);
    else precheck(t);
    for (struct task* u = list; u != t; u = u->next)
      if (u->comm == t->comm && lane_of(u) == lane_of(t)) t->lane_prev = u;
    if (t->lane_prev) t->lane_prev->lane_next = t;
  }

  struct backoff b;
  backoff_reset_adaptive(&b, oversub, nc ? &comms[0]->yields : NULL); /* an empty list has no communicator */
  if (backoff_brief(&b) && UNLIKELY(fp_hit("host.wait.brief"))) tasks_fail_at(list, "run_tasks", "host.wait.brief");
  bool bounded = deadline != UINT64_MAX || budget_ns != UINT64_MAX;
  unsigned rounds = 0;
  for (;;) {
    bool moved = false;
    int remaining = pass(list, &moved);
    if (!remaining) {
      *finished = true;
      break;
    }
    /* the deadline: every 64th round that made progress, and in a round that did not, when the backoff read the
     * clock (one read per round once the first short spins are over; none in them) */
    enum wait_phase ph = WAIT_SPIN;
    uint64_t t = 0;
    if (moved) {
      backoff_restart(&b, oversub);
      if (bounded && (++rounds & 63) == 0) t = now_ns();
    } else {
      if (one_pass) break; /* its deadline is its first look at the clock */
      if (b.iter == 0) spin_or_yield(list, &b);
      ph = backoff_step(&b);
      if (bounded) t = b.now;
    }
    if (t) {
      if (budget_ns != UINT64_MAX) { /* the budget counts from the first look at the clock: no read for tasks done at once */
        deadline = MIN(deadline, budget_ns > UINT64_MAX - t ? UINT64_MAX : t + budget_ns);
        budget_ns = UINT64_MAX;
      }
      if (t >= deadline) {
        if (one_pass || LIKELY(!fp_hit("host.stream.handback"))) break;
        tasks_fail_at(list, "run_tasks", "host.stream.handback");
        continue;
      }
    }
    if (moved || ph == WAIT_SPIN) continue;
    if (nc > 1) let_go_aborted(list, comms, entered, nc);
    check_peers(list, backoff_due(&b, peer_check_ns));
    if (ph == WAIT_SLEEP) {
      uint64_t ns = backoff_sleep_ns(&b);
      if (bounded) {
        if (b.now >= deadline) continue; /* the next round returns */
        ns = MIN(ns, deadline - b.now);
      }
      struct ncclComm* only = nc == 1 ? comms[0] : NULL;
      if (only && entered[0]) {
        struct sleep_ctx ctx = {list};
        int peer = first_wait_peer(list);
        doorbell_sleep_on(&only->seg.hdr->bell, peer >= 0 ? &only->seg.ctrl[peer].life : NULL, ns, still_blocked, &ctx);
      } else {
        struct timespec ts = {0, (long)MIN(ns, 200000)};
        nanosleep(&ts, NULL);
      }
    }
  }

  for (int i = nc - 1; i >= 0; i--) {
    if (!comms[i]) continue; /* let go already (let_go_aborted) */
    if (entered[i]) comm_leave(comms[i]);
    pthread_mutex_unlock(&comms[i]->exec_mu);
  }
  if (entered != entered_stack) free(entered);
  if (comms != stack_comms) free(comms);
  if (!*finished) return ncclSuccess;
  for (struct task* t = list; t; t = t->next)
    if (t->result != ncclSuccess) return t->result;
  return ncclSuccess;
}

static void task_close(struct task* t) {
  if (t->open) {
    t->open = false;
    __atomic_sub_fetch(&t->comm->p2p_open[t->root], 1, __ATOMIC_ACQ_REL);
  }
}

void task_count(struct task* t, int delta) {
  struct ncclComm* c = t->comm;
  __atomic_add_fetch(&c->pending, delta, __ATOMIC_ACQ_REL);
  if (delta < 0) {
    task_close(t);
  } else if (t->kind >= TK_SEND && t->root >= 0 && t->root < c->nranks && c->p2p_open) {
    t->open = true;
    __atomic_add_fetch(&c->p2p_open[t->root], 1, __ATOMIC_ACQ_REL);
  }
}

void task_done(struct task* t) {
  t->done = true;
  task_close(t);
}

void tasks_finish(struct task* list, bool heap) {
  for (struct task *t = list, *next; t; t = next) {
    next = t->next;
    if (t->ordered) stream_order_done(t);
    if (t->launch_marker) marker_release(t->launch_marker);
    if (t->rma) rma_release(t);
    for (int i = 0; i < 2; i++)
      if (t->win[i]) window_put(t->win[i]);
    task_count(t, -1);
    comm_release(t->comm);
    if (heap) free(t);
  }
}

/* ---- argument checks ---- */

static bool needs_send(const struct task* t, int rank) {
  switch (t->kind) {
    case TK_BROADCAST:
    case TK_SCATTER: return rank == t->root;
    case TK_RECV: return false;
    default: return true;
  }
}

static bool needs_recv(const struct task* t, int rank) {
  switch (t->kind) {
    case TK_REDUCE:
    case TK_GATHER: return rank == t->root;
    case TK_SEND: return false;
    default: return true;
  }
}

static ncclResult_t resolve_op(struct ncclComm* c, struct task* t) {
  int op = t->op;
  t->rop.dtype = t->dtype;
  if (op < 0 || op > ncclMaxRedOp) {
    CWARN(c, "%s : invalid reduction operation %d", t->opname, op);
    return ncclInvalidArgument;
  }
  if (op < ncclAvg) {
    t->rop.kind = op;
    return ncclSuccess;
  }
  if (op == ncclAvg) {
    if (dt_is_float(t->dtype)) {
      t->rop.kind = RK_PREMULSUM;
      t->rop.scalar = dt_scalar_from_double(t->dtype, 1.0 / c->nranks);
    } else {
      t->rop.kind = RK_SUMDIV;
      t->rop.divisor = c->nranks;
    }
    return ncclSuccess;
  }
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&c->mu);
  int ix = op - ncclNumOps;
  if (ix >= c->nredops || !c->redops[ix].used) {
    CWARN(c, "%s : reduction operation %d unknown to this communicator", t->opname, op);
    r = ncclInvalidArgument;
  } else if (c->redops[ix].dtype != t->dtype) {
    CWARN(c, "%s : Data type supplied to user-created ncclRedOp_t does not match type given to reduction operation",
          t->opname);
    r = ncclInvalidArgument;
  } else {
    t->rop.kind = RK_PREMULSUM;
    t->rop.scalar = c->redops[ix].scalar;
    t->scalar_p = c->redops[ix].residence == ncclScalarDevice ? c->redops[ix].scalar_p : NULL;
  }
  pthread_mutex_unlock(&c->mu);
  return r;
}

static ncclResult_t check_coll_config(struct ncclComm* c, const char* opname, const ncclCollConfig_t* cfg,
                                      struct task* t) {
  if (!cfg) return ncclSuccess;
  ncclCollConfig_t k;
  memset(&k, 0, sizeof k);
  size_t size;
  memcpy(&size, cfg, sizeof size);
  memcpy(&k, cfg, MIN(size, sizeof k));
  if (size < 16 || k.magic != NCCL_API_MAGIC) {
    CWARN(c, "%s : ncclCollConfig_t argument not initialized via NCCL_COLLCONFIG_INITIALIZER", opname);
    return ncclInvalidArgument;
  }
  int vals[] = {k.minCTAs, k.maxCTAs, k.nvlsCTAs, k.cgaClusterSize};
  const char* names[] = {"minCTAs", "maxCTAs", "nvlsCTAs", "cgaClusterSize"};
  for (int i = 0; i < 4; i++)
    if (size >= offsetof(ncclCollConfig_t, algSelection) && vals[i] != NCCL_CONFIG_UNDEF_INT && vals[i] <= 0) {
      CWARN(c, "%s : Invalid collective config %s attribute value %d", opname, names[i], vals[i]);
      return ncclInvalidArgument;
    }
  if (size >= offsetof(ncclCollConfig_t, CTAPolicy) + sizeof(int) && k.CTAPolicy != NCCL_CONFIG_UNDEF_INT &&
      (k.CTAPolicy < 0 || k.CTAPolicy > (NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO))) {
    CWARN(c, "%s : Invalid collective config CTAPolicy attribute value %d", opname, k.CTAPolicy);
    return ncclInvalidArgument;
  }
  if (size >= sizeof k && k.launchCompletionEvent) {
    if (!event_valid((pycollEvent_t)k.launchCompletionEvent)) {
      CWARN(c, "%s : launchCompletionEvent %p is not a pycoll host event", opname, k.launchCompletionEvent);
      return ncclInvalidArgument;
    }
    t->launch_marker = event_arm((pycollEvent_t)k.launchCompletionEvent);
  }
  return ncclSuccess;
}

ncclResult_t task_check_comm(struct ncclComm* c, const char* opn) {
  if (COMM_FLAG(c, revoked)) {
    CWARN(c, "%s: communicator was revoked", opn);
    return ncclInvalidUsage;
  }
  ncclResult_t r = comm_ensure_ready(c, opn);
  if (r != ncclSuccess) return r;
  int b = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  if (b) return comm_refuse_failed(c, b); /* an earlier failure: report its text */
  if (COMM_FLAG(c, finalize_called) || COMM_FLAG(c, destroy_called)) {
    CWARN(c, "%s : communicator is finalized or being destroyed", opn);
    return ncclInvalidUsage;
  }
  if (COMM_FLAG(c, suspended)) {
    CWARN(c, "%s : communicator is suspended (ncclCommSuspend); call ncclCommResume first", opn);
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

static ncclResult_t validate(struct ncclComm* c, struct task* t, const ncclCollConfig_t* cfg) {
  const char* opn = t->opname;
  ncclResult_t r = task_check_comm(c, opn);
  if (r != ncclSuccess) return r;
  bool rooted = t->kind == TK_BROADCAST || t->kind == TK_REDUCE || t->kind == TK_GATHER || t->kind == TK_SCATTER;
  if (rooted && (t->root < 0 || t->root >= c->nranks)) {
    CWARN(c, "%s : invalid root %d (root should be in the 0..%d range)", opn, t->root, c->nranks - 1);
    return ncclInvalidArgument;
  }
  if ((t->kind == TK_SEND || t->kind == TK_RECV) && (t->root < 0 || t->root >= c->nranks)) {
    CWARN(c, "%s : invalid peer %d (peer should be in the 0..%d range)", opn, t->root, c->nranks - 1);
    return ncclInvalidArgument;
  }
  if (!rooted && t->kind != TK_SEND && t->kind != TK_RECV) t->root = -1;
  if (t->dtype < 0 || t->dtype >= ncclNumTypes) {
    CWARN(c, "%s : invalid type %d", opn, t->dtype);
    return ncclInvalidArgument;
  }
  if (t->kind == TK_ALLREDUCE || t->kind == TK_REDUCE || t->kind == TK_REDUCESCATTER) {
    if ((r = resolve_op(c, t)) != ncclSuccess) return r;
  } else {
    t->op = ncclSum;
    t->rop.kind = RK_SUM;
    t->rop.dtype = t->dtype;
  }
  size_t es = dt_size(t->dtype);
  size_t blocks = (t->kind == TK_ALLGATHER || t->kind == TK_REDUCESCATTER || t->kind == TK_ALLTOALL ||
                   t->kind == TK_GATHER || t->kind == TK_SCATTER)
                      ? (size_t)c->nranks
                      : 1;
  if (t->count > SIZE_MAX / es / blocks / 2) {
    CWARN(c, "%s : count %zu is too large", opn, t->count);
    return ncclInvalidArgument;
  }
  if (t->count > 0 && needs_send(t, c->rank) && !t->sendbuff) {
    CWARN(c, "%s : sendbuff argument is NULL", opn);
    return ncclInvalidArgument;
  }
  if (t->count > 0 && needs_recv(t, c->rank) && !t->recvbuff) {
    CWARN(c, "%s : recvbuff argument is NULL", opn);
    return ncclInvalidArgument;
  }
  if (t->stream && !stream_valid(t->stream)) {
    CWARN(c, "%s : stream %p is not a valid pycoll host stream (create it with pycollStreamCreate; one made before "
          "this process was forked is its parent's)", opn, (void*)t->stream);
    return ncclInvalidArgument;
  }
  return check_coll_config(c, opn, cfg, t);
}

ncclResult_t enqueue_task(const struct task* proto, const ncclCollConfig_t* cfg) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(proto->comm, proto->opname, &c);
  if (r != ncclSuccess) return group_note_error(r);
  struct task local = *proto;
  local.comm = c;
  local.next = NULL;
  local.stream = stream_resolve(local.stream);
  r = local.kind >= TK_PUT ? rma_validate(c, &local) : validate(c, &local, cfg);
  if (r == ncclSuccess && local.kind < TK_SEND) local.issued = __atomic_add_fetch(&c->coll_issued, 1, __ATOMIC_RELAXED);
  if (r != ncclSuccess || (local.count == 0 && local.kind < TK_SEND)) {
    if (local.rma) rma_release(&local);
    if (local.launch_marker) {
      marker_fire(local.launch_marker);
      marker_release(local.launch_marker);
    }
    comm_release(c);
    return group_note_error(r);
  }
  task_count(&local, 1);
  if (group_depth() > 0 || local.stream) {
    struct task* t = malloc(sizeof *t);
    if (!t) {
      local.next = NULL;
      tasks_finish(&local, false);
      WARN("%s : out of memory", proto->opname);
      return group_note_error(ncclSystemError);
    }
    *t = local;
    if (group_depth() > 0) return group_add_task(t);
    r = stream_submit(t->stream, t);
    if (r != ncclSuccess) tasks_finish(t, true);
    return r;
  }
  stream_order_wait(&local);
  r = run_tasks(&local);
  tasks_finish(&local, false);
  return r;
}

/* ---- entry points ---- */

#define TASK(K, NAME, SB, RB, CNT, DT, OP, ROOT, COMM, STREAM)                                                      \
  (struct task) {                                                                                                   \
    .kind = (K), .opname = (NAME), .comm = (COMM), .sendbuff = (SB), .recvbuff = (RB), .count = (CNT), .dtype = (DT), \
    .op = (OP), .root = (ROOT), .stream = (STREAM)                                                                  \
  }

NCCL_API ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t* config) {
  struct task t = TASK(TK_ALLREDUCE, "AllReduce", sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return ncclAllReduceConfig(sendbuff, recvbuff, count, datatype, op, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t* config) {
  struct task t = TASK(TK_BROADCAST, "Broadcast", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcastConfig(sendbuff, recvbuff, count, datatype, root, comm, stream, NULL);
}
NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
  return ncclBroadcastConfig(buff, buff, count, datatype, root, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                                       const ncclCollConfig_t* config) {
  struct task t = TASK(TK_REDUCE, "Reduce", sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return ncclReduceConfig(sendbuff, recvbuff, count, datatype, op, root, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t* config) {
  struct task t = TASK(TK_ALLGATHER, "AllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream) {
  return ncclAllGatherConfig(sendbuff, recvbuff, sendcount, datatype, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream, const ncclCollConfig_t* config) {
  struct task t =
      TASK(TK_REDUCESCATTER, "ReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return ncclReduceScatterConfig(sendbuff, recvbuff, recvcount, datatype, op, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config) {
  struct task t = TASK(TK_ALLTOALL, "AlltoAll", sendbuff, recvbuff, count, datatype, ncclSum, -1, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclComm_t comm, cudaStream_t stream) {
  return ncclAlltoAllConfig(sendbuff, recvbuff, count, datatype, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream,
                                       const ncclCollConfig_t* config) {
  struct task t = TASK(TK_GATHER, "Gather", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return ncclGatherConfig(sendbuff, recvbuff, count, datatype, root, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream,
                                        const ncclCollConfig_t* config) {
  struct task t = TASK(TK_SCATTER, "Scatter", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
  return enqueue_task(&t, config);
}
NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
  return ncclScatterConfig(sendbuff, recvbuff, count, datatype, root, comm, stream, NULL);
}

NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  struct task t = TASK(TK_SEND, "Send", sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
  return enqueue_task(&t, NULL);
}
NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  struct task t = TASK(TK_RECV, "Recv", NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
  return enqueue_task(&t, NULL);
}
