#include "bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "debug.h"
#include "enqueue.h"
#include "env.h"

/* ---- layout ---- */

void seg_layout(int n, struct seg_layout* L) {
  size_t off = SEG_HEADER_BYTES;
  L->ctrl_off = off;
  off += ALIGN_UP((size_t)n * sizeof(struct rank_ctrl), 4096);
  L->chan_off = off;
  off += ALIGN_UP((size_t)n * n * sizeof(struct chan_ctrl), 4096);
  size_t inbox = n <= 8 ? (1u << 20) : MAX((size_t)64 << 10, ALIGN_UP(((size_t)8 << 20) / n, 4096));
  L->inbox_bytes = inbox;
  L->inbox_off = off;
  off += (size_t)n * 2 * inbox;
  L->outbuf_off = off;
  off += 2 * inbox;
  L->slot_bytes = n <= 8 ? (64u << 10) : (16u << 10);
  L->nslots = 4;
  L->p2p_off = off;
  off += (size_t)n * n * L->nslots * L->slot_bytes;
  L->sig_off = off;
  off += ALIGN_UP((size_t)n * n * SIG_SLOTS * SIG_CTXS * sizeof(struct sig_ctr), 4096);
  L->echan_off = off;
  off += ALIGN_UP((size_t)n * n * sizeof(struct chan_ctrl), 4096);
  L->eager_off = off;
  off += (size_t)n * n * EAGER_SLOTS * EAGER_SLOT_BYTES;
  L->total = off;
}

void seg_view(struct seg* s, void* base, size_t size) {
  struct seg_header* h = base;
  s->base = base;
  s->size = size;
  shm_note_mapped(base, size, true);
  s->hdr = h;
  s->nranks = h->nranks;
  s->ctrl = (struct rank_ctrl*)((char*)base + h->ctrl_off);
  s->chan = (struct chan_ctrl*)((char*)base + h->chan_off);
  s->inbox = (char*)base + h->inbox_off;
  s->outbuf = (char*)base + h->outbuf_off;
  s->p2p = (char*)base + h->p2p_off;
  s->sig = (struct sig_ctr*)((char*)base + h->sig_off);
  s->echan = (struct chan_ctrl*)((char*)base + h->echan_off);
  s->eager = (char*)base + h->eager_off;
  s->inbox_bytes = h->inbox_bytes;
  s->slot_bytes = h->slot_bytes;
  s->nslots = (int)h->nslots;
}

void seg_unmap(struct seg* s) {
  if (s->base) {
    shm_note_mapped(s->base, s->size, false);
    munmap(s->base, s->size);
  }
  memset(s, 0, sizeof *s);
}

void seg_name_of(char out[64], const uint64_t nonce[2]) {
  snprintf(out, 64, "/%s-%016llx%016llx", shm_prefix(), (unsigned long long)nonce[0], (unsigned long long)nonce[1]);
}

int seg_creator_of(const void* base, size_t size, struct proc_id* creator) {
  const struct seg_header* h = base;
  if (size < sizeof *h || h->magic != SEG_MAGIC) return -1;
  *creator = h->creator;
  /* a rendezvous poisoned by misuse stays visible for a while to ranks still on their way */
  uint64_t failed_at = __atomic_load_n(&h->failed_at, __ATOMIC_ACQUIRE);
  if (failed_at && __atomic_load_n(&h->arrived, __ATOMIC_ACQUIRE) < (uint32_t)h->nranks &&
      now_ns() - failed_at < 10000000000ull)
    return 1;
  return 0;
}

/* ---- unique ids ---- */

