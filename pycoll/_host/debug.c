#include "debug.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "comm.h"

#define LAST_ERROR_LEN 1024

static __thread char tls_last[LAST_ERROR_LEN];
static __thread char tls_ret[LAST_ERROR_LEN];
static char global_last[LAST_ERROR_LEN];
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;

enum { LOG_UNSET = -1, LOG_NONE = 0, LOG_WARN = 1, LOG_INFO = 2 };
static int log_level = LOG_UNSET;

static int level(void) {
  int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
  if (l != LOG_UNSET) return l;
  const char* e = getenv("NCCL_DEBUG");
  l = LOG_NONE;
  if (e && (!strcasecmp(e, "WARN"))) l = LOG_WARN;
  if (e && (!strcasecmp(e, "INFO") || !strcasecmp(e, "TRACE"))) l = LOG_INFO;
  __atomic_store_n(&log_level, l, __ATOMIC_RELAXED);
  return l;
}

static void emit(const char* kind, const char* msg) {
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char* dot = strchr(host, '.');
  if (dot) *dot = 0;
  fprintf(stderr, "%s:%d:%ld [host] NCCL %s %s\n", host, (int)getpid(), (long)syscall(SYS_gettid), kind,
          msg);
  fflush(stderr);
}

void ph_warn(struct ncclComm* comm, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_last, sizeof tls_last, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&global_lock);
  memcpy(global_last, tls_last, sizeof global_last);
  pthread_mutex_unlock(&global_lock);
  if (comm) comm_set_last_error(comm, tls_last);
  if (level() >= LOG_WARN) emit("WARN", tls_last);
}

/* Deprecated in NCCL: re-reads NCCL_DEBUG on the next message. */
NCCL_API void ncclResetDebugInit(void) { __atomic_store_n(&log_level, LOG_UNSET, __ATOMIC_RELAXED); }

void ph_info(const char* fmt, ...) {
  if (level() < LOG_INFO) return;
  char buf[LAST_ERROR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  emit("INFO", buf);
}

void ph_last_error_to_comm(struct ncclComm* comm) {
  if (comm && tls_last[0]) comm_set_last_error(comm, tls_last);
}

const char* ph_type_name(int t) {
  static const char* names[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",     "ncclUint32",
                                "ncclInt64",   "ncclUint64",   "ncclFloat16",   "ncclFloat32",
                                "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return (t >= 0 && t < ncclNumTypes) ? names[t] : "Unknown";
}

const char* ph_op_name(int op) {
  static const char* names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return (op >= 0 && op < ncclNumOps) ? names[op] : "ncclPreMulSum";
}

NCCL_API const char* ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "timeout";
    default: return "unknown result code";
  }
}

/* The text for `comm` when it is a live communicator with an error text of its own (errors of
 * enqueued work land there), else the calling thread's, else the process's last error. */
NCCL_API const char* ncclGetLastError(ncclComm_t comm) {
  tls_ret[0] = 0;
  if (comm && comm_copy_last_error(comm, tls_ret, sizeof tls_ret) && tls_ret[0]) return tls_ret;
  if (tls_last[0]) {
    memcpy(tls_ret, tls_last, sizeof tls_ret);
    return tls_ret;
  }
  pthread_mutex_lock(&global_lock);
  memcpy(tls_ret, global_last, sizeof tls_ret);
  pthread_mutex_unlock(&global_lock);
  return tls_ret;
}
