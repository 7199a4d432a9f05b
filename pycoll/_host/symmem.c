/* ncclMemAlloc/ncclMemFree: page-rounded anonymous shared memory (memfd), so that a window over it
 * can be mapped by the other ranks (through /proc/<pid>/fd/<fd> while the owner lives). No name
 * ever appears under /dev/shm: a killed process leaves nothing behind. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "debug.h"
#include "handles.h"
#include "window.h"

struct symmem {
  char* base;
  size_t size;
  int fd;
  struct symmem* next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct symmem* allocs;

/* The machine's memory and swap: what the kernel's heuristic overcommit refuses an anonymous allocation beyond (a
 * numpy array of more is a MemoryError). A memfd's pages escape that check -- ftruncate promises any size, and the
 * first write past what there is kills the process -- so an allocation past it is refused here as it would be. 0:
 * not known. */
static uint64_t memory_and_swap(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t total = 0, kb;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %lu kB", &kb) == 1 || sscanf(line, "SwapTotal: %lu kB", &kb) == 1) total += kb * 1024;
  fclose(f);
  return total;
}

NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) {
    WARN("ncclMemAlloc : ptr argument is NULL");
    return ncclInvalidArgument;
  }
  *ptr = NULL;
  if (size == 0) return ncclSuccess;
  if (size > SIZE_MAX - 4096) {
    WARN("ncclMemAlloc : size %zu is too large", size);
    return ncclInvalidArgument;
  }
  size_t len = ALIGN_UP(size, 4096);
  uint64_t there = memory_and_swap();
  if (there && len > there) {
    WARN("ncclMemAlloc : cannot allocate %zu bytes: more than the machine's memory and swap (%lu bytes)", size,
         (unsigned long)there);
    return ncclSystemError;
  }
  struct symmem* m = calloc(1, sizeof *m);
  if (!m) return ncclSystemError;
  m->fd = memfd_create("pycoll-mem", MFD_CLOEXEC);
  if (m->fd < 0 || ftruncate(m->fd, (off_t)len) != 0) {
    WARN("ncclMemAlloc : cannot allocate %zu bytes of shared memory: %s", size, strerror(errno));
    if (m->fd >= 0) close(m->fd);
    free(m);
    return ncclSystemError;
  }
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (p == MAP_FAILED) {
    WARN("ncclMemAlloc : cannot map %zu bytes of shared memory: %s", size, strerror(errno));
    close(m->fd);
    free(m);
    return ncclSystemError;
  }
  m->base = p;
  m->size = len;
  pthread_mutex_lock(&mu);
  m->next = allocs;
  allocs = m;
  pthread_mutex_unlock(&mu);
  handle_add(p, H_MEM, len);
  *ptr = p;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  if (!ptr) return ncclSuccess;
  pthread_mutex_lock(&mu);
  struct symmem** pp = &allocs;
  while (*pp && (*pp)->base != ptr) pp = &(*pp)->next;
  struct symmem* m = *pp;
  if (m) *pp = m->next;
  pthread_mutex_unlock(&mu);
  if (!m || !handle_remove(ptr, H_MEM, NULL)) {
    WARN("ncclMemFree : %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
    return ncclInvalidArgument;
  }
  windows_memory_freed(m->base, m->size);
  munmap(m->base, m->size);
  close(m->fd);
  free(m);
  return ncclSuccess;
}

bool symmem_find(const void* p, size_t len, struct symmem_ref* out) {
  const char* b = p;
  bool found = false;
  pthread_mutex_lock(&mu);
  for (struct symmem* m = allocs; m; m = m->next) {
    if (b >= m->base && b < m->base + m->size && len <= (size_t)(m->base + m->size - b)) {
      out->fd = m->fd;
      out->offset = (size_t)(b - m->base);
      out->size = m->size;
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&mu);
  return found;
}
