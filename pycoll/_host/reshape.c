/* Split, shrink and grow. The participants first exchange their arguments through the parent's
 * segment (a mailbox per rank and reshape parity), then each computes the new rank map locally
 * and joins the child's segment, whose name derives from the parent's identity and the reshape's
 * sequence number. The parent stays valid and must still be destroyed or aborted. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include "failpoint.h"
#include <stdio.h>
#include <stdlib.h>

#include "debug.h"
#include "group.h"

static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return x < y ? -1 : x > y;
}

static void child_nonce(const struct ncclComm* p, uint64_t seq, int kind, uint64_t extra, uint64_t out[2]) {
  out[0] = mix64(p->nonce[0] ^ mix64(seq * 0x100 + (uint64_t)kind));
  out[1] = mix64(p->nonce[1] + mix64(extra ^ seq));
}

/* Stops the operations in flight on the parent (NCCL_SHRINK_ABORT): they fail, and the parent
 * refuses collectives from now on. */
static void stop_parent_ops(struct ncclComm* p) {
  __atomic_store_n(&p->abort_reason, AB_SHRINK, __ATOMIC_RELEASE);
  __atomic_store_n(&p->abort_flag, 1, __ATOMIC_SEQ_CST);
  if (p->seg.base) doorbell_wake(&p->seg.hdr->bell);
  comm_wait_inactive(p);
  if (!__atomic_load_n(&p->broken, __ATOMIC_ACQUIRE))
    comm_fail(p, ncclInvalidUsage, "operations of this communicator were aborted by ncclCommShrink(NCCL_SHRINK_ABORT)");
  __atomic_store_n(&p->abort_flag, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&p->abort_reason, AB_NONE, __ATOMIC_RELEASE);
}

/* A participant of a reshape is gone if its process died or it aborted/destroyed the parent. */
static ncclResult_t reshape_peer_gone(struct ncclComm* p, int k, bool check_process, char* text, size_t len) {
  int st = __atomic_load_n(&p->seg.ctrl[k].state, __ATOMIC_ACQUIRE);
  if (st == RS_ABORTED || st == RS_DESTROYED) {
    snprintf(text, len, "rank %d %s the parent communicator", k, st == RS_ABORTED ? "aborted" : "destroyed");
    return ncclRemoteError;
  }
  if (comm_peer_died(p, k, check_process)) {
    snprintf(text, len, "rank %d (pid %d) exited", k, p->peers[k].proc.pid);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

static ncclResult_t exchange(struct job* j, const bool* part, uint64_t excl_hash) {
  struct ncclComm* p = j->parent;
  struct seg* s = &p->seg;
  int me = p->rank, n = p->nranks, par = (int)(j->child_seq & 1);
  struct mbox* mb = &s->ctrl[me].mbox[par];
  mb->kind = j->kind;
  mb->color = j->color;
  mb->key = j->key;
  mb->nexclude = j->nexclude;
  mb->hash = excl_hash;
  __atomic_store_n(&mb->seq, j->child_seq, __ATOMIC_RELEASE);
  doorbell_wake(&s->hdr->bell);
  struct backoff b;
  backoff_reset(&b, p->oversubscribed);
  char text[512];
  for (int k = 0; k < n;) {
    if (!part[k] || k == me) {
      k++;
      continue;
    }
    const struct mbox* theirs = &s->ctrl[k].mbox[par];
    if (__atomic_load_n(&theirs->seq, __ATOMIC_ACQUIRE) == j->child_seq) {
      if (theirs->kind != j->kind) {
        CWARN(p, "%s : rank %d called %s while rank %d called %s", j->opname, k,
              theirs->kind == JOB_SPLIT ? "ncclCommSplit" : "ncclCommShrink", me, j->opname);
        return ncclInvalidUsage;
      }
      if (j->kind == JOB_SHRINK && theirs->hash != excl_hash) {
        CWARN(p, "%s : ranks %d and %d passed different lists of excluded ranks (%d and %d entries)", j->opname,
              me, k, j->nexclude, theirs->nexclude);
        return ncclInvalidUsage;
      }
      k++;
      continue;
    }
    if (comm_aborting(p)) {
      CWARN(p, "%s : the parent communicator was aborted", j->opname);
      return ncclInvalidUsage;
    }
    enum wait_phase ph = backoff_step(&b);
    if (ph == WAIT_SPIN) continue;
    ncclResult_t e = reshape_peer_gone(p, k, backoff_due(&b, peer_check_ns), text, sizeof text);
    if (e != ncclSuccess && __atomic_load_n(&theirs->seq, __ATOMIC_ACQUIRE) != j->child_seq) {
      CWARN(p, "%s : %s", j->opname, text);
      return e;
    }
    if (ph == WAIT_SLEEP) doorbell_sleep(&s->hdr->bell, backoff_sleep_ns(&b), NULL, NULL);
  }
  return ncclSuccess;
}

static uint64_t hash_exclude(const int* ex, int n) {
  uint64_t h = 0x736872696e6bull;
  for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)ex[i]);
  return h;
}

