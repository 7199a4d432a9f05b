/* The shared-memory segment of one communicator: its layout and the process-local view of it.
 *
 *   header (4 KiB)   identity, rendezvous counters, poison, doorbell
 *   rank_ctrl[n]     per rank: step flag (arrive), op descriptors, state, life word, reshape mailbox
 *   chan_ctrl[n*n]   per ordered pair (src, dst): p2p ring head (src writes) and tail (dst writes)
 *   inbox[n][2]      per rank and step parity: what the rank publishes for a collective step
 *   outbuf[2]        per step parity: reduced slices of the pipelined allreduce/reduce
 *   p2p[n*n][slots]  per ordered pair: ring of slots, each a slot_hdr plus payload
 *   sig[n*n]         per ordered pair (receiver, sender): one-sided signal counters (signal.c)
 *   echan[n*n]       per ordered pair (src, dst): the eager lane's head (src writes) and tail (dst writes)
 *   eager[n*n][EAGER_SLOTS]  per ordered pair: the eager lane's ring, each slot an op_desc plus payload
 *                    (small rooted collectives, coll.c)
 */
#ifndef PYCOLL_SEGMENT_H
#define PYCOLL_SEGMENT_H

#include "core.h"
#include "shm.h"
#include "wait.h"

#define SEG_MAGIC 0x7079636f6c6c5347ull
#define SEG_LAYOUT_VERSION 6
/* how many of the host library's settings plan a collective alike on every rank (coll.c: coll_plan) */
#define SEG_PLAN_N 3
#define SEG_HEADER_BYTES 4096
#define SLOT_HDR_BYTES 64
/* One-sided signals: sigIdx < SIG_SLOTS, ctx < SIG_CTXS. */
#define SIG_SLOTS 8
#define SIG_CTXS 2
/* The eager lane of small rooted collectives (coll.c): slots per ordered pair, and each slot's bytes (a 64-byte
 * op_desc, then the payload) */
#define EAGER_SLOTS 16
#define EAGER_SLOT_BYTES 1024
#define EAGER_PAYLOAD (EAGER_SLOT_BYTES - 64)

/* Signals from one sender to one receiver on (sigIdx, ctx): the sender adds to `posted`, the
 * receiver's ncclWaitSignal adds to `consumed`. */
struct sig_ctr {
  uint64_t posted;
  uint64_t consumed;
};

enum rank_state {
  RS_EMPTY = 0,
  RS_JOINED = 1,
  RS_ACTIVE = 2,
  RS_FINALIZED = 3,
  RS_DESTROYED = 4,
  RS_ABORTED = 5,
  RS_REVOKED = 6,
  RS_FAILED = 7
};

enum seg_kind { SEG_INIT = 1, SEG_SPLIT = 2, SEG_SHRINK = 3, SEG_GROW = 4 };

/* What a rank is doing in its current collective step; peers compare it with their own. */
struct op_desc {
  uint64_t op_seq;
  uint64_t count;
  int32_t kind;
  int32_t dtype;
  int32_t redop;
  int32_t root;
  uint32_t step;
  uint32_t nsteps;
  /* Operations over windows (coll.c): which windows hold this rank's send and receive buffers (a hash of
   * the two windows' keys; 0 where either is in none) and the buffers' offsets in them */
  uint64_t win_key;
  uint64_t win_off[2];
};

/* One reshape exchange (split, shrink) through the parent's segment; seq is written last. */
struct mbox {
  uint64_t seq;
  int32_t kind;
  int32_t color;
  int32_t key;
  int32_t nexclude;
  uint64_t hash;
  uint64_t pad[4];
};

struct rank_ctrl {
  _Alignas(64) uint64_t arrive;
  _Alignas(64) struct op_desc desc[2];
  /* The collective this rank is in (or last ran), written when it starts: op_seq is UINT64_MAX while the
   * fields are written (and before the first), so a peer reads a consistent copy (coll.c: peer_current) */
  _Alignas(64) struct op_desc cur;
  _Alignas(64) uint64_t token; /* who claimed this rank: (pid << 32) | per-process counter */
  struct proc_id proc;
  int32_t state;
  int32_t fail_code;
  int32_t cpu; /* where this rank last waited (-1: nowhere yet): a peer on the same CPU yields or moves (wait.h) */
  /* 1 while this rank writes a piece of an operation into its peers' windows (coll.c: window_piece_begin): a
   * rank that aborts or revokes waits for its peers' to end, so none writes its buffers once that returns */
  uint32_t in_windows;
  char fail_text[196];
  /* The rank's life word, a robust futex (exitwatch.h): the thread id of its process's exit watcher
   * with FUTEX_WAITERS set, written once when the rank attaches (0 before, or where the watcher has no
   * robust list). When that thread ends -- the process exited or was killed -- the kernel sets
   * FUTEX_OWNER_DIED in it and wakes a waiter, before it tears the process's memory down: a peer
   * learns of the death at once, not when the pidfd turns readable milliseconds later. `life_next`
   * links the word into the watcher's robust list: an address in the owner's mapping, read only by
   * the owner's kernel. */
  _Alignas(64) uint64_t life_next;
  uint32_t life;
  /* Written once, as the rank aborts or revokes (comm_publish_state): the state it left in (0: it has not) and the
   * collective steps it had completed then (comm.h: steps_done). Peers read it at every step (coll.c: peer_left):
   * a line nothing else writes, so that read stays in their caches. */
  _Alignas(64) uint64_t left_done;
  int32_t left_state;
  _Alignas(64) struct mbox mbox[2];
};

