#include "copy.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define SMALL 4096

static void copy_sse2(void* dst, const void* src, size_t n) {
  char* d = dst;
  const char* s = src;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_storeu_si128((__m128i*)(d + i), a);
    _mm_storeu_si128((__m128i*)(d + i + 16), b);
    _mm_storeu_si128((__m128i*)(d + i + 32), c);
    _mm_storeu_si128((__m128i*)(d + i + 48), e);
  }
  if (i < n) memcpy(d + i, s + i, n - i);
}

__attribute__((target("avx2"))) static void copy_avx2(void* dst, const void* src, size_t n) {
  char* d = dst;
  const char* s = src;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i*)(s + i + 96));
    _mm256_storeu_si256((__m256i*)(d + i), a);
    _mm256_storeu_si256((__m256i*)(d + i + 32), b);
    _mm256_storeu_si256((__m256i*)(d + i + 64), c);
    _mm256_storeu_si256((__m256i*)(d + i + 96), e);
  }
  if (i < n) memcpy(d + i, s + i, n - i);
}

/* Streaming variants: the destination is written around the caches (16- or 32-byte aligned
 * stores after a short head), then fenced, so a later release store orders after them. */
static void stream_sse2(void* dst, const void* src, size_t n) {
  char* d = dst;
  const char* s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15), i = 0;
  if (head) {
    memcpy(d, s, MIN(head, n));
    i = MIN(head, n);
  }
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}

__attribute__((target("avx2"))) static void stream_avx2(void* dst, const void* src, size_t n) {
  char* d = dst;
  const char* s = src;
  size_t head = (size_t)(-(uintptr_t)d & 31), i = 0;
  if (head) {
    memcpy(d, s, MIN(head, n));
    i = MIN(head, n);
  }
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i*)(s + i + 96));
    _mm256_stream_si256((__m256i*)(d + i), a);
    _mm256_stream_si256((__m256i*)(d + i + 32), b);
    _mm256_stream_si256((__m256i*)(d + i + 64), c);
    _mm256_stream_si256((__m256i*)(d + i + 96), e);
  }
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}

static void (*copy_impl)(void*, const void*, size_t) = copy_sse2;
static void (*stream_impl)(void*, const void*, size_t) = stream_sse2;

__attribute__((constructor)) static void pick_copy(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    copy_impl = copy_avx2;
    stream_impl = stream_avx2;
  }
}

void ph_copy(void* dst, const void* src, size_t n) {
  if (n < SMALL) memcpy(dst, src, n);
  else copy_impl(dst, src, n);
}

void ph_stream(void* dst, const void* src, size_t n) {
  if (n < SMALL) memcpy(dst, src, n);
  else stream_impl(dst, src, n);
}

bool ph_has_avx2(void) { return copy_impl == copy_avx2; }

#else /* other architectures: the C library's copy */

void ph_copy(void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
void ph_stream(void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
bool ph_has_avx2(void) { return false; }

#endif
