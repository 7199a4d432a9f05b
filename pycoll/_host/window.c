/* Windows (ncclCommWindowRegister, collective). Every rank checks its buffer (it must lie in this
 * process's ncclMemAlloc memory), then the ranks exchange descriptors with an internal AllGather
 * through the communicator's segment; a descriptor that fails a check on any rank, or sizes or
 * flags that differ, fail the registration on every rank with the same ncclInvalidArgument text,
 * and the communicator stays usable. Each rank then maps every peer's allocation through
 * /proc/<pid>/fd/<fd>, and a second exchange tells everyone whether all mappings succeeded. On a
 * nonblocking communicator the exchange runs as a background job (ncclInProgress, like init);
 * the window handle is valid at once and usable once the communicator is ready again.
 * Deregistration is local: a peer's mapping keeps the memory alive on its side. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "debug.h"
#include "enqueue.h"
#include "failpoint.h"
#include "group.h"
#include "handles.h"
#include "window.h"

#define WINDOW_MAGIC 0x77696e646f776c76ull
#define WIN_FLAGS_KNOWN 0x0f

static pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclWindow_vidmem* windows;

struct win_desc {
  int32_t code; /* ncclSuccess, or why this rank's buffer cannot be a window */
  int32_t pid;
  int32_t fd;
  int32_t flags;
  uint64_t size;
  uint64_t offset;
  uint64_t map_size;
  uint64_t nonce; /* this registration's, for the window's key */
  char why[80];
};
_Static_assert(sizeof(struct win_desc) == 128, "window descriptor is 128 bytes");

static void window_free(struct ncclWindow_vidmem* w) {
  for (int i = 0; w->peers && i < w->npeers; i++)
    if (w->peers[i].map) munmap(w->peers[i].map, w->peers[i].map_len);
  free(w->peers);
  w->magic = 0;
  quarantine_free(w);
}

void window_put(ncclWindow_t w) {
  if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) == 0) window_free(w);
}

/* Removes `w` from the handle table and the list; false if someone else did first. */
static bool window_unlink(struct ncclWindow_vidmem* w) {
  if (!handle_remove(w, H_WINDOW, NULL)) return false;
  pthread_mutex_lock(&wmu);
  struct ncclWindow_vidmem** pp = &windows;
  while (*pp && *pp != w) pp = &(*pp)->next;
  if (*pp) *pp = w->next;
  pthread_mutex_unlock(&wmu);
  return true;
}

void windows_comm_freed(struct ncclComm* c) {
  for (;;) {
    struct ncclWindow_vidmem* w = NULL;
    pthread_mutex_lock(&wmu);
    for (struct ncclWindow_vidmem* x = windows; x; x = x->next)
      if (x->comm == c) {
        w = x;
        break;
      }
    pthread_mutex_unlock(&wmu);
    if (!w) return;
    if (window_unlink(w)) window_put(w);
  }
}

/* A window of `c` (any state), or an error naming `opname`. Requires handle_lock. */
static ncclResult_t window_check_locked(struct ncclComm* c, ncclWindow_t win, const char* opname) {
  if (!win || !handle_valid_locked(win, H_WINDOW) || win->magic != WINDOW_MAGIC || (c && win->comm != c)) {
    if (c) CWARN(c, "%s : window %p is not registered with this communicator", opname, (void*)win);
    else WARN("%s : window %p is not a registered window (deregistered, or never registered)", opname, (void*)win);
    return ncclInvalidArgument;
  }
  int st = __atomic_load_n(&win->state, __ATOMIC_ACQUIRE);
  if (st == WIN_PENDING) {
    if (c) CWARN(c, "%s : window %p is still being registered (wait until the communicator is ready)", opname,
                 (void*)win);
    else WARN("%s : window %p is still being registered", opname, (void*)win);
    return ncclInvalidArgument;
  }
  if (st == WIN_FAILED) {
    if (c) CWARN(c, "%s : window %p failed to register: %s", opname, (void*)win, win->fail_text);
    else WARN("%s : window %p failed to register: %s", opname, (void*)win, win->fail_text);
    return (ncclResult_t)win->fail_code;
  }
  return ncclSuccess;
}

