/* Memory: ncclMemAlloc/ncclMemFree hand out page-aligned host memory; buffer registrations and
 * windows are bookkeeping (the host library copies through shared memory either way). */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <stdlib.h>

#include "comm.h"
#include "debug.h"
#include "handles.h"

#define WINDOW_MAGIC 0x77696e646f776c76ull

struct ncclWindow_vidmem {
  uint64_t magic;
  struct ncclComm* comm; /* compared, never dereferenced */
  void* buff;
  size_t size;
  int flags;
};

NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) {
    WARN("ncclMemAlloc : ptr argument is NULL");
    return ncclInvalidArgument;
  }
  *ptr = NULL;
  if (size == 0) return ncclSuccess;
  void* p = NULL;
  if (posix_memalign(&p, 4096, size) != 0) {
    WARN("ncclMemAlloc : cannot allocate %zu bytes", size);
    return ncclSystemError;
  }
  handle_add(p, H_MEM, size);
  *ptr = p;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  if (!ptr) return ncclSuccess;
  if (!handle_remove(ptr, H_MEM, NULL)) {
    WARN("ncclMemFree : %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
    return ncclInvalidArgument;
  }
  free(ptr);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommRegister", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommRegister")) != ncclSuccess) goto out;
  if (!handle || (!buff && size)) {
    CWARN(c, "ncclCommRegister : %s argument is NULL", !handle ? "handle" : "buff");
    r = ncclInvalidArgument;
    goto out;
  }
  struct reg_entry* e = calloc(1, sizeof *e);
  if (!e) {
    r = ncclSystemError;
    goto out;
  }
  e->buff = buff;
  e->size = size;
  pthread_mutex_lock(&c->mu);
  e->next = c->regs;
  c->regs = e;
  pthread_mutex_unlock(&c->mu);
  *handle = e;
out:
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommDeregister", &c);
  if (r != ncclSuccess) return r;
  pthread_mutex_lock(&c->mu);
  struct reg_entry** pp = &c->regs;
  while (*pp && *pp != handle) pp = &(*pp)->next;
  struct reg_entry* e = *pp;
  if (e) *pp = e->next;
  pthread_mutex_unlock(&c->mu);
  if (!e) {
    CWARN(c, "ncclCommDeregister : handle %p is not registered with this communicator", handle);
    r = ncclInvalidArgument;
  }
  free(e);
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                             int winFlags) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommWindowRegister", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclCommWindowRegister")) != ncclSuccess) goto out;
  if (!win || (!buff && size)) {
    CWARN(c, "ncclCommWindowRegister : %s argument is NULL", !win ? "win" : "buff");
    r = ncclInvalidArgument;
    goto out;
  }
  if (winFlags & ~0x0f) {
    CWARN(c, "ncclCommWindowRegister : invalid winFlags 0x%x", winFlags);
    r = ncclInvalidArgument;
    goto out;
  }
  struct ncclWindow_vidmem* w = calloc(1, sizeof *w);
  if (!w) {
    r = ncclSystemError;
    goto out;
  }
  w->magic = WINDOW_MAGIC;
  w->comm = c;
  w->buff = buff;
  w->size = size;
  w->flags = winFlags;
  handle_add(w, H_WINDOW, 0);
  *win = w;
out:
  comm_release(c);
  return r;
}

static ncclResult_t window_of(struct ncclComm* c, ncclWindow_t win, const char* opname) {
  if (!win || !handle_valid(win, H_WINDOW) || win->comm != c) {
    CWARN(c, "%s : window %p is not registered with this communicator", opname, (void*)win);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommWindowDeregister", &c);
  if (r != ncclSuccess) return r;
  if ((r = window_of(c, win, "ncclCommWindowDeregister")) == ncclSuccess) {
    if (handle_remove(win, H_WINDOW, NULL)) {
      win->magic = 0;
      quarantine_free(win);
    }
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
  } else if ((r = window_of(c, win, "ncclWinGetUserPtr")) == ncclSuccess) {
    *outUserPtr = win->buff;
  }
  comm_release(c);
  return r;
}
