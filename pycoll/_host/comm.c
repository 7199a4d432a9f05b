#include "comm.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "debug.h"
#include "exitwatch.h"
#include <linux/futex.h>
#include "handles.h"
#include "window.h"

struct ncclComm* comm_alloc(void) {
  struct ncclComm* c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->magic = COMM_MAGIC;
  c->refs = 1; /* the registry's */
  c->rank = -1;
  c->async = ncclInProgress;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->err_mu, NULL);
  pthread_mutex_init(&c->exec_mu, NULL);
  c->token = new_claim_token();
  config_defaults(&c->config);
  return c;
}

void comm_register(struct ncclComm* c) { handle_add(c, H_COMM, 0); }
bool comm_unregister(struct ncclComm* c) { return handle_remove(c, H_COMM, NULL); }

ncclResult_t comm_acquire(ncclComm_t comm, const char* opname, struct ncclComm** out) {
  *out = NULL;
  if (!comm) {
    WARN("%s : comm argument is NULL", opname);
    return ncclInvalidArgument;
  }
  handle_lock();
  bool ok = handle_valid_locked(comm, H_COMM);
  if (ok) __atomic_add_fetch(&comm->refs, 1, __ATOMIC_ACQ_REL);
  handle_unlock();
  if (!ok) {
    WARN("%s : comm %p is not a valid communicator (it was destroyed or aborted, or never created)", opname,
         (void*)comm);
    return ncclInvalidArgument;
  }
  *out = comm;
  return ncclSuccess;
}

void comm_ref(struct ncclComm* c) { __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); }

static void comm_free(struct ncclComm* c) {
  comm_teardown(c, RS_DESTROYED);
  windows_comm_freed(c);
  free(c->redops);
  free(c->p2p_open);
  for (struct reg_entry *r = c->regs, *n; r; r = n) {
    n = r->next;
    free(r);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->err_mu);
  pthread_mutex_destroy(&c->exec_mu);
  c->magic = COMM_DEAD;
  quarantine_free(c);
}

void comm_release(struct ncclComm* c) {
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) comm_free(c);
}

void comm_set_last_error(struct ncclComm* c, const char* text) {
  pthread_mutex_lock(&c->err_mu);
  if (text != c->last_error) snprintf(c->last_error, sizeof c->last_error, "%s", text);
  pthread_mutex_unlock(&c->err_mu);
}

bool comm_copy_last_error(ncclComm_t comm, char* out, size_t len) {
  handle_lock();
  bool ok = handle_valid_locked(comm, H_COMM);
  if (ok) {
    pthread_mutex_lock(&comm->err_mu);
    snprintf(out, len, "%s", comm->last_error);
    pthread_mutex_unlock(&comm->err_mu);
  }
  handle_unlock();
  return ok;
}

bool comm_enter(struct ncclComm* c) {
  __atomic_add_fetch(&c->active, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&c->abort_flag, __ATOMIC_SEQ_CST) || c->torn_down) {
    __atomic_sub_fetch(&c->active, 1, __ATOMIC_SEQ_CST);
    return false;
  }
  return true;
}

void comm_leave(struct ncclComm* c) { __atomic_sub_fetch(&c->active, 1, __ATOMIC_SEQ_CST); }

void comm_wait_inactive(struct ncclComm* c) {
  struct backoff b;
  backoff_reset(&b, true);
  while (__atomic_load_n(&c->active, __ATOMIC_SEQ_CST) > 0) {
    if (backoff_step(&b) == WAIT_SLEEP) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
  }
}

