/* A fake NCCL-ABI library for the binding tests: a few functions with scripted behaviour, many
 * deliberately missing. Built by tests/test_bindings_fake.py with gcc; controlled through the
 * fake* functions (called with ctypes).
 *
 *   -DFAKE_VERSION=n   the version ncclGetVersion reports
 *   -DFAKE_HOST        also export pycollHostGetVersion (kind "host")
 *   -DFAKE_RCCL        also export ncclAllToAllv (kind "rccl")
 *   -DFAKE_DEVAPI      also export ncclDevCommCreate/Destroy (recording their arguments)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FAKE_VERSION
#define FAKE_VERSION 22703
#endif

#define API __attribute__((visibility("default")))

typedef void* comm_t;
typedef struct { char internal[128]; } uid_t128;

static char last_error[256] = "";
static int delay_ms = 0;
static int abort_delay_ms = 0;
static int next_result = 0;     /* what the scripted calls return */
static int async_state = 0;     /* what ncclCommGetAsyncError reports */
static uintptr_t last_args[12];
static unsigned char config_copy[256];
static size_t config_copy_size = 0;
static int sorted_exclude[64];
static int sorted_exclude_n = -1;

static void set_error(const char* text) { snprintf(last_error, sizeof last_error, "%s", text); }

static void record(int n, ...) {
  __builtin_va_list ap;
  __builtin_va_start(ap, n);
  memset(last_args, 0, sizeof last_args);
  for (int i = 0; i < n && i < 12; i++) last_args[i] = __builtin_va_arg(ap, uintptr_t);
  __builtin_va_end(ap);
}

/* --- control ------------------------------------------------------------------------------ */
API void fakeSetDelayMs(int ms) { delay_ms = ms; }
/* ncclCommAbort takes this long (a real one waits for a kernel still queued behind other work) */
API void fakeSetAbortDelayMs(int ms) { abort_delay_ms = ms; }
API void fakeSetNextResult(int r) { next_result = r; }
API void fakeSetAsyncState(int s) { async_state = s; }
API void fakeLastArgs(uintptr_t* out) { memcpy(out, last_args, sizeof last_args); }
API size_t fakeConfigCopy(unsigned char* out) { memcpy(out, config_copy, sizeof config_copy); return config_copy_size; }
API int fakeSortedExclude(int* out) { if (sorted_exclude_n > 0) memcpy(out, sorted_exclude, sizeof(int) * sorted_exclude_n); return sorted_exclude_n; }

/* --- versions and errors --------------------------------------------------------------------- */
API int ncclGetVersion(int* v) { if (!v) return 4; *v = FAKE_VERSION; return 0; }

API const char* ncclGetErrorString(int r) {
  static const char* s[] = {"fake: no error", "fake: cuda", "fake: system", "fake: internal",
                            "fake: invalid argument", "fake: invalid usage", "fake: remote",
                            "fake: in progress", "fake: timeout"};
  return (r >= 0 && r < 9) ? s[r] : "fake: unknown";
}

API const char* ncclGetLastError(comm_t comm) { (void)comm; return last_error; }

API int ncclCommGetAsyncError(comm_t comm, int* state) {
  if (!comm) { set_error("fake: GetAsyncError on NULL"); return 4; }
  *state = __atomic_load_n(&async_state, __ATOMIC_ACQUIRE);
  return 0;
}

/* --- init ------------------------------------------------------------------------------------ */
API int ncclGetUniqueId(uid_t128* id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)i;
  return 0;
}

API int ncclCommInitRank(comm_t* comm, int nranks, uid_t128 id, int rank) {
  record(4, (uintptr_t)nranks, (uintptr_t)rank, (uintptr_t)(unsigned char)id.internal[0],
         (uintptr_t)(unsigned char)id.internal[127]);
  if (next_result == 0 || next_result == 7) *comm = (comm_t)0x1000;
  if (next_result != 0) set_error("fake: init failed on purpose");
  return next_result;
}

API int ncclCommInitRankConfig(comm_t* comm, int nranks, uid_t128 id, int rank, void* config) {
  (void)id;
  record(3, (uintptr_t)nranks, (uintptr_t)rank, (uintptr_t)config);
  config_copy_size = 0;
  if (config) {
    size_t size = *(size_t*)config;
    config_copy_size = size;
    memcpy(config_copy, config, size < sizeof config_copy ? size : sizeof config_copy);
  }
  *comm = (comm_t)0x2000;
  return next_result;
}

struct job { comm_t* slot; int* list; int n; int ms; comm_t value; };

static void* finish_later(void* arg) {
  struct job* j = arg;
  usleep((useconds_t)j->ms * 1000);
  if (j->list) {
    /* like NCCL, sort the caller's list in place, in the background */
    for (int a = 0; a < j->n; a++)
      for (int b = a + 1; b < j->n; b++)
        if (j->list[b] < j->list[a]) { int t = j->list[a]; j->list[a] = j->list[b]; j->list[b] = t; }
    memcpy(sorted_exclude, j->list, sizeof(int) * (j->n < 64 ? j->n : 64));
    __atomic_store_n(&sorted_exclude_n, j->n, __ATOMIC_RELEASE);
  }
  if (j->value) __atomic_store_n(j->slot, j->value, __ATOMIC_RELEASE);
  free(j);
  return NULL;
}

static int later(comm_t* slot, int* list, int n, comm_t value) {
  struct job* j = calloc(1, sizeof *j);
  pthread_t t;
  j->slot = slot; j->list = list; j->n = n; j->ms = delay_ms; j->value = value;
  pthread_create(&t, NULL, finish_later, j);
  pthread_detach(t);
  return 7;
}

