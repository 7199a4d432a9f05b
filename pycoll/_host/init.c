/* Communicator lifecycle entry points: unique ids, init (blocking, nonblocking, scalable, all),
 * finalize, destroy, abort, revoke, the async error and the simple queries. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include "failpoint.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "debug.h"
#include "env.h"
#include "group.h"
#include "handles.h"
#include "stream.h"

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) {
    WARN("ncclGetUniqueId : uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  shm_sweep();
  return uid_make(uniqueId, UID_INIT, NULL, 0, 0);
}

/* ---- init ---- */

ncclResult_t job_run_init(struct job* j) {
  struct ncclComm* c = j->comm;
  uint32_t* flags[2] = {&c->abort_flag, j->parent ? &j->parent->abort_flag : NULL};
  uint64_t timeout_ns;
  if (!rendezvous_timeout_ns(&timeout_ns)) {
    CWARN(c, "%s : PYCOLL_HOST_INIT_TIMEOUT=%s is invalid: it must be a finite number of seconds in [0, %g]",
          j->opname, getenv("PYCOLL_HOST_INIT_TIMEOUT"), ENV_INIT_TIMEOUT_MAX);
    return ncclInvalidArgument;
  }
  struct rendezvous r = {.nonce = j->nonce,
                         .nranks = j->nranks,
                         .rank = j->rank,
                         .kind = j->seg_kind,
                         .token = c->token,
                         .ids_hash = j->ids_hash,
                         .expected = j->expected,
                         .abort_flags = flags,
                         .nabort = j->parent ? 2 : 1,
                         .timeout_ns = timeout_ns,
                         .opname = j->opname,
                         .comm = c};
  if (UNLIKELY(fp_hit(j->kind == JOB_GROW ? "host.grow.begin" : "host.init.begin"))) return ncclSystemError;
  struct seg s;
  ncclResult_t res = rendezvous_join(&r, &s);
  if (res != ncclSuccess) return res;
  res = comm_attach(c, &s, j->rank);
  if (res != ncclSuccess) {
    comm_fail(c, res, c->last_error);
    comm_teardown(c, RS_FAILED);
    return res;
  }
  INFO("%s : rank %d/%d ready (segment %s, %zu bytes)", j->opname, c->rank, c->nranks, s.name, s.size);
  if (UNLIKELY(fp_hit(j->kind == JOB_GROW ? "host.grow.end" : "host.init.end"))) {
    comm_fail(c, ncclSystemError, "failpoint");
    return ncclSystemError;
  }
  return ncclSuccess;
}

static uint64_t hash_ids(int nid, const ncclUniqueId* ids) {
  if (nid <= 1) return 0;
  uint64_t h = 0x5ca1ab1eull;
  for (int i = 0; i < nid; i++) {
    const struct host_uid* u = (const struct host_uid*)&ids[i];
    h = mix64(h ^ u->nonce[0]) ^ mix64(u->nonce[1] + (uint64_t)i);
  }
  return h;
}

/* Creates the comm object, registers it, sets *newcomm and launches the init job. */
static ncclResult_t init_common(ncclComm_t* newcomm, int nranks, int nid, const ncclUniqueId* ids, int rank,
                                const ncclConfig_t* config, const char* opname, int cuda_dev) {
  if (!newcomm) {
    WARN("%s : newcomm argument is NULL", opname);
    return group_note_error(ncclInvalidArgument);
  }
  *newcomm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    WARN("Invalid rank requested : %d/%d", rank, nranks);
    return group_note_error(ncclInvalidArgument);
  }
  if (nid < 1 || nid > nranks || !ids) {
    WARN("improper usage of ncclCommInitRank: nId = %d, nranks=%d", nid, nranks);
    return group_note_error(ncclInvalidArgument);
  }
  struct host_uid u;
  for (int i = 0; i < nid; i++) {
    ncclResult_t r = uid_parse(&ids[i], &u, opname, NULL);
    if (r != ncclSuccess) return group_note_error(r);
    if (u.kind != UID_INIT) {
      WARN("%s : this unique id comes from ncclCommGetUniqueId and can only be used with ncclCommGrow", opname);
      return group_note_error(ncclInvalidArgument);
    }
  }
  uid_parse(&ids[0], &u, opname, NULL);
  struct ncclComm* c = comm_alloc();
  struct job* j = calloc(1, sizeof *j);
  if (!c || !j) {
    free(c);
    free(j);
    WARN("%s : out of memory", opname);
    return group_note_error(ncclSystemError);
  }
  ncclResult_t r = parse_config(&c->config, config, opname, NULL);
  if (r != ncclSuccess) {
    comm_release(c);
    free(j);
    return group_note_error(r);
  }
  if (c->config.commName) snprintf(c->name, sizeof c->name, "%s", c->config.commName);
  c->config.commName = c->name[0] ? c->name : NULL;
  c->yields.name = c->name;
  c->config.netName = NULL;
  c->nranks = nranks;
  c->rank = rank;
  c->cuda_dev = cuda_dev;
  comm_register(c);
  *newcomm = c;
  comm_ref(c); /* the job's */
  j->kind = JOB_INIT;
  j->opname = opname;
  j->comm = c;
  j->slot = newcomm;
  j->nranks = nranks;
  j->rank = rank;
  j->seg_kind = SEG_INIT;
  j->nonce[0] = u.nonce[0];
  j->nonce[1] = u.nonce[1];
  j->ids_hash = hash_ids(nid, ids);
  return job_launch(j);
}