struct member {
  int key, rank;
};
static int cmp_member(const void* a, const void* b) {
  const struct member *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

ncclResult_t job_run_reshape(struct job* j) {
  struct ncclComm* p = j->parent;
  if (j->kind == JOB_SHRINK && UNLIKELY(fp_hit("host.shrink.begin"))) return ncclSystemError;
  if (j->kind == JOB_SHRINK && (j->flags & NCCL_SHRINK_ABORT)) stop_parent_ops(p);
  if (!comm_enter(p)) {
    CWARN(p, "%s : the parent communicator was aborted", j->opname);
    return ncclInvalidUsage;
  }
  int n = p->nranks, me = p->rank;
  bool* part = calloc((size_t)n, sizeof *part);
  struct member* m = calloc((size_t)n, sizeof *m);
  ncclResult_t r = (part && m) ? ncclSuccess : ncclSystemError;
  uint64_t excl_hash = j->kind == JOB_SHRINK ? hash_exclude(j->exclude, j->nexclude) : 0;
  if (r == ncclSuccess) {
    for (int k = 0; k < n; k++) part[k] = true;
    for (int i = 0; i < j->nexclude; i++) part[j->exclude[i]] = false;
    r = exchange(j, part, excl_hash);
  }
  int nm = 0, newrank = -1;
  if (r == ncclSuccess) {
    for (int k = 0; k < n; k++) {
      if (!part[k]) continue;
      const struct mbox* mb = &p->seg.ctrl[k].mbox[j->child_seq & 1];
      if (j->kind == JOB_SPLIT && (mb->color != j->color || j->color == NCCL_SPLIT_NOCOLOR)) continue;
      m[nm].key = j->kind == JOB_SPLIT ? mb->key : k;
      m[nm].rank = k;
      nm++;
    }
    if (j->kind == JOB_SPLIT) qsort(m, (size_t)nm, sizeof *m, cmp_member);
    j->expected = calloc((size_t)MAX(nm, 1), sizeof *j->expected);
    for (int i = 0; i < nm; i++) {
      if (m[i].rank == me) newrank = i;
      if (j->expected) j->expected[i] = p->peers[m[i].rank].proc;
    }
  }
  comm_leave(p);
  free(part);
  free(m);
  if (r != ncclSuccess) return r;
  if (j->kind == JOB_SPLIT && j->color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  j->nranks = nm;
  j->rank = newrank;
  j->seg_kind = j->kind == JOB_SPLIT ? SEG_SPLIT : SEG_SHRINK;
  child_nonce(p, j->child_seq, j->seg_kind, j->kind == JOB_SPLIT ? (uint64_t)(uint32_t)j->color : excl_hash, j->nonce);
  struct ncclComm* c = j->child;
  c->nranks = nm;
  c->rank = newrank;
  c->cuda_dev = p->cuda_dev;
  /* join the child: the init job body, run on the child */
  struct ncclComm* saved = j->comm;
  j->comm = c;
  r = job_run_init(j);
  j->comm = saved;
  if (r == ncclSuccess) comm_register(c);
  else ph_last_error_to_comm(p);
  if (r == ncclSuccess && j->kind == JOB_SHRINK && UNLIKELY(fp_hit("host.shrink.end"))) {
    comm_fail(c, ncclSystemError, "failpoint");
    return ncclSystemError;
  }
  return r;
}

static ncclResult_t child_config(struct ncclComm* child, struct ncclComm* parent, ncclConfig_t* config,
                                 const char* opname) {
  ncclResult_t r = ncclSuccess;
  if (config) r = parse_config(&child->config, config, opname, parent);
  else config_inherit(&child->config, &parent->config);
  if (r == ncclSuccess) {
    if (child->config.commName && child->config.commName != parent->name)
      snprintf(child->name, sizeof child->name, "%s", child->config.commName);
    else snprintf(child->name, sizeof child->name, "%s", parent->name);
    child->config.commName = child->name[0] ? child->name : NULL;
    child->config.netName = NULL;
  }
  return r;
}

/* Common start of split and shrink: validates the parent, creates the child object and the job. */
static ncclResult_t start_child(struct ncclComm* p, int kind, ncclComm_t* newcomm, ncclConfig_t* config,
                                const char* opname, bool needs_child, struct job** out) {
  *out = NULL;
  if (comm_async(p) == ncclInProgress) {
    CWARN(p, "%s : Attempt to use communicator before the previous operation returned ncclSuccess", opname);
    return ncclInvalidArgument;
  }
  if (kind == JOB_SPLIT) {
    ncclResult_t r = comm_ensure_ready(p, opname);
    if (r != ncclSuccess && !COMM_FLAG(p, revoked)) return r;
  }
  if (COMM_FLAG(p, destroy_called)) {
    CWARN(p, "%s : the parent communicator is being destroyed", opname);
    return ncclInvalidUsage;
  }
  struct job* j = calloc(1, sizeof *j);
  if (!j) return ncclSystemError;
  if (needs_child) {
    j->child = comm_alloc();
    if (!j->child) {
      free(j);
      return ncclSystemError;
    }
    ncclResult_t r = child_config(j->child, p, config, opname);
    if (r != ncclSuccess) {
      comm_release(j->child);
      free(j);
      return r;
    }
    comm_ref(j->child); /* the job's, besides the future registry's */
  }
  *newcomm = NULL;
  pthread_mutex_lock(&p->mu);
  j->child_seq = ++p->child_count;
  pthread_mutex_unlock(&p->mu);
  j->kind = kind;
  j->opname = opname;
  j->comm = p;
  j->parent = p;
  comm_ref(p); /* j->comm and j->parent are the same comm: job_free releases it once */
  j->slot = newcomm;
  *out = j;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  struct ncclComm* p;
  ncclResult_t r = comm_acquire(comm, "ncclCommSplit", &p);
  if (r != ncclSuccess) return group_note_error(r);
  if (!newcomm) {
    CWARN(p, "ncclCommSplit : newcomm argument is NULL");
    r = ncclInvalidArgument;
  } else if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    CWARN(p, "ncclCommSplit : invalid color %d (colors are >= 0, or NCCL_SPLIT_NOCOLOR)", color);
    r = ncclInvalidArgument;
  }
  struct job* j = NULL;
  if (r == ncclSuccess) r = start_child(p, JOB_SPLIT, newcomm, config, "ncclCommSplit", color != NCCL_SPLIT_NOCOLOR, &j);
  comm_release(p);
  if (r != ncclSuccess) return group_note_error(r);
  j->color = color;
  j->key = key;
  return job_launch(j);
}

NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  struct ncclComm* p;
  ncclResult_t r = comm_acquire(comm, "ncclCommShrink", &p);
  if (r != ncclSuccess) return group_note_error(r);
  int* ex = NULL;
  int nex = 0;
  if (!newcomm || !excludeRanksList) {
    CWARN(p, "ncclCommShrink : %s argument is NULL", !newcomm ? "newcomm" : "excludeRanksList");
    r = ncclInvalidArgument;
  } else if (excludeRanksCount <= 0) {
    CWARN(p, "ncclCommShrink : excludeRanksCount must be > 0, got %d", excludeRanksCount);
    r = ncclInvalidArgument;
  } else if (shrinkFlags & ~NCCL_SHRINK_ABORT) {
    CWARN(p, "ncclCommShrink : invalid shrinkFlags 0x%x", shrinkFlags);
    r = ncclInvalidArgument;
  } else {
    ex = malloc(sizeof *ex * (size_t)excludeRanksCount);
    memcpy(ex, excludeRanksList, sizeof *ex * (size_t)excludeRanksCount); /* never touch the caller's list */
    qsort(ex, (size_t)excludeRanksCount, sizeof *ex, cmp_int);
    for (int i = 0; i < excludeRanksCount && r == ncclSuccess; i++) {
      if (ex[i] < 0 || ex[i] >= p->nranks) {
        CWARN(p, "ncclCommShrink : excluded rank %d is out of range (0..%d)", ex[i], p->nranks - 1);
        r = ncclInvalidArgument;
      } else if (ex[i] == p->rank) {
        CWARN(p, "ncclCommShrink : rank %d is in the exclude list; excluded ranks must not call ncclCommShrink",
              p->rank);
        r = ncclInvalidArgument;
      } else if (nex == 0 || ex[nex - 1] != ex[i]) {
        ex[nex++] = ex[i];
      }
    }
  }
  struct job* j = NULL;
  if (r == ncclSuccess) r = start_child(p, JOB_SHRINK, newcomm, config, "ncclCommShrink", true, &j);
  comm_release(p);
  if (r != ncclSuccess) {
    free(ex);
    return group_note_error(r);
  }
  j->exclude = ex;
  j->nexclude = nex;
  j->flags = shrinkFlags;
  return job_launch(j);
}