ncclResult_t window_get(struct ncclComm* c, ncclWindow_t win, const char* opname) {
  handle_lock();
  ncclResult_t r = window_check_locked(c, win, opname);
  if (r == ncclSuccess) __atomic_add_fetch(&win->refs, 1, __ATOMIC_ACQ_REL);
  handle_unlock();
  return r;
}

struct ncclWindow_vidmem* window_holding(struct ncclComm* c, const void* p, size_t len, size_t* off) {
  const char* b = p;
  struct ncclWindow_vidmem* found = NULL;
  pthread_mutex_lock(&wmu);
  for (struct ncclWindow_vidmem* w = windows; w && !found; w = w->next) {
    const char* wb = w->buff;
    if (w->comm == c && __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == WIN_READY && !w->memory_freed && b >= wb &&
        b < wb + w->size && len <= (size_t)(wb + w->size - b)) {
      __atomic_add_fetch(&w->refs, 1, __ATOMIC_ACQ_REL);
      *off = (size_t)(b - wb);
      found = w;
    }
  }
  pthread_mutex_unlock(&wmu);
  return found;
}

void windows_memory_freed(const void* base, size_t len) {
  const char* b = base;
  pthread_mutex_lock(&wmu);
  for (struct ncclWindow_vidmem* w = windows; w; w = w->next)
    if ((const char*)w->buff < b + len && b < (const char*)w->buff + w->size) w->memory_freed = true;
  pthread_mutex_unlock(&wmu);
}

/* ---- the collective part ---- */

static ncclResult_t exchange(struct ncclComm* c, const void* mine, void* all, size_t bytes) {
  struct task t = {.kind = TK_ALLGATHER, .opname = "ncclCommWindowRegister", .comm = c, .sendbuff = mine,
                   .recvbuff = all, .count = bytes, .dtype = ncclUint8, .op = ncclSum, .root = WINDOW_EXCHANGE_ROOT};
  t.rop.kind = RK_SUM;
  t.rop.dtype = ncclUint8;
  return run_tasks(&t);
}

static void local_desc(const struct ncclWindow_vidmem* w, struct win_desc* d) {
  struct proc_id me;
  proc_self(&me);
  memset(d, 0, sizeof *d);
  d->pid = me.pid;
  d->fd = -1;
  d->flags = w->flags;
  d->size = w->size;
  static uint64_t count;
  d->nonce = mix64(now_ns() ^ ((uint64_t)(uint32_t)me.pid << 32) ^ mix64(__atomic_add_fetch(&count, 1, __ATOMIC_RELAXED)));
  struct symmem_ref ref;
  if (!symmem_find(w->buff, w->size, &ref)) {
    d->code = ncclInvalidArgument;
    snprintf(d->why, sizeof d->why, "%zu bytes at %p are not ncclMemAlloc memory", w->size, w->buff);
    return;
  }
  d->fd = ref.fd;
  d->offset = ref.offset;
  d->map_size = ref.size;
}

static void fail_window(struct ncclWindow_vidmem* w, int code, const char* text) {
  w->fail_code = code;
  snprintf(w->fail_text, sizeof w->fail_text, "%s", text);
  __atomic_store_n(&w->state, WIN_FAILED, __ATOMIC_RELEASE);
}

/* Checks the descriptors every rank published; the same verdict on every rank. */
static int check_descs(const struct win_desc* d, int n, char* text, size_t len) {
  for (int i = 0; i < n; i++)
    if (d[i].code != ncclSuccess) {
      snprintf(text, len,
               "ncclCommWindowRegister : rank %d: %.*s (the host library's windows must lie in memory from "
               "ncclMemAlloc, which peers can map)",
               i, (int)sizeof d[i].why, d[i].why);
      return d[i].code;
    }
  for (int i = 1; i < n; i++) {
    if (d[i].size != d[0].size) {
      snprintf(text, len,
               "ncclCommWindowRegister : window sizes differ: rank 0 registers %llu bytes, rank %d registers %llu "
               "bytes (every rank must register the same size)",
               (unsigned long long)d[0].size, i, (unsigned long long)d[i].size);
      return ncclInvalidArgument;
    }
    if (d[i].flags != d[0].flags) {
      snprintf(text, len, "ncclCommWindowRegister : window flags differ: rank 0 passes 0x%x, rank %d passes 0x%x", d[0].flags,
               i, d[i].flags);
      return ncclInvalidArgument;
    }
  }
  return ncclSuccess;
}

