/* Collectives over the segment. Every collective is a sequence of steps; in step S each rank
 * writes what it contributes into its inbox of parity S&1, publishes `arrive = S+1` together with
 * a descriptor of the operation, waits until every rank has arrived (comparing descriptors: a
 * mismatch is an error, not a hang), then reads what it needs from the others' inboxes.
 *
 * Having waited for everyone's arrival at step S-1 proves that everyone finished reading step
 * S-2, so the two parities can be reused without further flags. Small AllReduce/Reduce use one
 * step per piece: everyone reduces everything. Large ones are a pipelined reduce-scatter +
 * all-gather through cache-sized chunks, one arrival per chunk: in step s a rank publishes the
 * other ranks' slices of chunk s (its own slice stays in its send buffer), reduces its own slice of
 * chunk s-1 straight from the peers' inboxes and its send buffer into outbuf (and its output),
 * arrives, and after everyone has arrived copies the other slices of chunk s-1 out of outbuf. A
 * rank's reading of an inbox or an outbuf slice of step S-1 happens before it arrives at S+1, so
 * the parity rule above holds for outbuf too. Outputs too large for the caches are written with
 * streaming stores (PYCOLL_HOST_STREAM_MIN bytes and more: 8 MiB by default).
 *
 * An AllReduce of that size whose send and receive buffers lie in windows (ncclCommWindowRegister) on
 * every rank skips the inboxes and outbuf: the ranks publish, with step 0's descriptor, which windows
 * hold their buffers and where, and if every rank's are in the same windows, each rank reduces its
 * slice of the whole operation straight from every rank's send buffer into every rank's receive buffer
 * (mapped through the windows), then all wait until everyone is done (the operation's last step). A
 * rank's memory traffic is then one read of N bytes and one write of N, a copy's, instead of about
 * twice that. Broadcast, AllGather, ReduceScatter and AlltoAll of more than one step do the same with
 * their own share: a rank copies its slice of the root's buffer, or its own block, into every rank's
 * output, reduces its block from every rank's send buffer, or copies each of its blocks into its
 * receiver's output, which skips the copy into the inboxes. Any rank without windows (or with
 * PYCOLL_HOST_WINDOW_ALLREDUCE=0, PYCOLL_HOST_WINDOW_COLLECTIVES=0 for the other four) makes every rank take the segment; the choice is made from the same descriptors on
 * every rank. A rank cannot know it before it arrives at step 0, which is why step 0 still publishes
 * the segment's first piece: an empty step 0 would save that copy on the windows' path but cost the
 * segment's path its overlap between back-to-back operations (benchmarks/README.md).
 *
 * Each rank transforms its own contribution before publishing it (PreMulSum/Avg scalars are
 * per rank, as in NCCL), and reductions run in rank order 0..n-1. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include "failpoint.h"
#include <stdio.h>
#include <stdlib.h>

#include "copy.h"
#include "debug.h"
#include "enqueue.h"
#include "env.h"
#include "window.h"

enum phase { PH_FILL = 0, PH_ARRIVE, PH_CONSUME, PH_WINDOW };
enum algo { ALGO_LOCAL = 0, ALGO_ONESHOT, ALGO_TWOPHASE, ALGO_STEP, ALGO_WINDOW, ALGO_EAGER };

static size_t oneshot_max = 32 << 10;
static size_t chunk_max = 512 << 10;
/* outputs from this size on are written with streaming stores (PYCOLL_HOST_STREAM_MIN; 0: never) */
static size_t stream_min = 8 << 20;
/* AllReduce over windows (PYCOLL_HOST_WINDOW_ALLREDUCE), Broadcast, AllGather, ReduceScatter and AlltoAll over
 * windows (PYCOLL_HOST_WINDOW_COLLECTIVES), both on by default; and how much of its share a rank handles before it
 * returns to whoever runs it (who may have a deadline, or other work) */
static bool window_allreduce = true, window_collectives = true;
#define WINDOW_PIECE_BYTES (4 << 20)
/* Small collectives of one group published together in one step (PYCOLL_HOST_GROUP_BATCH), at most this many */
static bool group_batch = true;
#define BATCH_MAX 64
/* and at most this many bytes of payload in all: batching saves waits, which matter for small operations; a
 * batch the ranks did not all publish costs its members' copies again, one by one */
#define BATCH_BYTES (64 << 10)
/* A step's wait for the peers reads their current collectives (peer_diverged) from this many polls on */
#define ARRIVE_QUIET_POLLS 32
/* Small rooted collectives over the eager lane (PYCOLL_HOST_EAGER_ROOTED) */
static bool eager_rooted = true;

/* Whether streaming stores help depends on the machine and on the size: on some machines they make a
 * large AllReduce faster, on others much slower, and outputs that the caches still hold lose by them
 * (benchmarks/README.md). Unless PYCOLL_HOST_STREAM_MIN is set, the process measures, apart for the
 * pipeline, for AllReduce over windows and for each other operation over windows (their stores go to
 * different places, in different patterns) and for each size class of the output (stream_min to twice
 * that, twice that to four times, ..., the last open-ended): the first STORE_TRIALS operations of a
 * class alternate between streaming and cached stores (every rank does the same operations in the same
 * order, so the ranks alternate together), and the stores whose best time per byte was shorter are used
 * for that class from then on. */
#define STORE_TRIALS 6
#define STORE_CLASSES 8
static bool stores_fixed; /* PYCOLL_HOST_STREAM_MIN is set: no measuring */
enum {
  STORES_PIPELINE = 0,
  STORES_WINDOWS,
  STORES_BROADCAST,
  STORES_ALLGATHER,
  STORES_REDUCESCATTER,
  STORES_ALLTOALL,
  STORES_REDUCE,
  STORES_GATHER,
  STORES_SCATTER,
  STORES_N
};
static const char* const store_what[STORES_N] = {"AllReduce/Reduce",        "AllReduce over windows",
                                                 "Broadcast over windows",  "AllGather over windows",
                                                 "ReduceScatter over windows", "AlltoAll over windows",
                                                 "Reduce over windows",     "Gather over windows",
                                                 "Scatter over windows"};
static struct store_choice {
  int pick;           /* -1: measuring; 1 streaming, 0 cached */
  int started, done;  /* trials */
  double best[2];     /* shortest ns per byte seen with cached (0) and streaming (1) stores */
} stores[STORES_N][STORE_CLASSES];
static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void coll_tunables(void) {
  uint64_t v;
  env_u64("PYCOLL_HOST_ONESHOT_MAX", 0, ENV_ONESHOT_MAX_MAX, oneshot_max, &v);
  oneshot_max = (size_t)v;
  env_u64("PYCOLL_HOST_CHUNK_BYTES", ENV_CHUNK_BYTES_MIN, ENV_CHUNK_BYTES_MAX, chunk_max, &v);
  chunk_max = (size_t)v;
  const char* set = getenv("PYCOLL_HOST_STREAM_MIN");
  stores_fixed = env_u64("PYCOLL_HOST_STREAM_MIN", 0, ENV_STREAM_MIN_MAX, stream_min, &v) && set && *set;
  stream_min = (size_t)v;
  for (int w = 0; w < STORES_N; w++)
    for (int k = 0; k < STORE_CLASSES; k++) stores[w][k].pick = -1;
  env_u64("PYCOLL_HOST_WINDOW_ALLREDUCE", 0, 1, 1, &v);
  window_allreduce = v != 0;
  env_u64("PYCOLL_HOST_WINDOW_COLLECTIVES", 0, 1, 1, &v);
  window_collectives = v != 0;
  env_u64("PYCOLL_HOST_GROUP_BATCH", 0, 1, 1, &v);
  group_batch = v != 0;
  env_u64("PYCOLL_HOST_EAGER_ROOTED", 0, 1, 1, &v);
  eager_rooted = v != 0;
}

