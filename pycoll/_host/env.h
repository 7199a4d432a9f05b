/* The host library's own variables (PYCOLL_HOST_*), parsed strictly: a value that is not a whole
 * number (or, for seconds, a finite number) within the variable's bounds is refused with a WARN
 * naming the variable. pycoll's Python side (pycoll/_settings.py) applies the same rules before it
 * loads the library; these keep the library safe alone. */
#ifndef PYCOLL_ENV_H
#define PYCOLL_ENV_H

#include "core.h"

/* Bounds of each variable (inclusive), shared by the readers. */
#define ENV_CHUNK_BYTES_MIN 64ull
#define ENV_CHUNK_BYTES_MAX (1ull << 30)
#define ENV_ONESHOT_MAX_MAX (1ull << 30)
#define ENV_STREAM_MIN_MAX (1ull << 62)  /* PYCOLL_HOST_STREAM_MIN: 0 (never) to 2^62 bytes */
#define ENV_NS_MAX 10000000000ull   /* 10 s of spinning or yielding */
#define ENV_PEER_CHECK_MIN_NS 100000ull /* PYCOLL_HOST_PEER_CHECK_NS: 0.1 ms to ENV_NS_MAX */
#define ENV_DEFER_MAX_NS 1000000000ull /* PYCOLL_HOST_DEFER_NS: at most 1 s */
#define ENV_INLINE_MIN_NS 100000ull    /* PYCOLL_HOST_INLINE_NS: 0.1 ms to ENV_NS_MAX */
#define ENV_STREAM_DEPTH_MAX (1ull << 24) /* PYCOLL_HOST_STREAM_DEPTH: 0 (no bound) to 2^24 operations */
#define ENV_INIT_TIMEOUT_MAX 1e7    /* seconds; 0 means forever */

/* Unset or empty: *out = def, true. A valid value: *out = it, true. Otherwise: a WARN on stderr that
 * names the variable and its bounds, *out = def, false (the caller falls back or fails). */
bool env_u64(const char* name, uint64_t lo, uint64_t hi, uint64_t def, uint64_t* out);
bool env_seconds(const char* name, double lo, double hi, double def, double* out);
/* PYCOLL_HOST_BIND: unset, empty or 0 is off, 1 on; anything else warns and is off. */
bool env_bind(void);

#endif