ncclResult_t uid_make(ncclUniqueId* out, int kind, const uint64_t nonce[2], int parent_nranks,
                      uint64_t child_count) {
  struct host_uid u;
  memset(&u, 0, sizeof u);
  u.magic = UID_MAGIC;
  u.version = UID_VERSION;
  u.kind = (uint16_t)kind;
  host_boot_id(u.boot_id);
  if (nonce) {
    u.nonce[0] = nonce[0];
    u.nonce[1] = nonce[1];
  } else if (random_bytes(u.nonce, sizeof u.nonce) != 0) {
    WARN("ncclGetUniqueId: getrandom failed: %s", strerror(errno));
    return ncclSystemError;
  }
  u.creator_pid = (int32_t)getpid();
  u.parent_nranks = parent_nranks;
  u.child_count = child_count;
  snprintf(u.host, sizeof u.host, "%s", host_name());
  snprintf(u.shm_tag, sizeof u.shm_tag, "%s", shm_tag());
  memset(out, 0, sizeof *out);
  memcpy(out, &u, sizeof u);
  return ncclSuccess;
}

static void hex16(char* out, const uint8_t b[16]) {
  for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

ncclResult_t uid_parse(const ncclUniqueId* id, struct host_uid* u, const char* opname, struct ncclComm* comm) {
  memcpy(u, id, sizeof *u);
  if (u->magic != UID_MAGIC) {
    CWARN(comm, "%s : the unique id was not created by pycoll's host library (bad magic 0x%08x)", opname, u->magic);
    return ncclInvalidArgument;
  }
  if (u->version != UID_VERSION) {
    CWARN(comm, "%s : unique id version %d is not supported by this host library (version %d)", opname,
          u->version, UID_VERSION);
    return ncclInvalidUsage;
  }
  uint8_t boot[16];
  host_boot_id(boot);
  if (memcmp(boot, u->boot_id, 16) != 0) {
    char a[33], b[33];
    hex16(a, u->boot_id);
    hex16(b, boot);
    u->host[sizeof u->host - 1] = 0;
    CWARN(comm,
          "%s : the unique id was created on another host (%s, boot_id %s) than this process runs on (%s, "
          "boot_id %s); the host library connects processes of one machine only",
          opname, u->host, a, host_name(), b);
    return ncclInvalidUsage;
  }
  u->shm_tag[sizeof u->shm_tag - 1] = 0;
  if (strcmp(u->shm_tag, shm_tag()) != 0) {
    CWARN(comm,
          "%s : the unique id was created by a process with PYCOLL_HOST_SHM_TAG=%s, this one has %s%s: the processes "
          "of a communicator must have the same (their segments are named by it)",
          opname, *u->shm_tag ? u->shm_tag : "(unset)", *shm_tag() ? "PYCOLL_HOST_SHM_TAG=" : "it ",
          *shm_tag() ? shm_tag() : "unset");
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

uint64_t new_claim_token(void) {
  static uint32_t counter;
  uint32_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  return ((uint64_t)(uint32_t)getpid() << 32) | c;
}

bool rendezvous_timeout_ns(uint64_t* out) {
  double s;
  bool ok = env_seconds("PYCOLL_HOST_INIT_TIMEOUT", 0.0, ENV_INIT_TIMEOUT_MAX, 300.0, &s);
  *out = s <= 0 ? 0 : s * 1e9 < 1 ? 1 : (uint64_t)(s * 1e9); /* 0 is "no deadline": a positive one stays one */
  return ok;
}

/* ---- rendezvous ---- */

struct init_arg {
  const struct rendezvous* r;
  const struct seg_layout* L;
};

static void init_header(void* base, void* arg_) {
  struct init_arg* a = arg_;
  struct seg_header* h = base;
  const struct seg_layout* L = a->L;
  h->layout_version = SEG_LAYOUT_VERSION;
  h->nranks = a->r->nranks;
  h->total_size = L->total;
  host_boot_id(h->boot_id);
  h->nonce[0] = a->r->nonce[0];
  h->nonce[1] = a->r->nonce[1];
  proc_self(&h->creator);
  h->ids_hash = a->r->ids_hash;
  h->kind = a->r->kind;
  h->ctrl_off = L->ctrl_off;
  h->chan_off = L->chan_off;
  h->inbox_off = L->inbox_off;
  h->outbuf_off = L->outbuf_off;
  h->p2p_off = L->p2p_off;
  h->sig_off = L->sig_off;
  h->echan_off = L->echan_off;
  h->eager_off = L->eager_off;
  h->inbox_bytes = L->inbox_bytes;
  h->slot_bytes = L->slot_bytes;
  h->nslots = (uint32_t)L->nslots;
  coll_plan(h->plan);
  struct rank_ctrl* ctrl = (struct rank_ctrl*)((char*)base + L->ctrl_off);
  for (int i = 0; i < a->r->nranks; i++) {
    ctrl[i].cpu = -1;                /* not waited anywhere yet (0 is a CPU) */
    ctrl[i].cur.op_seq = UINT64_MAX; /* in no collective yet */
  }
  h->magic = SEG_MAGIC; /* the segment only becomes visible (linked) after this */
}

/* First error wins; everyone waiting on the rendezvous reports it. A misuse leaves the poisoned
 * segment in place until every rank has arrived, so late ranks fail at once instead of waiting
 * in a fresh segment; a rank that gives up (timeout, abort, a dead member) removes it. */
static void poison(struct seg* s, int code, const char* text, bool give_up) {
  struct seg_header* h = s->hdr;
  if (__atomic_exchange_n(&h->fail_claim, 1, __ATOMIC_ACQ_REL) == 0) {
    snprintf(h->fail_text, sizeof h->fail_text, "%s", text);
    __atomic_store_n(&h->failed_at, now_ns(), __ATOMIC_RELEASE);
    __atomic_store_n(&h->failed, code, __ATOMIC_RELEASE);
  }
  if (give_up && __atomic_load_n(&h->joined, __ATOMIC_ACQUIRE) < (uint32_t)h->nranks) shm_unlink_name(s->name);
  doorbell_wake(&h->bell);
}

static bool aborted(const struct rendezvous* r) {
  for (int i = 0; i < r->nabort; i++)
    if (r->abort_flags[i] && __atomic_load_n(r->abort_flags[i], __ATOMIC_ACQUIRE)) return true;
  return false;
}

static ncclResult_t fail_with(const struct rendezvous* r, struct seg* s, int code, const char* text, bool give_up) {
  if (s->base) {
    poison(s, code, text, give_up);
    int first = __atomic_load_n(&s->hdr->failed, __ATOMIC_ACQUIRE);
    if (first && first != code) {
      code = first;
      text = s->hdr->fail_text;
    }
  }
  CWARN(r->comm, "%s", text);
  if (s->base) seg_unmap(s);
  return (ncclResult_t)code;
}

static bool rendezvous_blocked(void* arg) {
  struct seg* s = arg;
  return __atomic_load_n(&s->hdr->joined, __ATOMIC_ACQUIRE) < (uint32_t)s->nranks &&
         !__atomic_load_n(&s->hdr->failed, __ATOMIC_ACQUIRE);
}

ncclResult_t rendezvous_join(const struct rendezvous* r, struct seg* out) {
  struct seg s;
  memset(&s, 0, sizeof s);
  seg_name_of(s.name, r->nonce);
  struct seg_layout L;
  seg_layout(r->nranks, &L);
  char text[512];
  uint64_t start = now_ns();
  /* this rendezvous's segment, made by a process that is gone: a rank died inside it, and the init cannot complete
   * (the sweep would remove the segment, and this rank wait in a new one for that rank until its timeout) */
  struct proc_id creator;
  if (shm_creator_of(s.name, &creator) == 0 && proc_alive(&creator) == 0) {
    snprintf(text, sizeof text, "%s : the process (pid %d) that began this communicator's rendezvous exited before "
             "the communicator was initialized", r->opname, (int)creator.pid);
    shm_sweep();
    return fail_with(r, &s, ncclRemoteError, text, false);
  }
  shm_sweep();

  /* open the segment, creating it if we are first */
  int enospc_tries = 0;
  for (int attempt = 0;; attempt++) {
    if (aborted(r)) {
      snprintf(text, sizeof text, "%s : rank %d aborted while joining", r->opname, r->rank);
      return fail_with(r, &s, ncclInvalidUsage, text, true);
    }
    void* base = NULL;
    size_t size = 0;
    int err = shm_open_map(s.name, &base, &size);
    if (err == ENOENT) {
      err = shm_create_map(s.name, L.total, init_header, &(struct init_arg){r, &L}, &base);
      if (err == EEXIST) continue;
      size = L.total;
    }
    /* ranks racing to create it each reserve its pages in a file of their own before one of them links it: with
     * room for one segment and not for two, every one of them failed. Again after a pause of its own (1-20 ms, apart
     * from the others'): the winner's segment, or a creation that no other reservation holds up any more */
    if (err == ENOSPC && enospc_tries++ < 8) {
      struct timespec pause = {0, (long)(1 + (now_ns() ^ (uint64_t)getpid() * 7919u) % 20) * 1000 * 1000};
      nanosleep(&pause, NULL);
      continue;
    }
    if (err == ENOSPC) {
      struct statvfs fs;
      double mib = 1024.0 * 1024.0;
      double free_mib = statvfs(SHM_DIR, &fs) == 0 ? (double)fs.f_bavail * fs.f_frsize / mib : -1;
      double promised_mib = (double)shm_unbacked_bytes() / mib;
      char promised[160] = "";
      if (promised_mib >= 0.1)
        snprintf(promised, sizeof promised, ", of which %.1f MiB this process's other communicators will take as "
                 "they touch their segments", promised_mib);
      snprintf(text, sizeof text,
               "%s : not enough shared memory in %s for the communicator's segment: %d ranks need %.1f MiB, %.1f MiB "
               "are free%s (a container's /dev/shm is often 64 MiB: give it more, e.g. docker run --shm-size=1g)",
               r->opname, SHM_DIR, r->nranks, (double)L.total / mib, free_mib, promised);
      CWARN(r->comm, "%s", text);
      return ncclSystemError;
    }
    if (err != 0) {
      snprintf(text, sizeof text, "%s : cannot create or map shared memory %s%s: %s", r->opname, SHM_DIR, s.name,
               strerror(err));
      CWARN(r->comm, "%s", text);
      return ncclSystemError;
    }
    struct seg_header* h = base;
    if (size < SEG_HEADER_BYTES || h->magic != SEG_MAGIC || h->layout_version != SEG_LAYOUT_VERSION ||
        h->total_size != size) {
      /* magic and layout_version keep their place in every layout: say what was found (another build of the library,
       * or something else under that name) */
      if (size < SEG_HEADER_BYTES || h->magic != SEG_MAGIC)
        snprintf(text, sizeof text, "%s : %s%s is not a pycoll host segment (%zu bytes, no segment header)",
                 r->opname, SHM_DIR, s.name, (size_t)size);
      else if (h->layout_version != SEG_LAYOUT_VERSION)
        snprintf(text, sizeof text,
                 "%s : %s%s was made by a host library of segment layout %u, this one is of layout %u: the ranks "
                 "of a job must load the same pycoll build",
                 r->opname, SHM_DIR, s.name, h->layout_version, SEG_LAYOUT_VERSION);
      else
        snprintf(text, sizeof text, "%s : %s%s is %zu bytes but its header says %llu", r->opname, SHM_DIR,
                 s.name, (size_t)size, (unsigned long long)h->total_size);
      munmap(base, size);
      CWARN(r->comm, "%s", text);
      return ncclInvalidUsage;
    }
    seg_view(&s, base, size);
    break;
  }

  struct seg_header* h = s.hdr;
  if (__atomic_add_fetch(&h->arrived, 1, __ATOMIC_ACQ_REL) >= (uint32_t)h->nranks)
    shm_unlink_name(s.name); /* everybody who can come has come */
  if (__atomic_load_n(&h->failed, __ATOMIC_ACQUIRE)) {
    snprintf(text, sizeof text, "%s", h->fail_text);
    return fail_with(r, &s, h->failed, text, false);
  }
  if (h->nranks != r->nranks) {
    snprintf(text, sizeof text,
             "%s : mismatched nranks: rank %d passed nranks=%d but the communicator was created with nranks=%d "
             "(by pid %d)",
             r->opname, r->rank, r->nranks, h->nranks, h->creator.pid);
    return fail_with(r, &s, ncclInvalidUsage, text, false);
  }
  if (h->kind != r->kind || h->ids_hash != r->ids_hash) {
    snprintf(text, sizeof text,
             "%s : rank %d joined with a different set of unique ids or a different kind of initialization than "
             "the rank that created the communicator (pid %d)",
             r->opname, r->rank, h->creator.pid);
    return fail_with(r, &s, ncclInvalidUsage, text, false);
  }
  uint64_t plan[SEG_PLAN_N];
  coll_plan(plan);
  for (int i = 0; i < SEG_PLAN_N; i++)
    if (plan[i] != h->plan[i]) {
      snprintf(text, sizeof text,
               "%s : %s is %llu in rank %d (pid %d) but %llu in the process that created the communicator (pid %d): "
               "the ranks plan each collective alike, so it must be the same in every rank's environment",
               r->opname, coll_plan_names[i], (unsigned long long)plan[i], r->rank, (int)getpid(),
               (unsigned long long)h->plan[i], h->creator.pid);
      return fail_with(r, &s, ncclInvalidUsage, text, false);
    }
  struct rank_ctrl* me = &s.ctrl[r->rank];
  uint64_t expected = 0;
  if (!__atomic_compare_exchange_n(&me->token, &expected, r->token, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    snprintf(text, sizeof text, "%s : rank %d is claimed by two processes or threads: pid %d and pid %d",
             r->opname, r->rank, (int)(expected >> 32), (int)(r->token >> 32));
    return fail_with(r, &s, ncclInvalidUsage, text, false);
  }
  proc_self(&me->proc);
  __atomic_store_n(&me->state, RS_JOINED, __ATOMIC_RELEASE);
  __atomic_add_fetch(&h->joined, 1, __ATOMIC_ACQ_REL);
  doorbell_wake(&h->bell);

  struct backoff b;
  backoff_reset(&b, r->nranks > host_ncpus());
  uint64_t last_live = 0;
  while (rendezvous_blocked(&s)) {
    if (aborted(r)) {
      snprintf(text, sizeof text, "%s : rank %d aborted while the other ranks were joining", r->opname, r->rank);
      return fail_with(r, &s, ncclRemoteError, text, true);
    }
    uint64_t t = now_ns();
    if (r->timeout_ns && t - start > r->timeout_ns) {
      int n = snprintf(text, sizeof text, "%s : timed out after %g s waiting for ranks", r->opname,
                       (double)r->timeout_ns / 1e9);
      for (int k = 0; k < r->nranks && n < (int)sizeof text - 16; k++)
        if (!__atomic_load_n(&s.ctrl[k].token, __ATOMIC_ACQUIRE)) n += snprintf(text + n, sizeof text - n, " %d", k);
      snprintf(text + n, sizeof text - n, " to join (PYCOLL_HOST_INIT_TIMEOUT)");
      return fail_with(r, &s, ncclTimeout, text, true); /* a timeout, not a remote process gone (ncclRemoteError) */
    }
    if (t - last_live > 10000000ull) { /* every 10 ms: did a member die? */
      last_live = t;
      for (int k = 0; k < r->nranks; k++) {
        struct proc_id p = {0};
        if (__atomic_load_n(&s.ctrl[k].state, __ATOMIC_ACQUIRE) >= RS_JOINED) p = s.ctrl[k].proc;
        else if (r->expected && r->expected[k].pid) p = r->expected[k];
        else continue;
        if (proc_alive(&p) == 0) {
          snprintf(text, sizeof text, "%s : rank %d (pid %d) exited before the communicator was initialized",
                   r->opname, k, p.pid);
          return fail_with(r, &s, ncclRemoteError, text, true);
        }
      }
    }
    if (backoff_step(&b) == WAIT_SLEEP) doorbell_sleep(&h->bell, backoff_sleep_ns(&b), rendezvous_blocked, &s);
  }
  if (__atomic_load_n(&h->failed, __ATOMIC_ACQUIRE)) {
    snprintf(text, sizeof text, "%s", h->fail_text);
    return fail_with(r, &s, h->failed, text, false);
  }
  *out = s;
  return ncclSuccess;
}