void coll_plan(uint64_t plan[SEG_PLAN_N]) {
  plan[0] = oneshot_max;
  plan[1] = chunk_max;
  plan[2] = eager_rooted;
}

/* (PYCOLL_HOST_WINDOW_* and PYCOLL_HOST_GROUP_BATCH are not among them: each operation finds out whether every rank
 * takes that path) */
const char* const coll_plan_names[SEG_PLAN_N] = {"PYCOLL_HOST_ONESHOT_MAX", "PYCOLL_HOST_CHUNK_BYTES",
                                                 "PYCOLL_HOST_EAGER_ROOTED"};

/* The trials (stores[]) of an operation of t's kind, over windows or not; -1: none (only the outputs of
 * AllReduce/Reduce through the segment, and of the operations over windows, are large enough to choose). */
static int stores_of(const struct task* t, bool windows) {
  switch (t->kind) {
    case TK_ALLREDUCE: return windows ? STORES_WINDOWS : STORES_PIPELINE;
    case TK_REDUCE: return windows ? STORES_REDUCE : STORES_PIPELINE;
    case TK_BROADCAST: return windows ? STORES_BROADCAST : -1;
    case TK_ALLGATHER: return windows ? STORES_ALLGATHER : -1;
    case TK_REDUCESCATTER: return windows ? STORES_REDUCESCATTER : -1;
    case TK_ALLTOALL: return windows ? STORES_ALLTOALL : -1;
    case TK_GATHER: return windows ? STORES_GATHER : -1;
    case TK_SCATTER: return windows ? STORES_SCATTER : -1;
    default: return -1;
  }
}

/* Bytes of t's output on this rank (an AllGather's and an AlltoAll's are nranks blocks). */
static size_t out_bytes(const struct task* t) {
  bool blocks = t->kind == TK_ALLGATHER || t->kind == TK_ALLTOALL;
  return t->count * dt_size(t->dtype) * (blocks ? (size_t)t->comm->nranks : 1);
}

static int store_class(size_t bytes) {
  int k = 0;
  for (size_t x = bytes / stream_min; x > 1 && k < STORE_CLASSES - 1; x >>= 1) k++;
  return k;
}

/* An output of `bytes` of the pipeline or over windows (`which`): streaming stores or not -- never below the
 * threshold, measured first (above) past it. */
static bool stream_large(struct task* t, int which, size_t bytes) {
  if (stream_min == 0 || bytes < stream_min) return false;
  if (stores_fixed) return true;
  struct store_choice* sc = &stores[which][store_class(bytes)];
  int pick = __atomic_load_n(&sc->pick, __ATOMIC_ACQUIRE);
  if (pick >= 0) return pick == 1;
  int k = __atomic_fetch_add(&sc->started, 1, __ATOMIC_RELAXED);
  if (k >= STORE_TRIALS) return true; /* more started meanwhile than are measured: the default until decided */
  t->timed_store = which + 1;
  t->t_start = now_ns();
  return (k & 1) == 0; /* streaming first (the default), then cached, alternately */
}

static void store_trial_done(struct task* t, size_t bytes) {
  int which = t->timed_store - 1, cls = store_class(bytes);
  if (which != stores_of(t, t->algo == ALGO_WINDOW)) return; /* ranks disagreed on windows */
  struct store_choice* sc = &stores[which][cls];
  double per_byte = (double)(now_ns() - t->t_start) / (double)bytes;
  int mode = t->stream_out ? 1 : 0;
  pthread_mutex_lock(&store_mu);
  if (sc->best[mode] == 0 || per_byte < sc->best[mode]) sc->best[mode] = per_byte;
  if (++sc->done == STORE_TRIALS && sc->best[0] > 0 && sc->best[1] > 0) {
    int pick = sc->best[1] <= sc->best[0];
    __atomic_store_n(&sc->pick, pick, __ATOMIC_RELEASE);
    char upto[48] = "and more";
    if (cls < STORE_CLASSES - 1) snprintf(upto, sizeof upto, "to %zu", (stream_min << (cls + 1)) - 1);
    INFO("%s outputs of %zu %s bytes: %s stores (measured: streaming %.3f, cached %.3f ns per byte at best over %d "
         "operations; PYCOLL_HOST_STREAM_MIN decides instead)",
         store_what[which], stream_min << cls, upto, pick ? "streaming" : "cached", sc->best[1], sc->best[0],
         STORE_TRIALS);
  }
  pthread_mutex_unlock(&store_mu);
}

/* Slice k of n over `len` elements, boundaries aligned to a cache line. */
static inline void slice(size_t len, int n, int k, size_t align, size_t* lo, size_t* hi) {
  size_t per = (len + (size_t)n - 1) / (size_t)n;
  per = (per + align - 1) / align * align;
  *lo = MIN((size_t)k * per, len);
  *hi = MIN(*lo + per, len);
}

static inline char* at(const void* base, size_t elems, size_t es) { return (char*)base + elems * es; }

static int redop_code(const struct task* t) { return t->op >= ncclNumOps ? ncclNumOps : t->op; }

/* An operation of more than one step that can go over windows: the windows of the comm that hold its send
 * and receive buffers, if any (published in the descriptor). Not for PreMulSum/Avg on floats: their per-rank
 * scalars are applied by the rank that publishes. A Broadcast's receivers name their send buffer too, a
 * Reduce's non-roots their receive buffer (NCCL ignores them there): every rank's pair must be in the same
 * windows. A Gather's non-root has no receive buffer, a Scatter's no send buffer: the buffer it has stands
 * for both, so that its key matches the root's only where the root's two buffers lie in that one window.
 * Not for an AlltoAll in place: a peer would write a block of this rank's output before this rank has sent
 * what was there. */
static void find_windows(struct task* t) {
  size_t bytes = t->count * dt_size(t->dtype), n = (size_t)t->comm->nranks, send = bytes, recv = bytes;
  if (t->kind == TK_ALLREDUCE ? !window_allreduce : !window_collectives) return;
  bool reducing = t->kind == TK_ALLREDUCE || t->kind == TK_REDUCE || t->kind == TK_REDUCESCATTER;
  if (reducing && t->rop.kind == RK_PREMULSUM) return;
  bool root = t->comm->rank == t->root;
  if (t->kind == TK_ALLGATHER || t->kind == TK_ALLTOALL || (t->kind == TK_GATHER && root)) recv *= n;
  if (t->kind == TK_REDUCESCATTER || t->kind == TK_ALLTOALL || (t->kind == TK_SCATTER && root)) send *= n;
  const char *s = t->sendbuff, *r = t->recvbuff;
  if (t->kind == TK_ALLTOALL && s < r + recv && r < s + send) return;
  if (t->kind == TK_GATHER && !root) r = s;
  if (t->kind == TK_SCATTER && !root) s = r;
  size_t off[2];
  t->win[0] = window_holding(t->comm, s, send, &off[0]);
  t->win[1] = t->win[0] ? window_holding(t->comm, r, recv, &off[1]) : NULL;
  if (!t->win[1]) {
    if (t->win[0]) window_put(t->win[0]);
    t->win[0] = NULL;
    return;
  }
  t->win_off[0] = off[0];
  t->win_off[1] = off[1];
  t->win_key = mix64(t->win[0]->key ^ mix64(t->win[1]->key)) | 1;
}