static int map_peer(struct win_peer* p, const struct win_desc* d, char* why, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", d->pid, d->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, len, "cannot open %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  void* m = mmap(NULL, d->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(why, len, "cannot map %llu bytes of pid %d: %s", (unsigned long long)d->map_size, d->pid, strerror(e));
    return ncclSystemError;
  }
  p->map = m;
  p->map_len = d->map_size;
  p->ptr = (char*)m + d->offset;
  return ncclSuccess;
}

ncclResult_t job_run_window(struct job* j) {
  struct ncclComm* c = j->comm;
  struct ncclWindow_vidmem* w = j->window;
  int n = c->nranks;
  char text[768];
  ncclResult_t r = comm_wait_pending(c, true);
  if (r != ncclSuccess) {
    fail_window(w, r, "the communicator failed before the window was registered");
    return r;
  }
  struct win_desc mine, *all = calloc((size_t)n, sizeof *all);
  int32_t* codes = calloc((size_t)n, sizeof *codes);
  w->peers = calloc((size_t)n, sizeof *w->peers);
  if (!all || !codes || !w->peers) {
    free(all);
    free(codes);
    fail_window(w, ncclSystemError, "out of memory");
    return ncclSystemError;
  }
  w->npeers = n;
  local_desc(w, &mine);
  if (UNLIKELY(fp_hit("host.window.exchange"))) {
    mine.code = ncclSystemError;
    snprintf(mine.why, sizeof mine.why, "failpoint host.window.exchange");
  }
  r = exchange(c, &mine, all, sizeof mine);
  if (r != ncclSuccess) {
    snprintf(text, sizeof text, "the descriptor exchange failed (%s)", ncclGetErrorString(r));
    fail_window(w, r, text);
    goto out;
  }
  int code = check_descs(all, n, text, sizeof text);
  if (code != ncclSuccess) {
    CWARN(c, "%s", text);
    fail_window(w, code, text);
    r = (ncclResult_t)code;
    goto out;
  }
  char why[256] = "";
  int32_t mapped = ncclSuccess;
  for (int i = 0; i < n && mapped == ncclSuccess; i++) {
    if (i == c->rank) w->peers[i].ptr = w->buff;
    else mapped = map_peer(&w->peers[i], &all[i], why, sizeof why);
  }
  r = exchange(c, &mapped, codes, sizeof mapped);
  if (r != ncclSuccess) {
    snprintf(text, sizeof text, "the mapping exchange failed (%s)", ncclGetErrorString(r));
    fail_window(w, r, text);
    goto out;
  }
  for (int i = 0; i < n; i++)
    if (codes[i] != ncclSuccess) {
      snprintf(text, sizeof text, "ncclCommWindowRegister : rank %d could not map its peers' windows%s%s", i,
               i == c->rank ? ": " : "", i == c->rank ? why : "");
      CWARN(c, "%s", text);
      fail_window(w, codes[i], text);
      r = (ncclResult_t)codes[i];
      goto out;
    }
  w->key = 0;
  for (int i = 0; i < n; i++) w->key = mix64(w->key ^ all[i].nonce);
  w->key |= 1;
  __atomic_store_n(&w->state, WIN_READY, __ATOMIC_RELEASE);
out:
  if (r != ncclSuccess) {
    for (int i = 0; i < n; i++)
      if (w->peers[i].map) munmap(w->peers[i].map, w->peers[i].map_len);
    memset(w->peers, 0, sizeof *w->peers * (size_t)n);
  }
  free(all);
  free(codes);
  return r;
}

void job_window_done(struct job* j) {
  if (j->window) window_put(j->window);
  j->window = NULL;
}

