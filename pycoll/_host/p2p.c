/* Point-to-point: one ring of slots per ordered pair of ranks. The sender copies chunks into free
 * slots and advances `head`; the receiver copies them out and advances `tail`. The k-th send from
 * a to b matches the k-th receive at b from a; every chunk carries the message number and the
 * message size, so a size mismatch is reported (naming both sides) instead of corrupting data. */
#include "copy.h"
#include "debug.h"
#include "enqueue.h"

void p2p_start(struct task* t) {
  struct ncclComm* c = t->comm;
  t->started = true;
  t->off = 0;
  t->first_chunk = true;
  t->msg_seq = t->kind == TK_SEND ? ++c->send_seq[t->root] : ++c->recv_seq[t->root];
}

static int send_progress(struct task* t) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, peer = t->root;
  struct chan_ctrl* ch = seg_chan(s, me, peer);
  size_t bytes = t->count * dt_size(t->dtype), cap = s->slot_bytes - SLOT_HDR_BYTES;
  bool moved = false;
  while (t->first_chunk || t->off < bytes) {
    uint64_t h = __atomic_load_n(&ch->head, __ATOMIC_RELAXED);
    if (h - __atomic_load_n(&ch->tail, __ATOMIC_ACQUIRE) >= (uint64_t)s->nslots) {
      t->wait_peer = peer;
      return moved ? PROG_MOVED : PROG_BLOCKED;
    }
    char* slot = seg_slot(s, me, peer, h);
    struct slot_hdr* sh = (struct slot_hdr*)slot;
    size_t len = MIN(cap, bytes - t->off);
    sh->msg_seq = t->msg_seq;
    sh->total = bytes;
    sh->offset = t->off;
    sh->len = (uint32_t)len;
    sh->dtype = t->dtype;
    ph_copy(slot + SLOT_HDR_BYTES, (const char*)t->sendbuff + t->off, len);
    __atomic_store_n(&ch->head, h + 1, __ATOMIC_RELEASE);
    seg_ring(s);
    t->off += len;
    t->first_chunk = false;
    moved = true;
  }
  return PROG_DONE;
}

static int recv_progress(struct task* t) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, peer = t->root;
  struct chan_ctrl* ch = seg_chan(s, peer, me);
  size_t bytes = t->count * dt_size(t->dtype);
  bool moved = false;
  while (t->first_chunk || t->off < bytes) {
    uint64_t tl = __atomic_load_n(&ch->tail, __ATOMIC_RELAXED);
    if (__atomic_load_n(&ch->head, __ATOMIC_ACQUIRE) == tl) {
      t->wait_peer = peer;
      return moved ? PROG_MOVED : PROG_BLOCKED;
    }
    const char* slot = seg_slot(s, peer, me, tl);
    const struct slot_hdr* sh = (const struct slot_hdr*)slot;
    if (sh->total != bytes)
      return task_fail(t, ncclInvalidUsage,
                       "Recv : size mismatch: rank %d receives %zu bytes (count=%zu, %s) from rank %d, which sends "
                       "%llu bytes (message #%llu between them)",
                       me, bytes, t->count, ph_type_name(t->dtype), peer, (unsigned long long)sh->total,
                       (unsigned long long)t->msg_seq);
    if (sh->dtype != t->dtype) /* NCCL leaves this undefined; the host library says so, as for collectives */
      return task_fail(t, ncclInvalidUsage,
                       "Recv : datatype mismatch: rank %d receives %s from rank %d, which sends %s (message #%llu "
                       "between them)",
                       me, ph_type_name(t->dtype), peer, ph_type_name(sh->dtype), (unsigned long long)t->msg_seq);
    if (sh->msg_seq != t->msg_seq || sh->offset != t->off || sh->len > bytes - t->off)
      return task_fail(t, ncclInternalError, "Recv : p2p stream from rank %d out of sync (message #%llu, got #%llu)",
                       peer, (unsigned long long)t->msg_seq, (unsigned long long)sh->msg_seq);
    ph_copy((char*)t->recvbuff + t->off, slot + SLOT_HDR_BYTES, sh->len);
    t->off += sh->len;
    t->first_chunk = false;
    __atomic_store_n(&ch->tail, tl + 1, __ATOMIC_RELEASE);
    seg_ring(s);
    moved = true;
  }
  return PROG_DONE;
}

int p2p_progress(struct task* t) {
  if (!t->started) p2p_start(t);
  return t->kind == TK_SEND ? send_progress(t) : recv_progress(t);
}