/* ---- small collectives of one group, published together ----
 *
 * A group's collectives on one communicator run one after another, each in its own steps: k small ones cost
 * k arrivals, k waits for every rank. When an operation of one step starts and the next ones of its lane in
 * the group are single-step too (an AllReduce or Reduce of at most PYCOLL_HOST_ONESHOT_MAX bytes, a
 * Broadcast, AllGather or Gather of at most one step), its rank publishes all of them in one step: each
 * operation's payload at its own cache-line-aligned offset of the inbox, the first one's at 0, as alone, and
 * in the descriptor -- the first operation's, as alone -- a key of the whole batch (hashing every member's
 * kind, count, dtype, operation and root) and the number of members. After everyone has arrived the ranks
 * read the same descriptors: if every rank published the same batch, each consumes every member at its
 * offset and the whole batch is done after one wait; otherwise (a peer grouped differently, issued them one
 * by one, or hit a limit this rank did not) every rank consumes the first operation only, exactly as if it had
 * been published alone, and the others run one by one after it (each may lead a batch of the rest). A batch
 * holds at most BATCH_MAX operations and BATCH_BYTES of payload: what a disagreement costs again. So
 * grouping stays a local matter, as in NCCL, and a mismatch is still found operation by operation.
 *
 * A member's send buffer is read when the batch is published, before the earlier members have written their
 * outputs: an operation is batched only if its buffers meet no earlier member's output, nor its output an
 * earlier member's input (the order in which a group's collectives see each other's results stays the call
 * order). Not for operations with a launch marker (the *Config variants' ncclCollConfig), which fire when
 * their own operation starts. */

static bool eager_ok(const struct task* t);
static void publish_current(const struct task* t);

/* Payload bytes a single-step operation that a batch can take publishes in its inbox; 0: not one (an operation
 * of the eager lane takes no step). */
static size_t batch_bytes(const struct task* t) {
  size_t bytes = t->count * dt_size(t->dtype), ib = t->comm->seg.inbox_bytes;
  if (eager_ok(t)) return 0;
  switch (t->kind) {
    case TK_ALLREDUCE:
    case TK_REDUCE: return bytes <= MIN(oneshot_max, ib) ? bytes : 0;
    case TK_BROADCAST:
    case TK_ALLGATHER:
    case TK_GATHER: return bytes <= ib ? bytes : 0;
    default: return 0;
  }
}

struct span {
  const char *lo, *hi; /* lo == hi: none */
};

static bool spans_meet(struct span a, struct span b) { return a.lo < b.hi && b.lo < a.hi; }

/* The bytes of this rank's buffers an operation of batch_bytes() reads and writes. */
static void batch_spans(const struct task* t, struct span* in, struct span* out) {
  int me = t->comm->rank, n = t->comm->nranks;
  size_t bytes = t->count * dt_size(t->dtype);
  bool root = me == t->root, reads = t->kind != TK_BROADCAST || root;
  bool writes = (t->kind != TK_REDUCE && t->kind != TK_GATHER) || root;
  size_t obytes = t->kind == TK_ALLGATHER || t->kind == TK_GATHER ? bytes * (size_t)n : bytes;
  const char *s = t->sendbuff, *r = t->recvbuff;
  *in = reads ? (struct span){s, s + bytes} : (struct span){NULL, NULL};
  *out = writes ? (struct span){r, r + obytes} : (struct span){NULL, NULL};
}

static uint64_t batch_mix(uint64_t key, const struct task* t) {
  uint64_t what = (uint64_t)(uint32_t)t->kind | (uint64_t)(uint32_t)t->dtype << 8 |
                  (uint64_t)(uint32_t)redop_code(t) << 16 | (uint64_t)(uint32_t)(t->root + 1) << 32;
  return mix64(mix64(key ^ what) ^ t->count);
}

/* A single-step operation starting: the next operations of its lane that it can publish with it. */
static void form_batch(struct task* t) {
  if (!group_batch || !t->lane_next || t->launch_marker) return; /* an operation alone: nothing to look at */
  struct span in[BATCH_MAX], out[BATCH_MAX];
  size_t used = batch_bytes(t), room = MIN((size_t)BATCH_BYTES, t->comm->seg.inbox_bytes);
  if (!used) return;
  batch_spans(t, &in[0], &out[0]);
  uint64_t key = batch_mix(0, t);
  uint32_t m = 1;
  for (struct task* u = t->lane_next; u && m < BATCH_MAX; u = u->lane_next) {
    size_t bytes = batch_bytes(u), off = ALIGN_UP(used, CACHELINE);
    if (!bytes || u->started || u->done || u->launch_marker || off + bytes > room) break;
    batch_spans(u, &in[m], &out[m]);
    bool clash = false;
    for (uint32_t j = 0; j < m && !clash; j++)
      clash = spans_meet(in[m], out[j]) || spans_meet(out[m], in[j]) || spans_meet(out[m], out[j]);
    if (clash) break;
    /* its state as coll_start would set it for one step (coll_start sets it again if it runs alone) */
    u->ioff = off;
    u->algo = u->kind == TK_ALLREDUCE || u->kind == TK_REDUCE ? ALGO_ONESHOT : ALGO_STEP;
    u->piece = u->count;
    u->step = 0;
    u->nsteps = 1;
    u->stream_out = false;
    u->win_key = 0;
    if (u->scalar_p) memcpy(&u->rop.scalar, u->scalar_p, dt_size(u->dtype));
    key = batch_mix(key, u);
    used = off + bytes;
    m++;
  }
  if (m > 1) {
    t->batch_n = m;
    t->batch_key = key | 1;
  }
}

bool coll_quick(const struct task* t) {
  if (eager_ok(t)) return true;
  if (t->kind == TK_SEND || t->kind == TK_RECV) /* one chunk, one slot of its ring: a send's pass publishes it, a
                                                 * receive's takes it where it is there */
    return t->count * dt_size(t->dtype) <= MIN(BATCH_BYTES / 2, t->comm->seg.slot_bytes - SLOT_HDR_BYTES);
  size_t bytes = batch_bytes(t); /* 0 for every other kind */
  return bytes && bytes <= BATCH_BYTES / (size_t)t->comm->nranks;
}

static void consume(struct task* t, int p);

/* The batch's step, everyone arrived (the leader consumed already): every member consumed and done if every
 * rank published this batch, else nothing (the members run one by one). */
static void end_batch(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  uint32_t m = t->batch_n;
  bool agreed = true;
  for (int k = 0; k < c->nranks && agreed; k++)
    agreed = c->seg.ctrl[k].desc[p].win_key == t->batch_key && c->seg.ctrl[k].desc[p].win_off[0] == m;
  t->batch_key = 0;
  t->batch_n = 1;
  if (!agreed) return;
  struct task* u = t->lane_next;
  for (uint32_t j = 1; j < m; j++, u = u->lane_next) {
    u->started = true;
    u->op_seq = c->op_seq++;
    consume(u, p);
    u->done = true;
  }
}

