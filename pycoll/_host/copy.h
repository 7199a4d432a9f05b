/* Moving bytes through shared memory. glibc's memcpy uses `rep movsb` for mid-sized copies, which
 * on AMD Zen is several times slower when the source lines sit modified in another core's cache
 * (exactly what a peer's freshly published data is); explicit vector loops stream at full speed. */
#ifndef PYCOLL_COPY_H
#define PYCOLL_COPY_H

#include "core.h"

/* dst = src (no overlap). */
void ph_copy(void* dst, const void* src, size_t n);
/* dst = src with non-temporal (streaming) stores where the CPU has them: for outputs too large to
 * stay in cache, it saves reading each destination line before writing it. Fenced on return. */
void ph_stream(void* dst, const void* src, size_t n);
/* Whether the AVX2 routines were picked at load time (x86-64 CPUs that have AVX2). */
bool ph_has_avx2(void);

#endif
