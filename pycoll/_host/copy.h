/* Moving bytes through shared memory. glibc's memcpy uses `rep movsb` for mid-sized copies, which
 * on AMD Zen is several times slower when the source lines sit modified in another core's cache
 * (exactly what a peer's freshly published data is); explicit vector loops stream at full speed. */
#ifndef PYCOLL_COPY_H
#define PYCOLL_COPY_H

#include "core.h"

/* dst = src (no overlap). */
void ph_copy(void* dst, const void* src, size_t n);

#endif