void coll_start(struct task* t) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  size_t es = dt_size(t->dtype), n = (size_t)c->nranks, ib = s->inbox_bytes;
  t->started = true;
  t->stream_out = false;
  t->timed_store = 0;
  t->step = 0;
  t->phase = PH_FILL;
  t->win_key = 0;
  t->ioff = 0;
  t->batch_n = 1;
  t->batch_key = 0;
  t->op_seq = c->op_seq++;
  if (t->scalar_p) memcpy(&t->rop.scalar, t->scalar_p, es);
  if (n == 1) {
    t->algo = ALGO_LOCAL;
    t->nsteps = 0;
    return;
  }
  publish_current(t);
  if (eager_ok(t)) {
    t->algo = ALGO_EAGER;
    t->nsteps = 0;
    t->wait_idx = 0;
    return;
  }
  t->algo = ALGO_STEP;
  switch (t->kind) {
    case TK_ALLREDUCE:
    case TK_REDUCE: {
      size_t bytes = t->count * es;
      if (bytes <= MIN(oneshot_max, ib)) {
        t->algo = ALGO_ONESHOT;
        t->piece = t->count;
      } else {
        t->algo = ALGO_TWOPHASE;
        t->piece = MAX((size_t)1, MIN(chunk_max, ib) / es); /* never 0: it divides the step count */
        find_windows(t);
        t->stream_out = stream_large(t, stores_of(t, t->win_key), bytes);
      }
      break;
    }
    case TK_BROADCAST:
    case TK_ALLGATHER:
    case TK_GATHER: t->piece = MAX((size_t)1, ib / es); break;
    default: t->piece = MAX((size_t)1, ib / (n * es)); break; /* one piece per destination block */
  }
  t->nsteps = (uint32_t)((t->count + t->piece - 1) / t->piece);
  t->nchunks = t->nsteps;
  if (t->algo == ALGO_TWOPHASE) t->nsteps++; /* the last step only reduces and copies out */
  else if (t->nsteps > 1) { /* every kind but the point-to-point ones, which have no steps here */
    find_windows(t);
    t->stream_out = t->win_key && stream_large(t, stores_of(t, true), out_bytes(t));
  }
  if (t->nsteps == 1) form_batch(t);
  t->step0 = c->next_step;
  c->next_step += t->nsteps;
}

static void run_local(struct task* t) {
  size_t bytes = t->count * dt_size(t->dtype);
  if (t->kind == TK_ALLREDUCE || t->kind == TK_REDUCE || t->kind == TK_REDUCESCATTER) {
    const void* src = t->sendbuff;
    dt_reduce(&t->rop, t->recvbuff, NULL, &src, 1, 0, t->count);
  } else if (t->recvbuff != t->sendbuff) {
    memmove(t->recvbuff, t->sendbuff, bytes);
  }
}

/* What the ranks compare of an operation (same_op), into a descriptor: a step's, an eager message's, the collective
 * a rank is in. */
static void op_fields(struct op_desc* d, const struct task* t) {
  d->count = t->count;
  d->kind = t->kind;
  d->dtype = t->dtype;
  d->redop = redop_code(t);
  d->root = t->root;
}

static void write_desc(struct task* t, int parity) {
  struct op_desc* d = &t->comm->seg.ctrl[t->comm->rank].desc[parity];
  d->op_seq = t->op_seq;
  op_fields(d, t);
  d->step = t->step;
  d->nsteps = t->nsteps;
  d->win_key = t->win_key;
  d->win_off[0] = t->win_off[0];
  d->win_off[1] = t->win_off[1];
  if (t->batch_key) { /* a single step: no windows; the slots say which batch (end_batch) */
    d->win_key = t->batch_key;
    d->win_off[0] = t->batch_n;
    d->win_off[1] = 0;
  }
}

static void describe(char* out, size_t len, int kind, uint64_t count, int dtype, int redop, int root) {
  if (kind == TK_ALLGATHER && root == WINDOW_EXCHANGE_ROOT) {
    snprintf(out, len, "ncclCommWindowRegister (its exchange of the windows)");
    return;
  }
  int n = snprintf(out, len, "%s(count=%llu, datatype=%s", task_kind_name(kind), (unsigned long long)count,
                   ph_type_name(dtype));
  if (kind == TK_ALLREDUCE || kind == TK_REDUCE || kind == TK_REDUCESCATTER)
    n += snprintf(out + n, len - (size_t)n, ", op=%s", ph_op_name(redop));
  if (kind == TK_BROADCAST || kind == TK_REDUCE || kind == TK_GATHER || kind == TK_SCATTER)
    n += snprintf(out + n, len - (size_t)n, ", root=%d", root);
  snprintf(out + n, len - (size_t)n, ")");
}

static bool same_op(const struct task* t, const struct op_desc* d) {
  return d->kind == t->kind && d->count == t->count && d->dtype == t->dtype && d->redop == redop_code(t) &&
         d->root == t->root;
}

/* Fails the task: rank k's descriptor `d` (of a step, of an eager message, or the collective it is in) is not this
 * task's. The text numbers this rank's collective among all the communicator's collectives from 1, zero-element
 * ones included, as pycoll's Works and flight recorder do; op_seq, which the ranks compare, counts only those that
 * carry data (a zero-element collective is a no-op, as in NCCL), from 0. */
static void fail_mismatch(struct task* t, int k, const struct op_desc* d) {
  char mine[160], theirs[160];
  describe(mine, sizeof mine, t->kind, t->count, t->dtype, redop_code(t), t->root);
  describe(theirs, sizeof theirs, d->kind, d->count, d->dtype, d->redop, d->root);
  if (same_op(t, d))
    task_fail(t, ncclInvalidUsage,
              "%s : collective sequence mismatch: rank %d is at collective #%llu (its collective with data #%llu, "
              "step %u) but rank %d is at its collective with data #%llu (step %u) of %s",
              t->opname, t->comm->rank, (unsigned long long)t->issued, (unsigned long long)t->op_seq + 1, t->step,
              k, (unsigned long long)d->op_seq + 1, d->step, mine);
  else if (t->root == WINDOW_EXCHANGE_ROOT) /* a window registration: no collective of the user's numbers */
    task_fail(t, ncclInvalidUsage, "%s : collective mismatch: rank %d called %s but rank %d called %s", t->opname,
              t->comm->rank, mine, k, theirs);
  else
    task_fail(t, ncclInvalidUsage, "%s : collective mismatch at collective #%llu: rank %d called %s but rank %d called %s",
              t->opname, (unsigned long long)t->issued, t->comm->rank, mine, k, theirs);
}

/* Compares rank k's descriptor of the step in parity `parity` with ours; fails the task on a mismatch. */
static bool desc_ok(struct task* t, int k, int parity) {
  const struct op_desc* d = &t->comm->seg.ctrl[k].desc[parity];
  if (same_op(t, d) && d->step == t->step && d->op_seq == t->op_seq) return true;
  fail_mismatch(t, k, d);
  return false;
}

/* ---- the collective each rank is in ----
 *
 * Each rank publishes the collective it starts (rank_ctrl.cur) before it publishes anything of it. A rank waiting
 * for a peer reads it: a peer in the same collective (the same op_seq) with other arguments, or one that went past
 * it without doing its part for this rank, called something else -- an error now, not a hang, also where the two
 * took different paths (a step, the eager lane) because their arguments differ. */
