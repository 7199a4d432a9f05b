#include "core.h"
#include "debug.h"

NCCL_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) {
    WARN("ncclGetVersion : version argument is NULL");
    return ncclInvalidArgument;
  }
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API int pycollHostGetVersion(int* version) {
  if (!version) {
    WARN("pycollHostGetVersion : version argument is NULL");
    return ncclInvalidArgument;
  }
  *version = PYCOLL_HOST_VERSION_MAJOR * 10000 + PYCOLL_HOST_VERSION_MINOR * 100 + PYCOLL_HOST_VERSION_PATCH;
  return ncclSuccess;
}