/* ---- grow ---- */

NCCL_API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommGetUniqueId", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommGetUniqueId")) != ncclSuccess) {
  } else if (!uniqueId) {
    CWARN(c, "CommGetUniqueId : uniqueId argument is NULL");
    r = ncclInvalidArgument;
  } else {
    pthread_mutex_lock(&c->mu);
    if (c->grow_id_pending) {
      r = ncclInvalidUsage;
    } else {
      uint64_t nonce[2], seq = c->child_count + 1;
      child_nonce(c, seq, SEG_GROW, 0, nonce);
      r = uid_make(uniqueId, UID_GROW, nonce, c->nranks, seq);
      if (r == ncclSuccess) c->grow_id_pending = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (r == ncclInvalidUsage) /* what to do: the id it gave is still the next grow's (a refused grow leaves it so) */
      CWARN(c, "ncclCommGetUniqueId : this communicator already gave a grow unique id that no ncclCommGrow has used "
               "yet (an ncclCommGrow refused at its argument checks does not use it): pass that id to ncclCommGrow; "
               "a new one is given only once a grow used it");
  }
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                   ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!newcomm) {
    WARN("ncclCommGrow : newcomm argument is NULL");
    return ncclInvalidArgument;
  }
  *newcomm = NULL;
  if (nRanks <= 0) {
    WARN("ncclCommGrow: total ranks must be positive, got %d", nRanks);
    return ncclInvalidArgument;
  }
  struct ncclComm* p = NULL;
  struct host_uid u;
  uint64_t nonce[2];
  uint64_t seq = 0, prev_count = 0;
  int myrank = rank;
  ncclResult_t r;
  if (comm) {
    if ((r = comm_acquire(comm, "ncclCommGrow", &p)) != ncclSuccess) return group_note_error(r);
    /* these refusals leave the id unused (as NCCL's, before its childCount moves): say it may be passed again */
    const char* id_note = uniqueId ? "; this call did not use its unique id, which can be passed again to ncclCommGrow"
                                   : "";
    if (nRanks <= p->nranks) {
      CWARN(p, "ncclCommGrow: total ranks %d must be greater than the current ranks %d (a grow adds ranks)%s", nRanks,
            p->nranks, id_note);
      r = ncclInvalidArgument;
    } else if ((r = comm_ensure_ready(p, "ncclCommGrow")) != ncclSuccess) {
    } else if (rank != -1) {
      CWARN(p, "ncclCommGrow: existing ranks must pass rank=-1, got %d%s", rank, id_note);
      r = ncclInvalidArgument;
    } else {
      pthread_mutex_lock(&p->mu);
      /* An existing rank holding the id takes the grow's sequence number from it: reshapes that
       * only some ranks took part in (a shrink that excluded this rank) leave the ranks' own
       * counters different. Without an id, the next number of its own counter is used. */
      seq = p->child_count + 1;
      if (uniqueId && (r = uid_parse(uniqueId, &u, "ncclCommGrow", p)) == ncclSuccess) {
        if (u.kind == UID_GROW) seq = u.child_count;
      }
      child_nonce(p, seq, SEG_GROW, 0, nonce);
      if (uniqueId && r == ncclSuccess &&
          (u.kind != UID_GROW || u.nonce[0] != nonce[0] || u.nonce[1] != nonce[1] || seq <= p->last_grow_seq)) {
        CWARN(p, "ncclCommGrow: the unique id does not belong to the next grow of this communicator (it comes "
                 "from another communicator, or was already used)");
        r = ncclInvalidArgument;
      }
      if (r == ncclSuccess) {
        prev_count = p->child_count;
        if (seq > p->child_count) p->child_count = seq;
        p->last_grow_seq = seq;
        p->grow_id_pending = false;
      }
      pthread_mutex_unlock(&p->mu);
      myrank = p->rank;
    }
    if (r != ncclSuccess) {
      comm_release(p);
      return group_note_error(r);
    }
  } else {
    if (rank < 0) {
      WARN("ncclCommGrow: new ranks must pass valid rank >= 0, got %d", rank);
      return group_note_error(ncclInvalidArgument);
    }
    if (!uniqueId) {
      WARN("ncclCommGrow: new ranks must pass non-NULL uniqueId");
      return group_note_error(ncclInvalidArgument);
    }
    if (rank >= nRanks) {
      WARN("ncclCommGrow: new rank %d exceeds total ranks %d", rank, nRanks);
      return group_note_error(ncclInvalidArgument);
    }
    if ((r = uid_parse(uniqueId, &u, "ncclCommGrow", NULL)) != ncclSuccess) return group_note_error(r);
    if (u.kind != UID_GROW) {
      WARN("ncclCommGrow: new ranks need a unique id from ncclCommGetUniqueId of the communicator being grown");
      return group_note_error(ncclInvalidArgument);
    }
    if (rank < u.parent_nranks || nRanks <= u.parent_nranks) {
      WARN("ncclCommGrow: new rank %d (of %d) must be at least the current size %d of the communicator being grown",
           rank, nRanks, u.parent_nranks);
      return group_note_error(ncclInvalidArgument);
    }
    nonce[0] = u.nonce[0];
    nonce[1] = u.nonce[1];
  }
  struct ncclComm* c = comm_alloc();
  struct job* j = calloc(1, sizeof *j);
  if (!c || !j) {
    free(c);
    free(j);
    if (p) comm_release(p);
    return group_note_error(ncclSystemError);
  }
  r = p ? child_config(c, p, config, "ncclCommGrow") : parse_config(&c->config, config, "ncclCommGrow", NULL);
  if (r == ncclSuccess && !p) {
    if (c->config.commName) snprintf(c->name, sizeof c->name, "%s", c->config.commName);
    c->config.commName = c->name[0] ? c->name : NULL;
    c->config.netName = NULL;
  }
  if (r != ncclSuccess) {
    comm_release(c);
    free(j);
    if (p) comm_release(p);
    return group_note_error(r);
  }
  c->nranks = nRanks;
  c->rank = myrank;
  c->cuda_dev = p ? p->cuda_dev : 0;
  comm_register(c);
  *newcomm = c;
  comm_ref(c);
  j->kind = JOB_GROW;
  j->opname = "ncclCommGrow";
  j->child_seq = seq;
  j->prev_child_count = prev_count;
  j->comm = c;
  j->parent = p; /* the reference taken by comm_acquire */
  j->slot = newcomm;
  j->nranks = nRanks;
  j->rank = myrank;
  j->seg_kind = SEG_GROW;
  j->nonce[0] = nonce[0];
  j->nonce[1] = nonce[1];
  if (p) {
    j->expected = calloc((size_t)nRanks, sizeof *j->expected);
    for (int k = 0; j->expected && k < p->nranks; k++) j->expected[k] = p->peers[k].proc;
  }
  return job_launch(j);
}