static void publish_current(const struct task* t) {
  struct op_desc* d = &t->comm->seg.ctrl[t->comm->rank].cur;
  __atomic_store_n(&d->op_seq, UINT64_MAX, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  op_fields(d, t);
  d->step = 0;
  __atomic_store_n(&d->op_seq, t->op_seq, __ATOMIC_RELEASE);
}

/* Rank k's current collective into *out; false while it has none or is writing it. */
static bool peer_current(const struct ncclComm* c, int k, struct op_desc* out) {
  const struct op_desc* d = &c->seg.ctrl[k].cur;
  uint64_t seq = __atomic_load_n(&d->op_seq, __ATOMIC_ACQUIRE);
  if (seq == UINT64_MAX) return false;
  out->count = d->count;
  out->kind = d->kind;
  out->dtype = d->dtype;
  out->redop = d->redop;
  out->root = d->root;
  out->step = 0;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  out->op_seq = seq;
  return __atomic_load_n(&d->op_seq, __ATOMIC_RELAXED) == seq;
}

/* A task waiting for rank k's part of it: fails it (true) if rank k is in this collective with other arguments, or
 * went past it without doing its part -- `done_part(t, k)`, read after k's collective (k publishes its part before
 * it moves on), says whether it did. */
static bool peer_diverged(struct task* t, int k, bool (*done_part)(const struct task*, int)) {
  struct op_desc d;
  if (!peer_current(t->comm, k, &d)) return false;
  if (d.op_seq == t->op_seq) {
    if (same_op(t, &d)) return false;
    fail_mismatch(t, k, &d);
    return true;
  }
  if (d.op_seq < t->op_seq || done_part(t, k)) return false;
  char mine[160];
  describe(mine, sizeof mine, t->kind, t->count, t->dtype, redop_code(t), t->root);
  task_fail(t, ncclInvalidUsage,
            "%s : collective mismatch at collective #%llu: rank %d called %s but rank %d went past it (to its "
            "collective with data #%llu) without doing its part for rank %d: it called another operation or other "
            "arguments there",
            t->opname, (unsigned long long)t->issued, t->comm->rank, mine, k, (unsigned long long)d.op_seq + 1,
            t->comm->rank);
  return true;
}

/* Whether rank k arrived at the step t waits at (a step task's part). */
static bool arrived(const struct task* t, int k) {
  return __atomic_load_n(&t->comm->seg.ctrl[k].arrive, __ATOMIC_ACQUIRE) >= t->step0 + t->step + 1;
}

/* ---- small rooted collectives: the eager lane ----
 *
 * A Broadcast or Scatter whose block is at most EAGER_PAYLOAD bytes, and a Gather or Reduce of such blocks, take
 * no step: their senders (the root of a Broadcast or Scatter; the other ranks of a Gather or Reduce) write their
 * block, behind the operation's descriptor, into a slot of the ring each ordered pair of ranks has for it, and are
 * done; their receivers wait for a slot from each sender, compare its descriptor with their own (a mismatch is an
 * error, as at a step), copy or reduce it out and free the slot. A sender waits only when a receiver is
 * EAGER_SLOTS operations behind: a root runs that many operations ahead of its receivers, as Open MPI's and
 * NCCL's small messages do, instead of meeting every rank at every operation. Every rank decides the same
 * (from the kind, count, datatype and rank count every rank passes, PYCOLL_HOST_EAGER_ROOTED=0 turns it off):
 * ranks whose arguments differ take different paths, which the collective each rank publishes (above) turns into
 * the mismatch error. The lane is not the point-to-point rings: a send and a collective between the same ranks
 * never meet. A Reduce's root reduces in rank order from published values, its own published first (the bits
 * of the step path). */
static bool eager_ok(const struct task* t) {
  if (!eager_rooted || t->comm->nranks == 1) return false;
  if (t->kind != TK_BROADCAST && t->kind != TK_SCATTER && t->kind != TK_GATHER && t->kind != TK_REDUCE) return false;
  return t->count * dt_size(t->dtype) <= EAGER_PAYLOAD;
}

/* Whether an eager task sends (the root of a Broadcast or Scatter, the other ranks of a Gather or Reduce) or
 * receives. */
static bool eager_sends(const struct task* t) {
  bool root = t->comm->rank == t->root;
  return t->kind == TK_BROADCAST || t->kind == TK_SCATTER ? root : !root;
}

/* Whether an eager task exchanges a message with rank k: the root with every other rank, the others with it. */
static bool eager_peer(const struct task* t, int k) {
  return k != t->comm->rank && (t->comm->rank == t->root || k == t->root);
}

/* The descriptor of the oldest message in the lane from rank k to this rank, NULL while it is empty. */
static const struct op_desc* lane_front(const struct task* t, int k) {
  const struct seg* s = &t->comm->seg;
  const struct chan_ctrl* ch = seg_echan(s, k, t->comm->rank);
  uint64_t tl = __atomic_load_n(&ch->tail, __ATOMIC_RELAXED);
  if (__atomic_load_n(&ch->head, __ATOMIC_ACQUIRE) == tl) return NULL;
  return (const struct op_desc*)seg_eslot(s, k, t->comm->rank, tl);
}

/* Whether rank k's message for t is in the lane from k to this rank (a receiver's peer's part). */
static bool eager_sent(const struct task* t, int k) { return lane_front(t, k) != NULL; }

/* A sender's receiver: its part comes later, so it never "went past" without it */
static bool never_passed(const struct task* t, int k) {
  (void)t;
  (void)k;
  return true;
}

static int eager_send(struct task* t, bool moved) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, n = c->nranks;
  size_t bytes = t->count * dt_size(t->dtype);
  for (; t->wait_idx < n; t->wait_idx++) {
    int k = t->wait_idx;
    if (!eager_peer(t, k)) continue;
    struct chan_ctrl* ch = seg_echan(s, me, k);
    uint64_t h = __atomic_load_n(&ch->head, __ATOMIC_RELAXED);
    if (h - __atomic_load_n(&ch->tail, __ATOMIC_ACQUIRE) >= EAGER_SLOTS) {
      t->wait_peer = k;
      if (peer_diverged(t, k, never_passed)) return PROG_DONE;
      return moved ? PROG_MOVED : PROG_BLOCKED;
    }
    if (UNLIKELY(fp_hit("host.coll.eager")))
      return task_fail(t, ncclSystemError, "%s : failpoint host.coll.eager", task_kind_name(t->kind));
    char* slot = seg_eslot(s, me, k, h);
    struct op_desc* d = (struct op_desc*)slot;
    memset(d, 0, sizeof *d);
    d->op_seq = t->op_seq;
    op_fields(d, t);
    char* payload = slot + sizeof *d;
    if (t->kind == TK_REDUCE) dt_publish(&t->rop, payload, t->sendbuff, t->count);
    else if (t->kind == TK_SCATTER) ph_copy(payload, at(t->sendbuff, (size_t)k * t->count, dt_size(t->dtype)), bytes);
    else ph_copy(payload, t->sendbuff, bytes);
    __atomic_store_n(&ch->head, h + 1, __ATOMIC_RELEASE);
    seg_ring(s);
    moved = true;
  }
  /* A peer that sent this rank a message of this very operation, or is in it with other arguments, did not call
   * it as this rank did (where the peer comes later, it finds the mismatch: this rank fails at its next wait
   * for it) */
  for (int k = 0; k < n; k++) {
    if (!eager_peer(t, k)) continue;
    const struct op_desc* d = lane_front(t, k);
    if (d && d->op_seq == t->op_seq) {
      fail_mismatch(t, k, d);
      return PROG_DONE;
    }
    if (peer_diverged(t, k, never_passed)) return PROG_DONE;
  }
  if (me == t->root) { /* a Broadcast's or Scatter's root: its own output */
    const char* src = t->kind == TK_SCATTER ? at(t->sendbuff, (size_t)me * t->count, dt_size(t->dtype)) : t->sendbuff;
    if (src != (const char*)t->recvbuff) memmove(t->recvbuff, src, bytes);
  }
  return PROG_DONE;
}

