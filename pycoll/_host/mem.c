/* Buffer registrations (ncclCommRegister): a per-communicator table, so that deregistering checks
 * the handle (the host library copies through shared memory either way). ncclMemAlloc is in
 * symmem.c, windows in window.c. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <stdlib.h>

#include "comm.h"
#include "debug.h"
#include "handles.h"

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