/* PYCOLL_HOST_BIND=1 (opt-in, like Open MPI's default binding): the thread that initialises
 * rank r of an n-rank communicator is bound to the (r mod #allowed)-th CPU it may run on, if
 * there are at least n of them. Off by default: threads started later inherit the binding. */
static void maybe_bind(int rank, int nranks) {
  if (!env_bind()) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < nranks) return;
  int k = rank % CPU_COUNT(&allowed);
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed) || k-- > 0) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) INFO("rank %d bound to CPU %d (PYCOLL_HOST_BIND)", rank, cpu);
    return;
  }
}

/* The device a communicator made in this thread reports (ncclCommCuDevice, cudaDev): the host library
 * has no GPU; a runtime standing in for CUDA (pycoll.emulated) sets its current device here. */
static __thread int current_device = 0;
NCCL_API void pycollSetDevice(int device) { current_device = device < 0 ? 0 : device; }

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                             ncclConfig_t* config) {
  maybe_bind(rank, nranks);
  return init_common(comm, nranks, 1, &commId, rank, config, "ncclCommInitRankConfig", current_device);
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  maybe_bind(rank, nranks);
  return init_common(comm, nranks, 1, &commId, rank, NULL, "ncclCommInitRank", current_device);
}

NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  maybe_bind(myrank, nranks);
  return init_common(newcomm, nranks, nId, commIds, myrank, config, "ncclCommInitRankScalable", current_device);
}

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms) {
    WARN("CommInitAll : comms argument is NULL");
    return ncclInvalidArgument;
  }
  if (ndev < 0) {
    WARN("Invalid device count requested : %d", ndev);
    return ncclInvalidArgument;
  }
  for (int i = 0; devlist && i < ndev; i++)
    if (devlist[i] < 0) {
      WARN("Invalid device %d", devlist[i]);
      return ncclInvalidArgument;
    }
  for (int i = 0; i < ndev; i++) comms[i] = NULL;
  if (ndev == 0) return ncclSuccess;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  /* NCCL's default config, as ncclCommInitRank's: NCCL_COMM_BLOCKING=0 makes these communicators nonblocking
   * too, and then the group end answers ncclInProgress with every handle valid, to be polled with
   * ncclCommGetAsyncError (NCCL's init.cc does the same: its NCCLCHECKGOTO lets ncclInProgress through). */
  ncclGroupStart();
  for (int i = 0; i < ndev; i++)
    init_common(&comms[i], ndev, 1, &id, i, NULL, "ncclCommInitAll", devlist ? devlist[i] : i);
  r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) {
    for (int i = 0; i < ndev; i++)
      if (comms[i]) {
        ncclCommAbort(comms[i]);
        comms[i] = NULL;
      }
  }
  return r;
}

/* ---- finalize, destroy, abort, revoke ---- */