/* ---- entry points ---- */

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                             int winFlags) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommWindowRegister", &c);
  if (r != ncclSuccess) return group_note_error(r);
  if ((r = task_check_comm(c, "ncclCommWindowRegister")) != ncclSuccess) goto out;
  if (!win || !buff || !size) {
    CWARN(c, "ncclCommWindowRegister : %s", !win ? "win argument is NULL" : !buff ? "buff argument is NULL"
                                                                               : "size is 0");
    r = ncclInvalidArgument;
    goto out;
  }
  if (winFlags & ~WIN_FLAGS_KNOWN) {
    CWARN(c, "ncclCommWindowRegister : invalid winFlags 0x%x", winFlags);
    r = ncclInvalidArgument;
    goto out;
  }
  struct ncclWindow_vidmem* w = calloc(1, sizeof *w);
  struct job* j = calloc(1, sizeof *j);
  if (!w || !j) {
    free(w);
    free(j);
    r = ncclSystemError;
    goto out;
  }
  w->magic = WINDOW_MAGIC;
  w->comm = c;
  w->buff = buff;
  w->size = size;
  w->flags = winFlags;
  w->refs = 2; /* the registration and the job */
  handle_add(w, H_WINDOW, 0);
  pthread_mutex_lock(&wmu);
  w->next = windows;
  windows = w;
  pthread_mutex_unlock(&wmu);
  *win = w;
  comm_ref(c); /* the job's */
  j->kind = JOB_WINDOW;
  j->opname = "ncclCommWindowRegister";
  j->comm = c;
  j->window = w;
  bool blocking = c->config.blocking && group_depth() == 0;
  r = job_launch(j);
  if (blocking && r != ncclSuccess) { /* failed in this thread: no window */
    *win = NULL;
    if (window_unlink(w)) window_put(w);
  }
out:
  comm_release(c);
  return group_note_error(r);
}

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommWindowDeregister", &c);
  if (r != ncclSuccess) return r;
  handle_lock();
  bool ok = win && handle_valid_locked(win, H_WINDOW) && win->magic == WINDOW_MAGIC && win->comm == c;
  handle_unlock();
  if (!ok || !window_unlink(win)) {
    CWARN(c, "ncclCommWindowDeregister : window %p is not registered with this communicator", (void*)win);
    r = ncclInvalidArgument;
  } else {
    window_put(win);
  }
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclWinGetUserPtr", &c);
  if (r != ncclSuccess) return r;
  if (!outUserPtr) {
    CWARN(c, "ncclWinGetUserPtr : outUserPtr argument is NULL");
    r = ncclInvalidArgument;
  } else {
    handle_lock();
    r = window_check_locked(c, win, "ncclWinGetUserPtr");
    if (r == ncclSuccess) *outUserPtr = win->buff;
    handle_unlock();
  }
  comm_release(c);
  return r;
}

/* ---- host-side device pointers: every rank of a host communicator is in one LSA team ---- */

static ncclResult_t peer_pointer(ncclWindow_t window, size_t offset, int peer, void** outPtr, const char* opname) {
  if (!outPtr) {
    WARN("%s : outPtr argument is NULL", opname);
    return ncclInvalidArgument;
  }
  handle_lock();
  ncclResult_t r = window_check_locked(NULL, window, opname);
  if (r == ncclSuccess && (peer < 0 || peer >= window->npeers)) {
    WARN("%s : peer %d is out of range (0..%d)", opname, peer, window->npeers - 1);
    r = ncclInvalidArgument;
  } else if (r == ncclSuccess && offset >= window->size) {
    WARN("%s : offset %zu is beyond the window's %zu bytes", opname, offset, window->size);
    r = ncclInvalidArgument;
  }
  if (r == ncclSuccess) *outPtr = window->peers[peer].ptr + offset;
  handle_unlock();
  return r;
}

NCCL_API ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr) {
  return peer_pointer(window, offset, lsaRank, outPtr, "ncclGetLsaDevicePointer");
}

NCCL_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr) {
  return peer_pointer(window, offset, peer, outPtr, "ncclGetPeerDevicePointer");
}

/* The multimem and LE-info getters (not supported: no multicast memory, no CFT) are in devapi.c. */