struct chan_ctrl {
  _Alignas(64) uint64_t head;
  _Alignas(64) uint64_t tail;
};

struct slot_hdr {
  uint64_t msg_seq;
  uint64_t total;
  uint64_t offset;
  uint32_t len;
  int32_t dtype;
};

struct seg_header {
  uint64_t magic;
  uint32_t layout_version;
  int32_t nranks;
  uint64_t total_size;
  uint8_t boot_id[16];
  uint64_t nonce[2];
  struct proc_id creator;
  uint64_t ids_hash;
  int32_t kind;
  int32_t pad0;
  uint64_t ctrl_off, chan_off, inbox_off, outbuf_off, p2p_off, sig_off, echan_off, eager_off;
  uint64_t inbox_bytes, slot_bytes;
  uint32_t nslots;
  uint32_t pad1;
  uint64_t plan[SEG_PLAN_N]; /* the creator's settings that plan collectives (coll_plan): every rank's must match */
  _Alignas(64) uint32_t joined; /* ranks that claimed their slot */
  uint32_t arrived;             /* processes that opened the segment, successful or not */
  uint32_t fail_claim;
  int32_t failed; /* ncclResult_t that poisoned the rendezvous, 0 if none */
  uint64_t failed_at; /* CLOCK_MONOTONIC ns of the poison */
  char fail_text[256];
  struct doorbell bell;
};

_Static_assert(sizeof(struct seg_header) <= SEG_HEADER_BYTES, "segment header too large");
_Static_assert(sizeof(struct op_desc) == 64, "op_desc is one cache line");

struct seg_layout {
  size_t ctrl_off, chan_off, inbox_off, outbuf_off, p2p_off, sig_off, echan_off, eager_off, total;
  size_t inbox_bytes, slot_bytes;
  int nslots;
};

/* Process-local view of a mapped segment. */
struct seg {
  char* base;
  size_t size;
  int nranks;
  struct seg_header* hdr;
  struct rank_ctrl* ctrl;
  struct chan_ctrl* chan;
  char* inbox;
  char* outbuf;
  char* p2p;
  struct sig_ctr* sig;
  struct chan_ctrl* echan;
  char* eager;
  size_t inbox_bytes, slot_bytes;
  int nslots;
  char name[64];
};

void seg_layout(int nranks, struct seg_layout* out);
void seg_view(struct seg* s, void* base, size_t size);
void seg_unmap(struct seg* s);
void seg_name_of(char out[64], const uint64_t nonce[2]);

static inline char* seg_inbox(const struct seg* s, int rank, int parity) {
  return s->inbox + ((size_t)rank * 2 + (size_t)parity) * s->inbox_bytes;
}
static inline char* seg_outbuf(const struct seg* s, int parity) { return s->outbuf + (size_t)parity * s->inbox_bytes; }
static inline struct chan_ctrl* seg_chan(const struct seg* s, int src, int dst) {
  return &s->chan[(size_t)src * s->nranks + dst];
}
static inline char* seg_slot(const struct seg* s, int src, int dst, uint64_t idx) {
  size_t ring = (size_t)src * s->nranks + dst;
  return s->p2p + (ring * s->nslots + (size_t)(idx % (uint64_t)s->nslots)) * s->slot_bytes;
}
static inline struct chan_ctrl* seg_echan(const struct seg* s, int src, int dst) {
  return &s->echan[(size_t)src * s->nranks + dst];
}
static inline char* seg_eslot(const struct seg* s, int src, int dst, uint64_t idx) {
  size_t ring = (size_t)src * s->nranks + dst;
  return s->eager + (ring * EAGER_SLOTS + (size_t)(idx % EAGER_SLOTS)) * EAGER_SLOT_BYTES;
}
static inline struct sig_ctr* seg_sig(const struct seg* s, int recv, int send, int sig, int ctx) {
  return &s->sig[(((size_t)recv * s->nranks + send) * SIG_SLOTS + sig) * SIG_CTXS + ctx];
}
static inline void seg_ring(struct seg* s) { doorbell_ring(&s->hdr->bell); }

#endif