static int eager_receive(struct task* t, bool moved) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), bytes = t->count * es;
  for (; t->wait_idx < n; t->wait_idx++) { /* every sender's slot there and of this operation */
    int k = t->wait_idx;
    if (!eager_peer(t, k)) continue;
    const struct op_desc* d = lane_front(t, k);
    if (!d) {
      t->wait_peer = k;
      if (peer_diverged(t, k, eager_sent)) return PROG_DONE;
      return moved ? PROG_MOVED : PROG_BLOCKED;
    }
    if (!same_op(t, d) || d->op_seq != t->op_seq) {
      fail_mismatch(t, k, d);
      return PROG_DONE;
    }
  }
  const void* srcs[n];
  char own[EAGER_PAYLOAD];
  for (int k = 0; k < n; k++) {
    if (!eager_peer(t, k)) continue;
    struct chan_ctrl* ch = seg_echan(s, k, me);
    uint64_t tl = __atomic_load_n(&ch->tail, __ATOMIC_RELAXED);
    const char* payload = seg_eslot(s, k, me, tl) + sizeof(struct op_desc);
    if (t->kind == TK_REDUCE) {
      srcs[k] = payload;
      continue; /* freed once reduced */
    }
    ph_copy(t->kind == TK_GATHER ? at(t->recvbuff, (size_t)k * t->count, es) : (char*)t->recvbuff, payload, bytes);
    __atomic_store_n(&ch->tail, tl + 1, __ATOMIC_RELEASE);
  }
  if (t->kind == TK_GATHER) {
    char* dst = at(t->recvbuff, (size_t)me * t->count, es);
    if (dst != (const char*)t->sendbuff) memmove(dst, t->sendbuff, bytes);
  } else if (t->kind == TK_REDUCE) {
    dt_publish(&t->rop, own, t->sendbuff, t->count);
    srcs[me] = own;
    dt_reduce(&t->rop, t->recvbuff, NULL, srcs, n, -1, t->count);
    for (int k = 0; k < n; k++) {
      if (!eager_peer(t, k)) continue;
      struct chan_ctrl* ch = seg_echan(s, k, me);
      __atomic_store_n(&ch->tail, __atomic_load_n(&ch->tail, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
    }
  }
  seg_ring(s);
  return PROG_DONE;
}

/* Elements [base, base+len) of the operation are handled by step (or chunk) `k`. */
static void chunk_range(const struct task* t, uint32_t k, size_t* base, size_t* len) {
  *base = (size_t)k * t->piece;
  *len = MIN(t->piece, t->count - *base);
}

static void step_range(const struct task* t, size_t* base, size_t* len) { chunk_range(t, t->step, base, len); }

static void fill(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), base, len;
  if (t->algo == ALGO_WINDOW) return; /* the steps after 0 only wait */
  step_range(t, &base, &len);
  char* mine = seg_inbox(s, me, p) + t->ioff;
  switch (t->kind) {
    case TK_ALLREDUCE:
    case TK_REDUCE:
      if (t->algo == ALGO_ONESHOT) {
        dt_publish(&t->rop, mine, at(t->sendbuff, base, es), len);
      } else if (t->algo == ALGO_TWOPHASE && t->step < t->nchunks) {
        size_t align = MAX((size_t)1, CACHELINE / es);
        for (int k = 0; k < n; k++) {
          size_t lo, hi;
          slice(len, n, k, align, &lo, &hi);
          if (k != me && hi > lo) dt_publish(&t->rop, at(mine, lo, es), at(t->sendbuff, base + lo, es), hi - lo);
        }
      }
      break;
    case TK_BROADCAST:
      if (me == t->root) {
        ph_copy(mine, at(t->sendbuff, base, es), len * es);
        if (t->recvbuff != t->sendbuff) ph_copy(at(t->recvbuff, base, es), at(t->sendbuff, base, es), len * es);
      }
      break;
    case TK_ALLGATHER: ph_copy(mine, at(t->sendbuff, base, es), len * es); break;
    case TK_GATHER:
      if (me != t->root) ph_copy(mine, at(t->sendbuff, base, es), len * es);
      else if (at(t->recvbuff, (size_t)me * t->count + base, es) != at(t->sendbuff, base, es))
        memmove(at(t->recvbuff, (size_t)me * t->count + base, es), at(t->sendbuff, base, es), len * es);
      break;
    case TK_REDUCESCATTER:
      for (int k = 0; k < n; k++)
        if (k != me) dt_publish(&t->rop, at(mine, (size_t)k * t->piece, es), at(t->sendbuff, (size_t)k * t->count + base, es), len);
      break;
    case TK_ALLTOALL:
    case TK_SCATTER:
      if (t->kind == TK_SCATTER && me != t->root) break;
      for (int k = 0; k < n; k++) {
        const char* src = at(t->sendbuff, (size_t)k * t->count + base, es);
        if (k != me) {
          ph_copy(at(mine, (size_t)k * t->piece, es), src, len * es);
        } else {
          char* dst = at(t->recvbuff, (t->kind == TK_ALLTOALL ? (size_t)me * t->count : 0) + base, es);
          if (dst != src) memmove(dst, src, len * es);
        }
      }
      break;
  }
}

/* Pipelined AllReduce/Reduce, step s >= 1: reduce this rank's slice of chunk s-1 (published in
 * parity p) into outbuf and, where this rank keeps that slice, into its output. */
static void reduce_prev(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), base, len, lo, hi, align = MAX((size_t)1, CACHELINE / es);
  chunk_range(t, t->step - 1, &base, &len);
  slice(len, n, me, align, &lo, &hi);
  if (hi <= lo) return;
  const void* srcs[n];
  for (int k = 0; k < n; k++) srcs[k] = k == me ? at(t->sendbuff, base + lo, es) : at(seg_inbox(s, k, p), lo, es);
  char* out = at(seg_outbuf(s, p), lo, es);
  bool keep = t->kind == TK_ALLREDUCE || me == t->root;
  if (!keep) dt_reduce(&t->rop, out, NULL, srcs, n, me, hi - lo);
  else if (t->stream_out) dt_reduce_stream(&t->rop, at(t->recvbuff, base + lo, es), out, srcs, n, me, hi - lo);
  else dt_reduce(&t->rop, at(t->recvbuff, base + lo, es), out, srcs, n, me, hi - lo);
}

/* Pipelined AllReduce/Reduce, step s >= 1, after everyone arrived: copy the other ranks' reduced
 * slices of chunk s-1 (parity p) to the output. */
static void copy_out(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  int me = c->rank, n = c->nranks;
  if (t->step == 0 || (t->kind == TK_REDUCE && me != t->root)) return;
  size_t es = dt_size(t->dtype), base, len, align = MAX((size_t)1, CACHELINE / es);
  chunk_range(t, t->step - 1, &base, &len);
  for (int k = 0; k < n; k++) {
    size_t lo, hi;
    slice(len, n, k, align, &lo, &hi);
    if (k != me && hi > lo)
      (t->stream_out ? ph_stream : ph_copy)(at(t->recvbuff, base + lo, es), at(seg_outbuf(&c->seg, p), lo, es),
                                            (hi - lo) * es);
  }
}

/* A peer of c that left before completing step S -- aborted, or (`revoked` set) revoked --, or -1. */
static int left_before(const struct ncclComm* c, uint64_t S, bool revoked) {
  for (int k = 0; k < c->nranks; k++) {
    if (k == c->rank) continue;
    const struct rank_ctrl* pc = &c->seg.ctrl[k];
    int st = __atomic_load_n(&pc->left_state, __ATOMIC_ACQUIRE);
    if (UNLIKELY(st) && (revoked || st == RS_ABORTED) && __atomic_load_n(&pc->left_done, __ATOMIC_RELAXED) <= S)
      return k;
  }
  return -1;
}

/* Whether a peer of t left the communicator (aborted or revoked) before it completed step S of it, which every
 * rank has arrived at (t failed then): that peer's operation failed there, so this one fails too, as NCCL's would
 * (it would hang for the peer's missing part), and takes nothing of the peer's -- neither the part it published
 * before it left (the ranks agreed otherwise on whether the operation ran) nor, over windows, its buffers, which it
 * owns again. A peer that completed the step and left after (a program's end by abort()) or finished or finalized
 * is no failure. Over windows no rank completes step 0 before every piece is written, so a peer that left then
 * failed. */
static bool peer_left(struct task* t, uint64_t S) {
  int k = left_before(t->comm, S, true);
  if (LIKELY(k < 0)) return false;
  char text[320]; /* its state, published before left_state (comm_publish_state), says why */
  comm_check_peer(t->comm, k, false, text, sizeof text);
  task_fail(t, ncclRemoteError, "%s : %s", task_kind_name(t->kind), text);
  return true;
}

