/* User-defined reductions: ncclRedOpCreatePreMulSum / ncclRedOpDestroy. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <stdlib.h>

#include "comm.h"
#include "debug.h"

NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclRedOpCreatePreMulSum", &c);
  if (r != ncclSuccess) return r;
  if ((r = comm_ensure_ready(c, "ncclRedOpCreatePreMulSum")) != ncclSuccess) goto out;
  if (!op || !scalar) {
    CWARN(c, "ncclRedOpCreatePreMulSum : %s argument is NULL", !op ? "op" : "scalar");
    r = ncclInvalidArgument;
    goto out;
  }
  if ((int)datatype < 0 || datatype >= ncclNumTypes) {
    CWARN(c, "ncclRedOpCreatePreMulSum : invalid type %d", (int)datatype);
    r = ncclInvalidArgument;
    goto out;
  }
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
    CWARN(c, "ncclRedOpCreatePreMulSum : invalid scalar residence %d", (int)residence);
    r = ncclInvalidArgument;
    goto out;
  }
  pthread_mutex_lock(&c->mu);
  int ix = 0;
  while (ix < c->nredops && c->redops[ix].used) ix++;
  if (ix == c->nredops) {
    int cap = c->nredops ? c->nredops * 2 : 4;
    struct user_redop* grown = realloc(c->redops, sizeof *grown * (size_t)cap);
    if (!grown) {
      pthread_mutex_unlock(&c->mu);
      r = ncclSystemError;
      goto out;
    }
    memset(grown + c->nredops, 0, sizeof *grown * (size_t)(cap - c->nredops));
    c->redops = grown;
    c->nredops = cap;
  }
  struct user_redop* u = &c->redops[ix];
  u->used = true;
  u->dtype = datatype;
  u->residence = residence;
  u->scalar = 0;
  u->scalar_p = scalar;
  if (residence == ncclScalarHostImmediate) memcpy(&u->scalar, scalar, dt_size(datatype));
  pthread_mutex_unlock(&c->mu);
  *op = (ncclRedOp_t)(ncclNumOps + ix);
out:
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclRedOpDestroy", &c);
  if (r != ncclSuccess) return r;
  if ((int)op < ncclNumOps) {
    CWARN(c, "ncclRedOpDestroy : operator is a builtin (%d)", (int)op);
    r = ncclInvalidArgument;
  } else {
    pthread_mutex_lock(&c->mu);
    int ix = (int)op - ncclNumOps;
    if (ix >= c->nredops || !c->redops[ix].used) {
      r = ncclInvalidArgument;
    } else {
      c->redops[ix].used = false;
    }
    pthread_mutex_unlock(&c->mu);
    if (r != ncclSuccess) CWARN(c, "ncclRedOpDestroy : operator %d is unallocated", (int)op);
  }
  comm_release(c);
  return r;
}
