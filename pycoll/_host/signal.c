/* One-sided operations on windows: ncclPutSignal copies into the peer's window (mapped into this
 * process by ncclCommWindowRegister) and then adds one to the signal counter (receiver, sender,
 * sigIdx, ctx) in the communicator's segment; ncclSignal only adds; ncclWaitSignal waits until
 * every descriptor's counter has opCnt signals it has not consumed yet, then consumes them. They
 * are tasks like the collectives: run now, queued on a stream, or grouped; abortable; a wait on a
 * peer that died or failed fails with the peer's error instead of hanging. */
#include <stdlib.h>

#include "copy.h"
#include "debug.h"
#include "enqueue.h"
#include "failpoint.h"
#include "handles.h"
#include "stream.h"
#include "window.h"

struct rma_args {
  ncclWindow_t win; /* TK_PUT: holds a window reference once validated */
  size_t offset;
  int sig, ctx;
  unsigned int flags;
  int ndesc;
  ncclWaitSignalDesc_t* descs; /* TK_WAITSIG: a heap copy once validated */
  bool owned;                  /* heap copy made by rma_validate */
};

void rma_release(struct task* t) {
  struct rma_args* a = t->rma;
  t->rma = NULL;
  if (!a || !a->owned) return;
  if (a->win) window_put(a->win);
  free(a->descs);
  free(a);
}