ncclResult_t comm_wait_pending(struct ncclComm* c, bool abortable) {
  struct backoff b;
  backoff_reset(&b, true);
  while (__atomic_load_n(&c->pending, __ATOMIC_ACQUIRE) > 0) {
    if (abortable && comm_aborting(c)) return ncclInvalidUsage;
    if (backoff_step(&b) == WAIT_SLEEP) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  return ncclSuccess;
}

void comm_fail(struct ncclComm* c, int code, const char* text) {
  int expected = 0;
  /* first: an operation that this failure fails (a task that finds `broken` set, or its own) ends after it */
  comm_note_error_time(c);
  if (__atomic_compare_exchange_n(&c->broken, &expected, code, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    if (c->seg.base && c->rank >= 0 && !c->torn_down) {
      struct rank_ctrl* me = &c->seg.ctrl[c->rank];
      snprintf(me->fail_text, sizeof me->fail_text, "%s", text);
      me->fail_code = code;
      int st = __atomic_load_n(&me->state, __ATOMIC_ACQUIRE);
      if (st == RS_ACTIVE || st == RS_JOINED) __atomic_store_n(&me->state, RS_FAILED, __ATOMIC_RELEASE);
      doorbell_wake(&c->seg.hdr->bell);
    }
  }
  comm_set_last_error(c, text);
  pthread_mutex_lock(&c->err_mu);
  if (!c->fail_error[0]) snprintf(c->fail_error, sizeof c->fail_error, "%s", text);
  pthread_mutex_unlock(&c->err_mu);
  int ok = ncclSuccess;
  if (__atomic_compare_exchange_n(&c->async, &ok, code, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
    comm_async_changed(c);
}

void comm_note_async(struct ncclComm* c, int v) {
  pthread_mutex_lock(&c->err_mu);
  if (v != ncclSuccess && !c->fail_error[0])
    snprintf(c->fail_error, sizeof c->fail_error, "%s", c->last_error[0] ? c->last_error : ncclGetErrorString(v));
  else if (v == ncclSuccess && !__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
    c->fail_error[0] = 0;
  pthread_mutex_unlock(&c->err_mu);
}

ncclResult_t comm_refuse_failed(struct ncclComm* c, int code) {
  char text[sizeof c->fail_error];
  pthread_mutex_lock(&c->err_mu);
  snprintf(text, sizeof text, "%s", c->fail_error[0] ? c->fail_error : c->last_error);
  pthread_mutex_unlock(&c->err_mu);
  CWARN(c, "%s", text[0] ? text : ncclGetErrorString((ncclResult_t)code));
  return (ncclResult_t)code;
}

ncclResult_t comm_ensure_ready(struct ncclComm* c, const char* opname) {
  int a = comm_async(c);
  if (a == ncclInProgress) {
    CWARN(c, "%s : Attempt to use communicator before the previous operation returned ncclSuccess", opname);
    return ncclInvalidArgument;
  }
  if (a != ncclSuccess) return comm_refuse_failed(c, a);
  return ncclSuccess;
}

void comm_publish_state(struct ncclComm* c, int state) {
  pthread_mutex_lock(&c->mu);
  if (c->seg.base && !c->torn_down && c->rank >= 0 && c->rank < c->seg.nranks) {
    struct rank_ctrl* me = &c->seg.ctrl[c->rank];
    __atomic_store_n(&me->state, state, __ATOMIC_RELEASE);
    if ((state == RS_ABORTED || state == RS_REVOKED) && !__atomic_load_n(&me->left_state, __ATOMIC_RELAXED)) {
      /* after the state (a peer that reads this reads why it left there: comm_check_peer), how far it got, then
       * that it left: a peer still reading a step this rank completed is no failure */
      __atomic_store_n(&me->left_done, __atomic_load_n(&c->steps_done, __ATOMIC_ACQUIRE), __ATOMIC_RELAXED);
      __atomic_store_n(&me->left_state, state, __ATOMIC_RELEASE);
    }
    doorbell_wake(&c->seg.hdr->bell);
  }
  pthread_mutex_unlock(&c->mu);
}

void comm_wait_window_writers(struct ncclComm* c) {
  if (!c->seg.base || c->torn_down || c->rank < 0) return;
  __atomic_thread_fence(__ATOMIC_SEQ_CST); /* pairs with coll.c's window_piece_begin */
  uint64_t until = now_ns() + 1000000000ull;
  for (int k = 0; k < c->nranks; k++) {
    if (k == c->rank) continue;
    struct backoff b;
    backoff_reset(&b, true);
    while (__atomic_load_n(&c->seg.ctrl[k].in_windows, __ATOMIC_ACQUIRE) && !comm_peer_died(c, k, true)) {
      if (now_ns() > until) {
        CWARN(c, "rank %d still writes into this rank's windows 1 s after it left: given up waiting", k);
        return;
      }
      if (backoff_step(&b) == WAIT_SLEEP) usleep(100);
    }
  }
}

ncclResult_t comm_attach(struct ncclComm* c, struct seg* s, int rank) {
  int n = s->nranks;
  pthread_mutex_lock(&c->mu);
  c->seg = *s;
  pthread_mutex_unlock(&c->mu);
  c->rank = rank;
  c->nranks = n;
  c->nonce[0] = s->hdr->nonce[0];
  c->nonce[1] = s->hdr->nonce[1];
  c->peers = calloc((size_t)n, sizeof *c->peers);
  c->send_seq = calloc((size_t)n, sizeof *c->send_seq);
  c->recv_seq = calloc((size_t)n, sizeof *c->recv_seq);
  c->p2p_open = calloc((size_t)n, sizeof *c->p2p_open);
  if (!c->peers || !c->send_seq || !c->recv_seq || !c->p2p_open) {
    CWARN(c, "communicator init : out of memory");
    return ncclSystemError;
  }
  struct proc_id me;
  proc_self(&me);
  for (int k = 0; k < n; k++) {
    struct peer* p = &c->peers[k];
    p->proc = s->ctrl[k].proc;
    p->pidfd = -1;
    p->same_process = p->proc.pid == me.pid && p->proc.pidns == me.pidns;
    if (!p->same_process && p->proc.pidns == me.pidns) {
      /* a peer may already have finished and exited: that only matters if we ever wait for it */
      int fd = pidfd_open_pid(p->proc.pid);
      p->pidfd = fd >= 0 ? fd : -1;
      if (fd == -ESRCH || proc_alive(&p->proc) == 0) {
        if (p->pidfd >= 0) close(p->pidfd);
        p->pidfd = -1;
        p->gone = true;
      } else if (fd < 0) { /* alive, but no pidfd: the exit watcher cannot see it, the waiters read /proc */
        p->read_proc = true;
        INFO("rank %d: no pidfd for rank %d (pid %d): %s; its exit is found through its life word, else by reading "
             "/proc every PYCOLL_HOST_PEER_CHECK_NS", rank, k, p->proc.pid, strerror(-fd));
      }
    }
  }
  exitwatch_add(c);
  /* processes on this machine, not ranks of this comm, decide whether spinning can help */
  c->oversubscribed = n > host_ncpus();
  if (c->oversubscribed) host_note_oversubscribed();
  __atomic_store_n(&s->ctrl[rank].state, RS_ACTIVE, __ATOMIC_RELEASE);
  doorbell_ring(&s->hdr->bell);
  return ncclSuccess;
}

void comm_teardown(struct ncclComm* c, int final_state) {
  pthread_mutex_lock(&c->mu);
  if (c->torn_down) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->torn_down = true;
  pthread_mutex_unlock(&c->mu);
  exitwatch_remove(c); /* before the segment and the pidfds go */
  if (c->seg.base) {
    if (c->rank >= 0) {
      struct rank_ctrl* me = &c->seg.ctrl[c->rank];
      int st = __atomic_load_n(&me->state, __ATOMIC_ACQUIRE);
      /* a clean destroy keeps the record of an earlier failure or abort */
      if (!(final_state == RS_DESTROYED && (st == RS_FAILED || st == RS_ABORTED || st == RS_REVOKED)))
        __atomic_store_n(&me->state, final_state, __ATOMIC_RELEASE);
    }
    doorbell_wake(&c->seg.hdr->bell);
    seg_unmap(&c->seg);
  }
  if (c->peers) {
    for (int k = 0; k < c->nranks; k++)
      if (c->peers[k].pidfd >= 0) close(c->peers[k].pidfd);
    free(c->peers);
    c->peers = NULL;
  }
  free(c->send_seq);
  free(c->recv_seq);
  c->send_seq = c->recv_seq = NULL;
}

bool comm_peer_died(struct ncclComm* c, int k, bool check_process) {
  if (__atomic_load_n(&c->peers[k].gone, __ATOMIC_ACQUIRE)) return true;
  if (!(__atomic_load_n(&c->seg.ctrl[k].life, __ATOMIC_ACQUIRE) & FUTEX_OWNER_DIED)) {
    if (!check_process) return false;
    struct peer* p = &c->peers[k];
    return p->pidfd >= 0 ? pidfd_exited(p->pidfd) == 1 : p->read_proc && proc_alive(&p->proc) == 0;
  }
  /* the kernel woke one waiter of the word at most: wake this segment's others */
  if (!__atomic_exchange_n(&c->peers[k].gone, true, __ATOMIC_ACQ_REL)) {
    doorbell_wake(&c->seg.hdr->bell);
    idle_dead_process(c->peers[k].proc.pid, c->peers[k].pidfd);
  }
  return true;
}

ncclResult_t comm_check_peer(struct ncclComm* c, int k, bool check_process, char* text, size_t len) {
  if (k < 0 || k >= c->nranks || k == c->rank) return ncclSuccess;
  struct rank_ctrl* pc = &c->seg.ctrl[k];
  int st = __atomic_load_n(&pc->state, __ATOMIC_ACQUIRE);
  switch (st) {
    case RS_FINALIZED:
    case RS_DESTROYED:
      snprintf(text, len, "rank %d has %s the communicator while rank %d waits for it", k,
               st == RS_FINALIZED ? "finalized" : "destroyed", c->rank);
      return ncclRemoteError;
    case RS_ABORTED:
    case RS_REVOKED:
      /* a rank that failed first and then aborted or revoked (its policy): why it failed, which names the rank at
       * fault, where the state alone would name this one */
      if (pc->fail_text[0])
        snprintf(text, len, "rank %d %s the communicator after it failed: %.*s", k,
                 st == RS_ABORTED ? "aborted" : "revoked", (int)sizeof pc->fail_text, pc->fail_text);
      else
        snprintf(text, len, "rank %d %s the communicator", k, st == RS_ABORTED ? "aborted" : "revoked");
      return ncclRemoteError;
    case RS_FAILED: {
      int code = __atomic_load_n(&pc->fail_code, __ATOMIC_ACQUIRE);
      snprintf(text, len, "rank %d failed: %.*s", k, (int)sizeof pc->fail_text, pc->fail_text);
      return code ? (ncclResult_t)code : ncclRemoteError;
    }
    default: break;
  }
  if (comm_peer_died(c, k, check_process)) {
    snprintf(text, len, "rank %d (pid %d) exited", k, c->peers[k].proc.pid);
    return ncclRemoteError;
  }
  return ncclSuccess;
}
