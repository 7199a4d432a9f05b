/* Small helpers shared by every subsystem of the host library. */
#ifndef PYCOLL_CORE_H
#define PYCOLL_CORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nccl_types.h"

#define NCCL_API __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CACHELINE 64
#define ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((size_t)(a)-1))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* The library's own version (pycollHostGetVersion). */
#define PYCOLL_HOST_VERSION_MAJOR 0
#define PYCOLL_HOST_VERSION_MINOR 1
#define PYCOLL_HOST_VERSION_PATCH 0

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* 64-bit mixing (splitmix64 finaliser): derives child identities from a parent's. */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

#endif
