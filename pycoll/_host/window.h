/* Memory that peers can reach: ncclMemAlloc hands out memfd-backed shared memory (nothing is ever
 * named under /dev/shm, so nothing outlives the processes), and a window (ncclCommWindowRegister,
 * collective) maps every rank's buffer into every other rank, which is what one-sided puts copy
 * into. */
#ifndef PYCOLL_WINDOW_H
#define PYCOLL_WINDOW_H

#include "core.h"

#include "comm.h"

/* Where a buffer lives in this process's ncclMemAlloc memory. */
struct symmem_ref {
  int fd;        /* the memfd, open in this process */
  size_t offset; /* of the buffer in the allocation */
  size_t size;   /* of the allocation */
};
/* Whether [p, p + len) lies within one ncclMemAlloc allocation of this process. */
bool symmem_find(const void* p, size_t len, struct symmem_ref* out);

struct win_peer {
  char* map;      /* this process's mapping of the peer's allocation (NULL for this rank) */
  size_t map_len;
  char* ptr;      /* the peer's window start, as addressed from this process */
};

struct ncclWindow_vidmem {
  uint64_t magic;
  struct ncclComm* comm; /* compared, never dereferenced after the comm is gone */
  void* buff;
  size_t size;
  int flags;
  uint64_t key; /* once ready: a hash of every rank's nonce in the exchange, the same on every rank, never 0 */
  int refs;    /* the registration plus one per queued operation using the window */
  int state;   /* WIN_PENDING until every rank exchanged, then WIN_READY or WIN_FAILED */
  int fail_code;
  bool memory_freed; /* ncclMemFree took this rank's buffer away: no AllReduce goes through this window */
  char fail_text[768];
  struct win_peer* peers;
  int npeers;
  struct ncclWindow_vidmem* next; /* every live window of this process */
};

enum win_state { WIN_PENDING = 0, WIN_READY = 1, WIN_FAILED = 2 };

/* Validates `win` as a ready window of `c` and takes a reference (window_put releases it). */
ncclResult_t window_get(struct ncclComm* c, ncclWindow_t win, const char* opname);
void window_put(ncclWindow_t win);
/* The ready window of `c` that holds [p, p + len), with a reference taken (window_put releases it) and
 * p's offset in it in *off; NULL where no window of `c` holds it all. */
struct ncclWindow_vidmem* window_holding(struct ncclComm* c, const void* p, size_t len, size_t* off);
/* ncclMemFree of [base, base + len): windows over it are no longer used for AllReduce (peers would write
 * into the freed pages, not into what this process maps there next). */
void windows_memory_freed(const void* base, size_t len);
/* Releases every window of `c` still registered (the communicator is being freed). */
void windows_comm_freed(struct ncclComm* c);

#endif