ncclResult_t job_run_finalize(struct job* j) {
  struct ncclComm* c = j->comm;
  if (comm_wait_pending(c, true) != ncclSuccess || !comm_enter(c)) {
    CWARN(c, "ncclCommFinalize : communicator aborted during finalize");
    return ncclInvalidUsage;
  }
  struct seg* s = &c->seg;
  __atomic_store_n(&s->ctrl[c->rank].state, RS_FINALIZED, __ATOMIC_RELEASE);
  doorbell_wake(&s->hdr->bell);
  ncclResult_t res = ncclSuccess;
  struct backoff b;
  backoff_reset(&b, c->oversubscribed);
  char text[512];
  for (int k = 0; k < c->nranks && res == ncclSuccess;) {
    int st = k == c->rank ? RS_FINALIZED : __atomic_load_n(&s->ctrl[k].state, __ATOMIC_ACQUIRE);
    if (st == RS_FINALIZED || st == RS_DESTROYED) {
      k++;
      continue;
    }
    if (comm_aborting(c)) {
      CWARN(c, "ncclCommFinalize : communicator aborted during finalize");
      res = ncclInvalidUsage;
      break;
    }
    enum wait_phase ph = backoff_step(&b);
    if (ph == WAIT_SPIN) continue;
    ncclResult_t e = comm_check_peer(c, k, backoff_due(&b, peer_check_ns), text, sizeof text);
    st = __atomic_load_n(&s->ctrl[k].state, __ATOMIC_ACQUIRE);
    if (e != ncclSuccess && (st == RS_FINALIZED || st == RS_DESTROYED)) continue; /* it just got there */
    if (e != ncclSuccess) {
      CWARN(c, "ncclCommFinalize : %s", text);
      res = e;
    } else if (ph == WAIT_SLEEP) {
      doorbell_sleep(&s->hdr->bell, backoff_sleep_ns(&b), NULL, NULL);
    }
  }
  comm_leave(c);
  return res;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommFinalize", &c);
  if (r != ncclSuccess) return group_note_error(r);
  if (COMM_FLAG(c, revoked)) {
    CWARN(c, "ncclCommFinalize : communicator was revoked; destroy or abort it instead");
    r = ncclInvalidUsage;
  } else if (group_holds(c)) { /* its finalize would wait for them, and they run only after it */
    CWARN(c, "ncclCommFinalize : operations of this communicator wait in this thread's open group; end the group "
             "(ncclGroupEnd) before finalizing it");
    r = ncclInvalidUsage;
  } else if ((r = comm_ensure_ready(c, "ncclCommFinalize")) != ncclSuccess) {
  } else if (COMM_FLAG(c, finalize_called)) {
    CWARN(c, "ncclCommFinalize : communicator was already finalized");
    r = ncclInvalidArgument;
  }
  if (r != ncclSuccess) {
    comm_release(c);
    return group_note_error(r);
  }
  COMM_SET_FLAG(c, finalize_called, true);
  struct job* j = calloc(1, sizeof *j);
  if (!j) {
    comm_release(c);
    return ncclSystemError;
  }
  j->kind = JOB_FINALIZE;
  j->opname = "ncclCommFinalize";
  j->comm = c; /* the reference taken above */
  return job_launch(j);
}

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommDestroy", &c); /* refuses a handle destroyed, aborted or never made */
  if (r != ncclSuccess) return r;
  /* a background job publishes its result just before it stops counting as running: once the
   * result is out, destroy waits for that last step instead of refusing */
  while (__atomic_load_n(&c->job_running, __ATOMIC_ACQUIRE) && comm_async(c) != ncclInProgress) sched_yield();
  if (__atomic_load_n(&c->job_running, __ATOMIC_ACQUIRE)) {
    CWARN(c, "ncclCommDestroy : Attempt to use communicator before the previous operation returned ncclSuccess");
    comm_release(c);
    return ncclInvalidArgument;
  }
  if (group_holds(c)) { /* destroy would wait for them, and they run only at this thread's ncclGroupEnd */
    CWARN(c, "ncclCommDestroy : operations of this communicator wait in this thread's open group; end the group "
             "(ncclGroupEnd) before destroying it, or abort it");
    comm_release(c);
    return ncclInvalidUsage;
  }
  if (!comm_unregister(c)) {
    WARN("comm %p has already been destroyed", (void*)comm);
    comm_release(c);
    return ncclInvalidArgument;
  }
  COMM_SET_FLAG(c, destroy_called, true);
  comm_wait_pending(c, false);
  comm_wait_inactive(c);
  comm_teardown(c, RS_DESTROYED);
  comm_release(c); /* the registry's */
  comm_release(c);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommAbort", &c);
  if (r != ncclSuccess) return r;
  if (!comm_unregister(c)) {
    WARN("ncclCommAbort : comm %p is being destroyed or aborted by another thread", (void*)comm);
    comm_release(c);
    return ncclInvalidArgument;
  }
  COMM_SET_FLAG(c, destroy_called, true);
  __atomic_store_n(&c->abort_reason, AB_USER, __ATOMIC_RELEASE);
  __atomic_store_n(&c->abort_flag, 1, __ATOMIC_SEQ_CST);
  comm_publish_state(c, RS_ABORTED); /* peers waiting on us fail now */
  comm_wait_window_writers(c);
  struct backoff b;
  backoff_reset(&b, true);
  while (__atomic_load_n(&c->job_running, __ATOMIC_ACQUIRE)) {
    if (backoff_step(&b) == WAIT_SLEEP) usleep(200);
  }
  comm_wait_inactive(c);
  comm_teardown(c, RS_ABORTED);
  comm_release(c);
  comm_release(c);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm) return ncclSuccess;
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommRevoke", &c);
  if (r != ncclSuccess) return r;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    CWARN(c, "ncclCommRevoke : invalid revokeFlags %d (only NCCL_REVOKE_DEFAULT is supported)", revokeFlags);
    r = ncclInvalidArgument;
  } else if (COMM_FLAG(c, destroy_called) || COMM_FLAG(c, finalize_called)) {
    CWARN(c, "ncclCommRevoke : communicator is %s",
          COMM_FLAG(c, revoked) ? "already revoked" : "being finalized or destroyed");
    r = ncclInvalidArgument;
  }
  if (r != ncclSuccess) {
    comm_release(c);
    return r;
  }
  COMM_SET_FLAG(c, revoked, true);
  COMM_SET_FLAG(c, finalize_called, true);
  int was = comm_async(c);
  if (was != ncclInProgress) comm_set_async(c, ncclInProgress); /* until every operation has stopped */
  __atomic_store_n(&c->abort_reason, AB_REVOKE, __ATOMIC_RELEASE);
  __atomic_store_n(&c->abort_flag, 1, __ATOMIC_SEQ_CST);
  comm_publish_state(c, RS_REVOKED);
  comm_wait_window_writers(c);
  struct backoff b;
  backoff_reset(&b, true);
  while (__atomic_load_n(&c->job_running, __ATOMIC_ACQUIRE)) {
    if (backoff_step(&b) == WAIT_SLEEP) usleep(200);
  }
  comm_wait_inactive(c);
  __atomic_store_n(&c->abort_flag, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&c->abort_reason, AB_NONE, __ATOMIC_RELEASE);
  if (was != ncclInProgress) comm_set_async(c, ncclSuccess);
  comm_release(c);
  return ncclSuccess;
}