/* Before a piece written into the peers' windows: this rank says it writes (a peer's abort or revoke waits for
 * that to end: comm_wait_window_writers), then looks whether a peer left; false (t failed) where one did. The
 * store and the peer's state store are each followed by a full fence, so either this rank sees the peer gone
 * or the peer sees it writing. */
static bool window_piece_begin(struct task* t) {
  struct rank_ctrl* me = &t->comm->seg.ctrl[t->comm->rank];
  __atomic_store_n(&me->in_windows, 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (!peer_left(t, t->step0)) return true;
  __atomic_store_n(&me->in_windows, 0, __ATOMIC_RELEASE);
  return false;
}

static void window_piece_end(struct task* t) {
  __atomic_store_n(&t->comm->seg.ctrl[t->comm->rank].in_windows, 0, __ATOMIC_RELEASE);
}

/* Step 0 of an operation that can go over windows, everyone arrived: whether every rank's buffers are in the
 * same windows (the same verdict on every rank: it reads the same descriptors). */
static bool windows_agreed(const struct task* t, int p) {
  if (!t->win_key) return false;
  for (int k = 0; k < t->comm->nranks; k++)
    if (t->comm->seg.ctrl[k].desc[p].win_key != t->win_key) return false;
  return true;
}

/* Rank k's send (which = 0) or receive (1) buffer of this operation, where this process maps it. Every rank
 * has arrived at step 0, so every buffer belongs to this operation. */
static char* peer_buffer(const struct task* t, int p, int k, int which) {
  return t->win[which]->peers[k].ptr + t->comm->seg.ctrl[k].desc[p].win_off[which];
}

/* AllReduce and Reduce over windows: the next piece of this rank's slice of the operation (from t->off),
 * reduced in one pass from every rank's send buffer into every rank's receive buffer (a Reduce's root's
 * only); true once the slice is done. Only this rank touches its slice, in place or not. */
static bool reduce_windows(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), lo, hi;
  slice(t->count, n, me, MAX((size_t)1, CACHELINE / es), &lo, &hi);
  lo += t->off;
  if (hi <= lo) return true;
  size_t len = MIN(hi - lo, MAX((size_t)1, WINDOW_PIECE_BYTES / es));
  const void* srcs[n];
  void* dsts[n];
  bool all = t->kind == TK_ALLREDUCE;
  for (int k = 0; k < n; k++) {
    srcs[k] = at(peer_buffer(t, p, k, 0), lo, es);
    if (all) dsts[(k - me + n) % n] = at(peer_buffer(t, p, k, 1), lo, es); /* this rank's first */
  }
  if (!all) dsts[0] = at(peer_buffer(t, p, t->root, 1), lo, es);
  dt_reduce_to(&t->rop, dsts, all ? n : 1, t->stream_out, srcs, n, len);
  t->off += len;
  return lo + len == hi;
}

/* src's `bytes` into each of dsts (NULL or src itself: skipped), a cache-sized part at a time: src is read
 * from memory once. */
static void copy_to(char* const* dsts, int ndst, const char* src, size_t bytes, bool stream) {
  for (size_t done = 0, part = 64 << 10; done < bytes; done += part) {
    size_t m = MIN(part, bytes - done);
    for (int k = 0; k < ndst; k++)
      if (dsts[k] && dsts[k] != src) (stream ? ph_stream : ph_copy)(dsts[k] + done, src + done, m);
  }
}

/* Broadcast, AllGather, ReduceScatter, AlltoAll, Gather, Scatter over windows: the next piece of this rank's
 * share (from t->off), straight from the ranks' send buffers; true once the share is done. A Broadcast's rank
 * copies its slice of the root's buffer into every rank's output, an AllGather's its block, reading it once
 * (the root's output is skipped where it is the root's buffer, a rank's own block where in place); a
 * ReduceScatter's rank reduces its block from every rank's send buffer into its output; an AlltoAll's copies
 * its block k into rank k's output, a Gather's its block into the root's output, a Scatter's its block of
 * the root's input into its output (skipped where in place). The outputs are written starting with the next
 * rank's, so that the ranks write to different peers at once. */
static bool gather_windows(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), count = t->count, lo = 0, hi = count;
  if (t->kind == TK_BROADCAST) slice(count, n, me, MAX((size_t)1, CACHELINE / es), &lo, &hi);
  lo += t->off;
  if (hi <= lo) return true;
  size_t len = MIN(hi - lo, MAX((size_t)1, WINDOW_PIECE_BYTES / es));
  if (t->kind == TK_REDUCESCATTER) {
    const void* srcs[n];
    void* dst = at(t->recvbuff, lo, es);
    for (int k = 0; k < n; k++)
      srcs[k] = at(k == me ? (const char*)t->sendbuff : peer_buffer(t, p, k, 0), (size_t)me * count + lo, es);
    dt_reduce_to(&t->rop, &dst, 1, t->stream_out, srcs, n, len);
  } else if (t->kind == TK_ALLTOALL) {
    for (int j = 0; j < n; j++) {
      int k = (me + 1 + j) % n;
      char* dst = at(k == me ? (char*)t->recvbuff : peer_buffer(t, p, k, 1), (size_t)me * count + lo, es);
      (t->stream_out ? ph_stream : ph_copy)(dst, at(t->sendbuff, (size_t)k * count + lo, es), len * es);
    }
  } else if (t->kind == TK_GATHER) {
    char* dst = at(peer_buffer(t, p, t->root, 1), (size_t)me * count + lo, es);
    copy_to(&dst, 1, at(t->sendbuff, lo, es), len * es, t->stream_out);
  } else if (t->kind == TK_SCATTER) {
    char* dst = at(t->recvbuff, lo, es);
    copy_to(&dst, 1, at(peer_buffer(t, p, t->root, 0), (size_t)me * count + lo, es), len * es, t->stream_out);
  } else {
    bool bcast = t->kind == TK_BROADCAST;
    const char* src = bcast ? at(peer_buffer(t, p, t->root, 0), lo, es) : at(t->sendbuff, lo, es);
    size_t at_out = bcast ? lo : (size_t)me * count + lo;
    char* dsts[n];
    for (int j = 0; j < n; j++) {
      int k = (me + 1 + j) % n;
      dsts[j] = at(k == me ? (char*)t->recvbuff : peer_buffer(t, p, k, 1), at_out, es);
    }
    copy_to(dsts, n, src, len * es, t->stream_out);
  }
  t->off += len;
  return lo + len == hi;
}

/* Rank k's inbox of parity p, where this operation's payload lies (its offset in a batch). */
static inline char* inbox_of(const struct task* t, int k, int p) { return seg_inbox(&t->comm->seg, k, p) + t->ioff; }