/* next_result 7 = nonblocking: the slot is written later by a background thread */
API int ncclCommSplit(comm_t comm, int color, int key, comm_t* newcomm, void* config) {
  (void)config;
  record(3, (uintptr_t)comm, (uintptr_t)(intptr_t)color, (uintptr_t)(intptr_t)key);
  if (!comm) { set_error("fake: split of NULL"); return 4; }
  comm_t value = color == -1 ? NULL : (comm_t)(0x3000 + (uintptr_t)color);
  if (next_result == 7) return later(newcomm, NULL, 0, value);
  *newcomm = value;
  return next_result;
}

API int ncclCommShrink(comm_t comm, int* excl, int n, comm_t* newcomm, void* config, int flags) {
  (void)config;
  record(3, (uintptr_t)comm, (uintptr_t)n, (uintptr_t)flags);
  if (!comm || !excl || n <= 0) { set_error("fake: bad shrink"); return 4; }
  if (next_result == 7) return later(newcomm, excl, n, (comm_t)0x4000);
  for (int a = 0; a < n; a++) sorted_exclude[a] = excl[a];
  sorted_exclude_n = n;
  *newcomm = (comm_t)0x4000;
  return next_result;
}

API int ncclCommAbort(comm_t comm) {
  record(1, (uintptr_t)comm);
  if (abort_delay_ms) usleep((useconds_t)abort_delay_ms * 1000);
  return 0;
}
API int ncclCommDestroy(comm_t comm) { record(1, (uintptr_t)comm); return 0; }

API int ncclCommCount(comm_t comm, int* count) {
  if (!comm) { set_error("fake: CommCount of NULL"); return 4; }
  if (next_result != 0) { set_error("fake: CommCount failed on purpose"); return next_result; }
  *count = 4;
  return 0;
}

API int ncclCommUserRank(comm_t comm, int* rank) {
  if (!comm) { set_error("fake: CommUserRank of NULL"); return 4; }
  *rank = 0;
  return 0;
}

/* --- collectives ----------------------------------------------------------------------------- */
API int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, comm_t comm, void* stream) {
  record(7, (uintptr_t)s, (uintptr_t)r, (uintptr_t)n, (uintptr_t)dt, (uintptr_t)op, (uintptr_t)comm,
         (uintptr_t)stream);
  if (delay_ms) usleep((useconds_t)delay_ms * 1000);  /* a slow call: the GIL must be released */
  if (next_result != 0 && next_result != 7) set_error("fake: all-reduce failed on purpose");
  return next_result;
}

API int ncclSend(const void* s, size_t n, int dt, int peer, comm_t comm, void* stream) {
  record(6, (uintptr_t)s, (uintptr_t)n, (uintptr_t)dt, (uintptr_t)peer, (uintptr_t)comm, (uintptr_t)stream);
  return next_result;
}

#ifdef FAKE_DEVAPI
/* records (comm, requirements' first word, requirements' magic) */
API int ncclDevCommCreate(comm_t comm, const void* reqs, void* out) {
  (void)out;
  record(3, (uintptr_t)comm, (uintptr_t)((const size_t*)reqs)[0], (uintptr_t)((const unsigned*)reqs)[2]);
  return next_result;
}
API int ncclDevCommDestroy(comm_t comm, const void* dc) { (void)comm; (void)dc; return 0; }
#endif

API int ncclGroupStart(void) { return 0; }
API int ncclGroupEnd(void) { return next_result; }

#ifdef FAKE_HOST
API int pycollHostGetVersion(int* v) { *v = 4242; return 0; }

/* streams and events: a handle is a heap int counting queries; the third query says "done" */
API int pycollStreamCreate(void** s) { *s = calloc(1, sizeof(int)); return 0; }
API int pycollStreamDestroy(void* s) { if (!s) { set_error("fake: NULL stream"); return 4; } free(s); return 0; }
API int pycollStreamSynchronize(void* s) { record(1, (uintptr_t)s); return 0; }
API int pycollStreamQuery(void* s) { return ++*(int*)s >= 3 ? 0 : 7; }
API int pycollStreamWaitEvent(void* s, void* e) { record(2, (uintptr_t)s, (uintptr_t)e); return 0; }
API int pycollEventCreate(void** e) { *e = calloc(1, sizeof(int)); return 0; }
API int pycollEventDestroy(void* e) { free(e); return 0; }
API int pycollEventRecord(void* e, void* s) { record(2, (uintptr_t)e, (uintptr_t)s); *(int*)e = 0; return 0; }
API int pycollEventQuery(void* e) { return ++*(int*)e >= 3 ? 0 : 7; }
API int pycollEventSynchronize(void* e) { record(1, (uintptr_t)e); return 0; }
API int pycollEventElapsedTime(float* ms, void* a, void* b) {
  if (a == b) { set_error("fake: same event twice"); return 4; }
  *ms = 1.5f;
  return 0;
}

API int ncclAllReduceConfig(const void* s, void* r, size_t n, int dt, int op, comm_t comm, void* stream,
                            const void* config) {
  record(8, (uintptr_t)s, (uintptr_t)r, (uintptr_t)n, (uintptr_t)dt, (uintptr_t)op, (uintptr_t)comm,
         (uintptr_t)stream, (uintptr_t)config);
  return 0;
}
#endif

#ifdef FAKE_RCCL
API int ncclAllToAllv(void) { return 0; }
#endif