/* ---- state and queries ---- */

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclGetAsyncError", &c);
  if (r != ncclSuccess) return r;
  if (!asyncError) {
    CWARN(c, "ncclGetAsyncError : asyncError argument is NULL");
    comm_release(c);
    return ncclInvalidArgument;
  }
  *asyncError = (ncclResult_t)comm_async(c);
  comm_release(c);
  return ncclSuccess;
}

NCCL_API int pycollCommWaitReady(ncclComm_t comm, uint64_t timeout_ns) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "pycollCommWaitReady", &c);
  if (r != ncclSuccess) return r;
  uint64_t end = timeout_ns > UINT64_MAX - now_ns() ? UINT64_MAX : now_ns() + timeout_ns;
  __atomic_add_fetch(&c->async_waiters, 1, __ATOMIC_SEQ_CST);
  int a;
  for (uint64_t t; (a = comm_async(c)) == ncclInProgress && (t = now_ns()) < end;)
    futex_wait((uint32_t*)&c->async, (uint32_t)ncclInProgress, MIN(end - t, 100000000ull), false);
  __atomic_sub_fetch(&c->async_waiters, 1, __ATOMIC_SEQ_CST);
  comm_release(c);
  return a == ncclInProgress ? ncclInProgress : ncclSuccess;
}

NCCL_API int pycollCommPeerOpen(ncclComm_t comm, int peer, int* count) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "pycollCommPeerOpen", &c);
  if (r != ncclSuccess) return r;
  if (!count) {
    CWARN(c, "pycollCommPeerOpen : count argument is NULL");
    r = ncclInvalidArgument;
  } else if (peer < 0 || peer >= c->nranks || !c->p2p_open) {
    CWARN(c, "pycollCommPeerOpen : peer %d is not a rank of this communicator (nranks %d)", peer, c->nranks);
    r = ncclInvalidArgument;
  } else {
    *count = __atomic_load_n(&c->p2p_open[peer], __ATOMIC_ACQUIRE);
  }
  comm_release(c);
  return r;
}