/* After everyone arrived at the step: read what this rank needs from the others. */
static void consume(struct task* t, int p) {
  struct ncclComm* c = t->comm;
  int me = c->rank, n = c->nranks;
  size_t es = dt_size(t->dtype), base, len;
  if (t->algo == ALGO_WINDOW) return; /* the steps after 0 only wait */
  step_range(t, &base, &len);
  const void* srcs[n];
  switch (t->kind) {
    case TK_ALLREDUCE:
    case TK_REDUCE:
      if (t->algo == ALGO_TWOPHASE) copy_out(t, p ^ 1);
      if (t->algo == ALGO_TWOPHASE) return;
      if (t->kind == TK_REDUCE && me != t->root) return;
      for (int k = 0; k < n; k++) srcs[k] = inbox_of(t, k, p);
      dt_reduce(&t->rop, at(t->recvbuff, base, es), NULL, srcs, n, -1, len);
      return;
    case TK_BROADCAST:
      if (me != t->root) ph_copy(at(t->recvbuff, base, es), inbox_of(t, t->root, p), len * es);
      return;
    case TK_ALLGATHER:
      for (int k = 0; k < n; k++) {
        char* dst = at(t->recvbuff, (size_t)k * t->count + base, es);
        const char* src = k == me ? at(t->sendbuff, base, es) : inbox_of(t, k, p);
        if (dst != src) ph_copy(dst, src, len * es);
      }
      return;
    case TK_GATHER:
      if (me == t->root)
        for (int k = 0; k < n; k++)
          if (k != me) ph_copy(at(t->recvbuff, (size_t)k * t->count + base, es), inbox_of(t, k, p), len * es);
      return;
    case TK_REDUCESCATTER:
      for (int k = 0; k < n; k++)
        srcs[k] = k == me ? at(t->sendbuff, (size_t)me * t->count + base, es) : at(inbox_of(t, k, p), (size_t)me * t->piece, es);
      dt_reduce(&t->rop, at(t->recvbuff, base, es), NULL, srcs, n, me, len);
      return;
    case TK_ALLTOALL:
      for (int k = 0; k < n; k++)
        if (k != me) ph_copy(at(t->recvbuff, (size_t)k * t->count + base, es), at(inbox_of(t, k, p), (size_t)me * t->piece, es), len * es);
      return;
    case TK_SCATTER:
      if (me != t->root) ph_copy(at(t->recvbuff, base, es), at(inbox_of(t, t->root, p), (size_t)me * t->piece, es), len * es);
      return;
  }
}

/* Whether rank k's part of t, which t waits for, is there: its message (the eager lane) or its arrival (a step). */
static bool part_there(const struct task* t, int k) { return t->algo == ALGO_EAGER ? eager_sent(t, k) : arrived(t, k); }

ncclResult_t coll_check_waited(struct task* t, bool check_process, char* text, size_t len) {
  bool eager = t->algo == ALGO_EAGER; /* a receiver waits for every sender's message, a sender for one slot */
  if (eager ? eager_sends(t) : t->phase != PH_ARRIVE) return ncclSuccess;
  struct ncclComm* c = t->comm;
  for (int k = t->wait_idx + 1; k < c->nranks; k++) { /* the ranks before wait_idx have arrived (sent) */
    if (k == c->rank || (eager && !eager_peer(t, k)) || part_there(t, k)) continue;
    if (UNLIKELY(fp_hit("host.coll.check_waited"))) {
      snprintf(text, len, "failpoint host.coll.check_waited");
      return ncclSystemError;
    }
    ncclResult_t err = comm_check_peer(c, k, check_process, text, len);
    /* a peer that did its part right before it left (finished, finalized) is no failure of this operation */
    if (err != ncclSuccess && !part_there(t, k)) return err;
  }
  if (eager) return ncclSuccess;
  /* a peer that arrived at this step and then aborted before completing it (Ctrl-C there): the step cannot
   * complete, and the ranks waiting for another, late peer would otherwise learn it only once that one arrived --
   * at their timeout, where it never does. A revoke is left to each rank's own (NCCL's: every rank revokes) */
  int k = left_before(c, t->step0 + t->step, false);
  return k < 0 ? ncclSuccess : comm_check_peer(c, k, false, text, len);
}

int coll_progress(struct task* t) {
  struct ncclComm* c = t->comm;
  struct seg* s = &c->seg;
  int me = c->rank, n = c->nranks;
  bool moved = false;
  if (!t->started) {
    coll_start(t);
    moved = true;
  }
  if (t->algo == ALGO_LOCAL) {
    run_local(t);
    return PROG_DONE;
  }
  if (t->algo == ALGO_EAGER) return eager_sends(t) ? eager_send(t, moved) : eager_receive(t, moved);
  for (;;) {
    uint64_t S = t->step0 + t->step;
    int p = (int)(S & 1);
    switch (t->phase) {
      case PH_FILL:
        if (UNLIKELY(fp_hit("host.coll.before_fill")))
          return task_fail(t, ncclSystemError, "%s : failpoint host.coll.before_fill", task_kind_name(t->kind));
        fill(t, p);
        if (t->batch_key) {
          struct task* u = t->lane_next;
          for (uint32_t j = 1; j < t->batch_n; j++, u = u->lane_next) fill(u, p);
        }
        if (t->algo == ALGO_TWOPHASE && t->step > 0) {
          reduce_prev(t, p ^ 1);
          if (UNLIKELY(fp_hit("host.coll.after_consume")))
            return task_fail(t, ncclSystemError, "%s : failpoint host.coll.after_consume", task_kind_name(t->kind));
        }
        write_desc(t, p);
        __atomic_store_n(&s->ctrl[me].arrive, S + 1, __ATOMIC_RELEASE);
        seg_ring(s);
        t->phase = PH_ARRIVE;
        t->wait_idx = 0;
        t->polls = 0;
        moved = true;
        /* fall through */
      case PH_ARRIVE:
        for (; t->wait_idx < n; t->wait_idx++) {
          int k = t->wait_idx;
          if (k == me) continue;
          if (__atomic_load_n(&s->ctrl[k].arrive, __ATOMIC_ACQUIRE) < S + 1) {
            t->wait_peer = k;
            /* the peer's collective is read once a wait has lasted a few polls: a wait that ends sooner leaves
             * the line the peer writes as it starts its next collective alone (two ranks: 20-40 ns of an 8-byte
             * AllReduce) */
            if (t->polls < ARRIVE_QUIET_POLLS) t->polls++;
            else if (peer_diverged(t, k, arrived)) return PROG_DONE;
            return moved ? PROG_MOVED : PROG_BLOCKED;
          }
          if (!desc_ok(t, k, p)) return PROG_DONE;
        }
        if (UNLIKELY(fp_hit("host.coll.after_arrive")))
          return task_fail(t, ncclSystemError, "%s : failpoint host.coll.after_arrive", task_kind_name(t->kind));
        t->phase = PH_CONSUME;
        /* fall through */
      case PH_CONSUME:
        if (UNLIKELY(peer_left(t, S))) return PROG_DONE;
        if (t->step != 0 || !windows_agreed(t, p)) {
          consume(t, p);
          if (t->batch_key) end_batch(t, p);
          break;
        }
        t->algo = ALGO_WINDOW;
        t->phase = PH_WINDOW;
        t->off = 0;
        /* fall through */
      case PH_WINDOW: {
        if (!window_piece_begin(t)) return PROG_DONE;
        bool done = t->kind == TK_ALLREDUCE || t->kind == TK_REDUCE ? reduce_windows(t, p) : gather_windows(t, p);
        window_piece_end(t);
        if (!done) return PROG_MOVED;
        if (UNLIKELY(fp_hit("host.coll.window")))
          return task_fail(t, ncclSystemError, "%s : failpoint host.coll.window", task_kind_name(t->kind));
        break;
      }
    }
    moved = true;
    /* Over windows, the ranks skip the steps in between: the next one is the last step of odd index
     * (a descriptor slot no peer can still be reading: its parity was last used before step 0), then,
     * where that is not the operation's last, the last one. */
    if (t->algo == ALGO_WINDOW && t->step == 0) t->step = (t->nsteps - 1) % 2 ? t->nsteps - 2 : t->nsteps - 3;
    if (++t->step == t->nsteps) {
      /* its part is done (the data moved): a peer still reading the last step takes it, whatever befalls this
       * rank now (the failpoint: a failure after the data moved, which the others' completions do not undo) */
      __atomic_store_n(&c->steps_done, t->step0 + t->nsteps, __ATOMIC_RELEASE);
      if (UNLIKELY(fp_hit("host.coll.done")))
        return task_fail(t, ncclSystemError, "%s : failpoint host.coll.done", task_kind_name(t->kind));
      if (t->timed_store) store_trial_done(t, out_bytes(t));
      return PROG_DONE;
    }
    t->phase = PH_FILL;
  }
}