static ncclResult_t check_sig(struct ncclComm* c, const char* opn, int peer, int sig, int ctx) {
  if (peer < 0 || peer >= c->nranks) {
    CWARN(c, "%s : invalid peer %d (peer should be in the 0..%d range)", opn, peer, c->nranks - 1);
    return ncclInvalidArgument;
  }
  if (sig < 0 || sig >= SIG_SLOTS) {
    CWARN(c, "%s : invalid sigIdx %d (the host library has signals 0..%d)", opn, sig, SIG_SLOTS - 1);
    return ncclInvalidArgument;
  }
  if (ctx < 0 || ctx >= SIG_CTXS) {
    CWARN(c, "%s : invalid ctx %d (the host library has contexts 0..%d)", opn, ctx, SIG_CTXS - 1);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t rma_validate(struct ncclComm* c, struct task* t) {
  const char* opn = t->opname;
  struct rma_args* a = malloc(sizeof *a);
  if (!a) {
    t->rma = NULL;
    return ncclSystemError;
  }
  *a = *t->rma;
  a->owned = true;
  a->win = NULL;
  a->descs = NULL;
  ncclWindow_t win = t->rma->win;
  const ncclWaitSignalDesc_t* descs = t->rma->descs;
  t->rma = a;
  ncclResult_t r = task_check_comm(c, opn);
  if (r != ncclSuccess) return r;
  if (t->stream && !stream_valid(t->stream)) {
    CWARN(c, "%s : stream %p is not a valid pycoll host stream (create it with pycollStreamCreate; one made before "
          "this process was forked is its parent's)", opn, (void*)t->stream);
    return ncclInvalidArgument;
  }
  if (a->flags != 0) {
    CWARN(c, "%s : flags must be 0, got 0x%x", opn, a->flags);
    return ncclInvalidArgument;
  }
  if (t->kind == TK_WAITSIG) {
    if (a->ndesc <= 0 || !descs) {
      CWARN(c, "%s : %s", opn, a->ndesc < 0 ? "nDesc is negative" : !descs ? "signalDescs argument is NULL"
                                                                            : "nDesc is 0");
      return ncclInvalidArgument;
    }
    for (int i = 0; i < a->ndesc; i++) {
      if ((r = check_sig(c, opn, descs[i].peer, descs[i].sigIdx, descs[i].ctx)) != ncclSuccess) return r;
      if (descs[i].opCnt < 0) {
        CWARN(c, "%s : descriptor %d: opCnt %d is negative", opn, i, descs[i].opCnt);
        return ncclInvalidArgument;
      }
    }
    a->descs = malloc(sizeof *descs * (size_t)a->ndesc);
    if (!a->descs) return ncclSystemError;
    memcpy(a->descs, descs, sizeof *descs * (size_t)a->ndesc);
    t->root = descs[0].peer;
    return ncclSuccess;
  }
  if ((r = check_sig(c, opn, t->root, a->sig, a->ctx)) != ncclSuccess) return r;
  if (t->kind == TK_SIGNAL) return ncclSuccess;
  if (t->dtype < 0 || t->dtype >= ncclNumTypes) {
    CWARN(c, "%s : invalid type %d", opn, t->dtype);
    return ncclInvalidArgument;
  }
  if ((r = window_get(c, win, opn)) != ncclSuccess) return r;
  a->win = win;
  size_t es = dt_size(t->dtype);
  if (t->count > SIZE_MAX / es) {
    CWARN(c, "%s : count %zu is too large", opn, t->count);
    return ncclInvalidArgument;
  }
  size_t bytes = t->count * es;
  if (a->offset > win->size || bytes > win->size - a->offset) {
    CWARN(c, "%s : %zu bytes at offset %zu do not fit in the %zu-byte window of rank %d", opn, bytes, a->offset,
          win->size, t->root);
    return ncclInvalidArgument;
  }
  if (bytes && !t->sendbuff) {
    CWARN(c, "%s : localbuff argument is NULL", opn);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static void post(struct ncclComm* c, int peer, int sig, int ctx) {
  __atomic_add_fetch(&seg_sig(&c->seg, peer, c->rank, sig, ctx)->posted, 1, __ATOMIC_RELEASE);
  seg_ring(&c->seg);
}

int rma_progress(struct task* t) {
  struct ncclComm* c = t->comm;
  struct rma_args* a = t->rma;
  if (t->kind == TK_PUT) {
    t->started = true;
    size_t bytes = t->count * dt_size(t->dtype);
    if (bytes) ph_copy(a->win->peers[t->root].ptr + a->offset, t->sendbuff, bytes);
    post(c, t->root, a->sig, a->ctx);
    return PROG_DONE;
  }
  if (t->kind == TK_SIGNAL) {
    t->started = true;
    post(c, t->root, a->sig, a->ctx);
    return PROG_DONE;
  }
  if (!t->started) {
    t->started = true;
    if (UNLIKELY(fp_hit("host.signal.wait"))) return task_fail(t, ncclSystemError, "WaitSignal : failpoint host.signal.wait");
  }
  for (int i = 0; i < a->ndesc; i++) {
    const ncclWaitSignalDesc_t* d = &a->descs[i];
    struct sig_ctr* k = seg_sig(&c->seg, c->rank, d->peer, d->sigIdx, d->ctx);
    uint64_t need = (uint64_t)d->opCnt;
    for (int j = 0; j < i; j++) /* the same counter in two descriptors: both counts are needed */
      if (a->descs[j].peer == d->peer && a->descs[j].sigIdx == d->sigIdx && a->descs[j].ctx == d->ctx)
        need += (uint64_t)a->descs[j].opCnt;
    if (__atomic_load_n(&k->posted, __ATOMIC_ACQUIRE) - LOAD_RLX(&k->consumed) < need) {
      t->wait_peer = d->peer;
      return PROG_BLOCKED;
    }
  }
  for (int i = 0; i < a->ndesc; i++) {
    const ncclWaitSignalDesc_t* d = &a->descs[i];
    struct sig_ctr* k = seg_sig(&c->seg, c->rank, d->peer, d->sigIdx, d->ctx);
    STORE_RLX(&k->consumed, LOAD_RLX(&k->consumed) + (uint64_t)d->opCnt);
  }
  return PROG_DONE;
}

/* ---- entry points ---- */

NCCL_API ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                    unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  struct rma_args a = {.win = peerWin, .offset = peerWinOffset, .sig = sigIdx, .ctx = ctx, .flags = flags};
  struct task t = {.kind = TK_PUT, .opname = "PutSignal", .comm = comm, .sendbuff = localbuff, .count = count,
                   .dtype = datatype, .op = ncclSum, .root = peer, .stream = stream, .rma = &a};
  return enqueue_task(&t, NULL);
}

NCCL_API ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                 cudaStream_t stream) {
  struct rma_args a = {.sig = sigIdx, .ctx = ctx, .flags = flags};
  struct task t = {.kind = TK_SIGNAL, .opname = "Signal", .comm = comm, .dtype = ncclUint8, .op = ncclSum,
                   .root = peer, .stream = stream, .rma = &a};
  return enqueue_task(&t, NULL);
}

NCCL_API ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                     cudaStream_t stream) {
  struct rma_args a = {.ndesc = nDesc, .descs = signalDescs};
  struct task t = {.kind = TK_WAITSIG, .opname = "WaitSignal", .comm = comm, .dtype = ncclUint8, .op = ncclSum,
                   .root = -1, .stream = stream, .rma = &a};
  return enqueue_task(&t, NULL);
}