NCCL_API int pycollCommPeerProcess(ncclComm_t comm, int peer, int* pid, uint64_t* start, uint64_t* pidns) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "pycollCommPeerProcess", &c);
  if (r != ncclSuccess) return r;
  if (!pid || !start || !pidns) {
    CWARN(c, "pycollCommPeerProcess : pid, start and pidns arguments must not be NULL");
    r = ncclInvalidArgument;
  } else if (peer < 0 || peer >= c->nranks) {
    CWARN(c, "pycollCommPeerProcess : peer %d is not a rank of this communicator (nranks %d)", peer, c->nranks);
    r = ncclInvalidArgument;
  } else {
    pthread_mutex_lock(&c->mu); /* the teardown frees the peers once it has set torn_down under it */
    if (c->torn_down || !c->peers) {
      r = ncclInvalidUsage;
    } else {
      *pid = c->peers[peer].proc.pid;
      *start = c->peers[peer].proc.start;
      *pidns = c->peers[peer].proc.pidns;
    }
    pthread_mutex_unlock(&c->mu);
    if (r != ncclSuccess) CWARN(c, "pycollCommPeerProcess : the communicator was destroyed or aborted");
  }
  comm_release(c);
  return r;
}

NCCL_API int pycollCommEventsClean(ncclComm_t comm, pycollEvent_t start, pycollEvent_t end, int* clean) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "pycollCommEventsClean", &c);
  if (r != ncclSuccess) return r;
  if (!clean) {
    CWARN(c, "pycollCommEventsClean : clean argument is NULL");
    r = ncclInvalidArgument;
  } else if (!start || !event_valid(start) || !end || !event_valid(end)) {
    CWARN(c, "pycollCommEventsClean : event %p is not a valid pycoll host event",
          (void*)(!start || !event_valid(start) ? start : end));
    r = ncclInvalidArgument;
  } else {
    int a = comm_async(c); /* the state first: its error's time is written before it (comm_fail, comm_set_async) */
    uint64_t t = __atomic_load_n(&c->async_err_ns, __ATOMIC_SEQ_CST);
    bool failed = a != ncclSuccess && a != ncclInProgress;
    *clean = events_clean(start, end, failed ? t : UINT64_MAX);
  }
  comm_release(c);
  return r;
}

NCCL_API int pycollCommNoteFailure(ncclComm_t comm, const char* text) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "pycollCommNoteFailure", &c);
  if (r != ncclSuccess) return r;
  if (!text) {
    CWARN(c, "pycollCommNoteFailure : text argument is NULL");
    r = ncclInvalidArgument;
  } else if (c->seg.base && c->rank >= 0 && !c->torn_down) {
    /* read by a peer once this rank's state says aborted or revoked (comm_check_peer), which the abort or revoke
     * publishes after this write; the library's own failure, written first, stays */
    struct rank_ctrl* me = &c->seg.ctrl[c->rank];
    if (!__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE) && !me->fail_text[0])
      snprintf(me->fail_text, sizeof me->fail_text, "%s", text);
  }
  comm_release(c);
  return r;
}

static ncclResult_t query(ncclComm_t comm, int* out, const char* opname, const char* argname, int which) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, opname, &c);
  if (r != ncclSuccess) return r;
  if (!out) {
    CWARN(c, "%s : %s argument is NULL", opname, argname);
    r = ncclInvalidArgument;
  } else if ((r = comm_ensure_ready(c, opname)) == ncclSuccess) {
    *out = which == 0 ? c->nranks : which == 1 ? c->cuda_dev : c->rank;
  }
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return query(comm, count, "CommCount", "count", 0);
}
NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return query(comm, device, "CommCuDevice", "devid", 1);
}
NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return query(comm, rank, "CommUserRank", "rank", 2);
}

NCCL_API ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommSuspend", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommSuspend")) == ncclSuccess && (flags & NCCL_SUSPEND_MEM))
    COMM_SET_FLAG(c, suspended, true);
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclCommResume(ncclComm_t comm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommResume", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommResume")) == ncclSuccess) COMM_SET_FLAG(c, suspended, false);
  comm_release(c);
  return r;
}

/* The host library allocates no GPU memory: every size is 0; "suspended" tells whether
 * ncclCommSuspend(NCCL_SUSPEND_MEM) is in effect. */
NCCL_API ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommMemStats", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommMemStats")) != ncclSuccess) {
  } else if (!value) {
    CWARN(c, "ncclCommMemStats : value argument is NULL");
    r = ncclInvalidArgument;
  } else if (stat == ncclStatGpuMemSuspended) {
    *value = COMM_FLAG(c, suspended) ? 1 : 0;
  } else if (stat == ncclStatGpuMemSuspend || stat == ncclStatGpuMemPersist || stat == ncclStatGpuMemTotal) {
    *value = 0;
  } else {
    CWARN(c, "ncclCommMemStats : invalid stat %d", (int)stat);
    r = ncclInvalidArgument;
  }
  comm_release(c);
  return r;
}
