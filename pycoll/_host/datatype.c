#include "datatype.h"

#include <math.h>

#include "copy.h"

/* Reductions must round exactly like the references: no contraction into fused multiply-adds. */
#pragma GCC optimize("fp-contract=off")

static const size_t type_sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

size_t dt_size(int dtype) { return (dtype >= 0 && dtype < ncclNumTypes) ? type_sizes[dtype] : 0; }

bool dt_is_float(int dtype) { return dtype >= ncclFloat16; }

static inline float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- float16 (numpy semantics: payload-preserving NaNs, round to nearest even) ---- */

static float half_table[65536];
static float e4m3_table[256];
static float e5m2_table[256];

static float half_decode(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 31) return f_of(s | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return f_of(s);
    return (s ? -1.0f : 1.0f) * ldexpf((float)m, -24);
  }
  return f_of(s | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t f2h(float x) {
  uint32_t f = u_of(x), s = (f >> 16) & 0x8000, a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) {
    if (a == 0x7f800000u) return (uint16_t)(s | 0x7c00);
    uint32_t m = (a & 0x7fffff) >> 13;
    return (uint16_t)(s | 0x7c00 | (m ? m : 1));
  }
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00); /* rounds to infinity */
  if (a < 0x38800000u) {                                /* below 2^-14: subnormal half or zero */
    if (a <= 0x33000000u) return (uint16_t)s;           /* <= 2^-25 rounds to (even) zero */
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(s | h);
  }
  uint32_t h = (a >> 13) - (112u << 10), rem = a & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(s | h);
}

/* ---- bfloat16 (ml_dtypes semantics: canonical quiet NaN, round to nearest even) ---- */

static inline float b2f(uint16_t b) { return f_of((uint32_t)b << 16); }
static inline uint16_t f2b(float x) {
  uint32_t f = u_of(x);
  if ((f & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((f >> 16) & 0x8000) | 0x7fc0;
  return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1)) >> 16);
}

/* ---- float8 (ml_dtypes' encodings and rounding; results saturate to the largest finite value, as NCCL's
 * __NV_SATFINITE conversions do) ---- */

static float f8_decode(uint8_t v, int mbits, int bias, bool fn) {
  int s = v >> 7, e = (v >> mbits) & ((1 << (7 - mbits)) - 1), m = v & ((1 << mbits) - 1);
  int emax = (1 << (7 - mbits)) - 1;
  float r;
  if (fn && e == emax && m == (1 << mbits) - 1) r = NAN;
  else if (!fn && e == emax) r = m ? NAN : INFINITY;
  else if (e == 0) r = ldexpf((float)m, 1 - bias - mbits);
  else r = ldexpf((float)((1 << mbits) | m), e - bias - mbits);
  return s ? -r : r;
}

static inline uint8_t f2f8(float x, int mbits, int bias, bool fn) {
  uint32_t f = u_of(x), a = f & 0x7fffffffu;
  uint8_t s = (uint8_t)((f >> 24) & 0x80);
  uint8_t nan = (uint8_t)(s | (fn ? 0x7f : 0x7e));
  uint8_t top = (uint8_t)(s | (fn ? 0x7e : 0x7b)); /* the largest finite magnitude, with the sign */
  if (a > 0x7f800000u) return nan;
  if (a == 0x7f800000u) return top;
  if ((a >> 23) == 0) return s; /* zero or a float32 subnormal: far below float8's range */
  int e = (int)(a >> 23) - 127, emin = 1 - bias;
  uint32_t sig = (a & 0x7fffff) | 0x800000;
  int shift = 23 - mbits + (e < emin ? emin - e : 0);
  if (shift > 25) return s;
  uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  uint32_t code;
  if (e < emin) {
    code = q; /* a subnormal; q == 1 << mbits carries into the smallest normal */
  } else {
    if (q >> (mbits + 1)) {
      q >>= 1;
      e++;
    }
    code = ((uint32_t)(e + bias) << mbits) | (q & ((1u << mbits) - 1));
  }
  if (code > (top & 0x7fu)) return top;
  return (uint8_t)(s | code);
}

static inline float e4_f(uint8_t v) { return e4m3_table[v]; }
static inline float e5_f(uint8_t v) { return e5m2_table[v]; }
static inline uint8_t f_e4(float x) { return f2f8(x, 3, 7, true); }
static inline uint8_t f_e5(float x) { return f2f8(x, 2, 15, false); }
static inline float h_f(uint16_t v) { return half_table[v]; }

__attribute__((constructor)) static void build_tables(void) {
  for (uint32_t i = 0; i < 65536; i++) half_table[i] = half_decode((uint16_t)i);
  for (uint32_t i = 0; i < 256; i++) {
    e4m3_table[i] = f8_decode((uint8_t)i, 3, 7, true);
    e5m2_table[i] = f8_decode((uint8_t)i, 2, 15, false);
  }
}

float dt_half_to_float(uint16_t h) { return half_table[h]; }
uint16_t dt_float_to_half(float f) { return f2h(f); }

/* ---- kernels ---- */

typedef void (*binfn)(void* o, const void* a, const void* b, size_t n);
typedef void (*mulfn)(void* o, const void* a, uint64_t s, size_t n);
typedef void (*divfn)(void* x, size_t n, int d);

#define INT_KERNELS(N, T, UT)                                                           \
  typedef T N##_u __attribute__((aligned(1))); /* arrays may be unaligned */       \
  static void N##_sum(void* o_, const void* a_, const void* b_, size_t n) {             \
    N##_u* o = o_;                                                                      \
    const N##_u *a = a_, *b = b_;                                                       \
    for (size_t i = 0; i < n; i++) o[i] = (T)((UT)a[i] + (UT)b[i]);                     \
  }                                                                                     \
  static void N##_prod(void* o_, const void* a_, const void* b_, size_t n) {            \
    N##_u* o = o_;                                                                      \
    const N##_u *a = a_, *b = b_;                                                       \
    for (size_t i = 0; i < n; i++) o[i] = (T)((UT)a[i] * (UT)b[i]);                     \
  }                                                                                     \
  static void N##_max(void* o_, const void* a_, const void* b_, size_t n) {             \
    N##_u* o = o_;                                                                      \
    const N##_u *a = a_, *b = b_;                                                       \
    for (size_t i = 0; i < n; i++) o[i] = a[i] > b[i] ? a[i] : b[i];                    \
  }                                                                                     \
  static void N##_min(void* o_, const void* a_, const void* b_, size_t n) {             \
    N##_u* o = o_;                                                                      \
    const N##_u *a = a_, *b = b_;                                                       \
    for (size_t i = 0; i < n; i++) o[i] = a[i] < b[i] ? a[i] : b[i];                    \
  }                                                                                     \
  static void N##_mul(void* o_, const void* a_, uint64_t s_, size_t n) {                \
    N##_u* o = o_;                                                                      \
    const N##_u* a = a_;                                                                \
    T s;                                                                                \
    memcpy(&s, &s_, sizeof s);                                                          \
    for (size_t i = 0; i < n; i++) o[i] = (T)((UT)a[i] * (UT)s);                        \
  }                                                                                     \
  static void N##_div(void* x_, size_t n, int d) {                                      \
    N##_u* x = x_;                                                                      \
    for (size_t i = 0; i < n; i++) x[i] = (T)(x[i] / d);                                \
  }

INT_KERNELS(i8, int8_t, uint8_t)
INT_KERNELS(u8, uint8_t, uint8_t)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(u32, uint32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)
INT_KERNELS(u64, uint64_t, uint64_t)

/* Floating types: T is the storage type, TO/FROM convert to and from the arithmetic type AT.
 * max/min ignore a NaN operand (NCCL's); on ties TIE_A selects a (numpy's float16) or b (float32/64, ml_dtypes);
 * SEL(v) is what a selected value becomes (float8: FROM(TO(v)), which saturates an e5m2 infinity, as NCCL's
 * round trip through float16 does). */
#define FLOAT_KERNELS(N, T, AT, TO, FROM, TIE_A, SEL)                                    \
  typedef T N##_u __attribute__((aligned(1))); /* arrays may be unaligned */       \
  static void N##_sum(void* o_, const void* a_, const void* b_, size_t n) {              \
    N##_u* o = o_;                                                                       \
    const N##_u *a = a_, *b = b_;                                                        \
    for (size_t i = 0; i < n; i++) o[i] = FROM((AT)(TO(a[i]) + TO(b[i])));               \
  }                                                                                      \
  static void N##_prod(void* o_, const void* a_, const void* b_, size_t n) {             \
    N##_u* o = o_;                                                                       \
    const N##_u *a = a_, *b = b_;                                                        \
    for (size_t i = 0; i < n; i++) o[i] = FROM((AT)(TO(a[i]) * TO(b[i])));               \
  }                                                                                      \
  static void N##_max(void* o_, const void* a_, const void* b_, size_t n) {              \
    N##_u* o = o_;                                                                       \
    const N##_u *a = a_, *b = b_;                                                        \
    for (size_t i = 0; i < n; i++) {                                                     \
      AT x = TO(a[i]), y = TO(b[i]);                                                     \
      bool pick_a = (y != y) || (!(x != x) && (TIE_A ? x >= y : x > y));                 \
      o[i] = SEL(pick_a ? a[i] : b[i]);                                                  \
    }                                                                                    \
  }                                                                                      \
  static void N##_min(void* o_, const void* a_, const void* b_, size_t n) {              \
    N##_u* o = o_;                                                                       \
    const N##_u *a = a_, *b = b_;                                                        \
    for (size_t i = 0; i < n; i++) {                                                     \
      AT x = TO(a[i]), y = TO(b[i]);                                                     \
      bool pick_a = (y != y) || (!(x != x) && (TIE_A ? x <= y : x < y));                 \
      o[i] = SEL(pick_a ? a[i] : b[i]);                                                  \
    }                                                                                    \
  }                                                                                      \
  static void N##_mul(void* o_, const void* a_, uint64_t s_, size_t n) {                 \
    N##_u* o = o_;                                                                       \
    const N##_u* a = a_;                                                                 \
    T s;                                                                                 \
    memcpy(&s, &s_, sizeof s);                                                           \
    AT sv = TO(s);                                                                       \
    for (size_t i = 0; i < n; i++) o[i] = FROM((AT)(TO(a[i]) * sv));                     \
  }

#define ID(x) (x)
#define E4_SEL(v) f_e4(e4_f(v))
#define E5_SEL(v) f_e5(e5_f(v))
FLOAT_KERNELS(f32, float, float, ID, ID, 0, ID)
FLOAT_KERNELS(f64, double, double, ID, ID, 0, ID)
FLOAT_KERNELS(f16, uint16_t, float, h_f, f2h, 1, ID)
FLOAT_KERNELS(bf16, uint16_t, float, b2f, f2b, 0, ID)
FLOAT_KERNELS(e4, uint8_t, float, e4_f, f_e4, 0, E4_SEL)
FLOAT_KERNELS(e5, uint8_t, float, e5_f, f_e5, 0, E5_SEL)

/* Plain float32 sum, the hot path of the benchmark: kept separate so the compiler vectorises it. */
#if defined(__x86_64__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif
VECTOR_CLONES static void f32_sum_fast(void* o_, const void* a_, const void* b_, size_t n) {
  f32_u* o = o_;
  const f32_u *a = a_, *b = b_;
  for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i];
}

#define ROW(N) {N##_sum, N##_prod, N##_max, N##_min}
static const binfn bin_table[ncclNumTypes][4] = {ROW(i8),  ROW(u8),  ROW(i32), ROW(u32),
                                                 ROW(i64), ROW(u64), ROW(f16), {f32_sum_fast, f32_prod, f32_max, f32_min},
                                                 ROW(f64), ROW(bf16), ROW(e4), ROW(e5)};
static const mulfn mul_table[ncclNumTypes] = {i8_mul,  u8_mul,  i32_mul,  u32_mul, i64_mul, u64_mul,
                                              f16_mul, f32_mul, f64_mul, bf16_mul, e4_mul, e5_mul};
static const divfn div_table[ncclNumTypes] = {i8_div, u8_div, i32_div, u32_div, i64_div, u64_div};

static binfn combiner(const struct redop* op) {
  int k = op->kind;
  if (k == RK_PREMULSUM || k == RK_SUMDIV) k = RK_SUM;
  return bin_table[op->dtype][k];
}

void dt_publish(const struct redop* op, void* dst, const void* src, size_t count) {
  if (op && op->kind == RK_PREMULSUM) mul_table[op->dtype](dst, src, op->scalar, count);
  else if (dst != src) ph_copy(dst, src, count * dt_size(op ? op->dtype : ncclUint8));
}

uint64_t dt_scalar_from_double(int dtype, double v) {
  uint64_t bits = 0;
  float f = (float)v;
  switch (dtype) {
    case ncclFloat16: bits = f2h(f); break;
    case ncclBfloat16: bits = f2b(f); break;
    case ncclFloat32: bits = u_of(f); break;
    case ncclFloat64: memcpy(&bits, &v, 8); break;
    case ncclFloat8e4m3: bits = f_e4(f); break;
    case ncclFloat8e5m2: bits = f_e5(f); break;
    default: bits = (uint64_t)(int64_t)v; break;
  }
  return bits;
}

#define BLOCK_BYTES 8192

static bool overlaps(const void* a, const void* b, size_t bytes) {
  const char *x = a, *y = b;
  return x < y + bytes && y < x + bytes;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* float32 sum over any number of sources in one pass: each element is read once from every source
 * and written once to each output (the first `nstream` with streaming stores where the first's
 * alignment aligns them too), summed left to right like the pairwise kernels. */
__attribute__((target("avx2"))) static void f32_sum_many(float* const* dsts, int ndst, int nstream,
                                                        const float* const* srcs, int nsrc, size_t count) {
  size_t i = 0;
  for (; nstream > 0 && i < count && ((uintptr_t)(dsts[0] + i) & 31); i++) {
    float v = ((const f32_u*)srcs[0])[i];
    for (int k = 1; k < nsrc; k++) v = v + ((const f32_u*)srcs[k])[i];
    for (int d = 0; d < ndst; d++) ((f32_u*)dsts[d])[i] = v;
  }
  bool st[ndst];
  for (int d = 0; d < ndst; d++) st[d] = d < nstream && !((uintptr_t)(dsts[d] + i) & 31);
  for (; i + 16 <= count; i += 16) {
    __m256 a = _mm256_loadu_ps(srcs[0] + i), b = _mm256_loadu_ps(srcs[0] + i + 8);
    for (int k = 1; k < nsrc; k++) {
      a = _mm256_add_ps(a, _mm256_loadu_ps(srcs[k] + i));
      b = _mm256_add_ps(b, _mm256_loadu_ps(srcs[k] + i + 8));
    }
    for (int d = 0; d < ndst; d++) {
      if (st[d]) {
        _mm256_stream_ps(dsts[d] + i, a);
        _mm256_stream_ps(dsts[d] + i + 8, b);
      } else {
        _mm256_storeu_ps(dsts[d] + i, a);
        _mm256_storeu_ps(dsts[d] + i + 8, b);
      }
    }
  }
  if (nstream > 0) _mm_sfence();
  for (; i < count; i++) {
    float v = ((const f32_u*)srcs[0])[i];
    for (int k = 1; k < nsrc; k++) v = v + ((const f32_u*)srcs[k])[i];
    for (int d = 0; d < ndst; d++) ((f32_u*)dsts[d])[i] = v;
  }
}
#define HAVE_SUM_MANY 1
#endif

static void reduce_impl(const struct redop* op, void* const* dsts, int ndst, int nstream,
                        const void* const* srcs, int nsrc, int raw, size_t count) {
  size_t es = dt_size(op->dtype), bytes = count * es;
  char* dst = dsts[0];
  binfn comb = combiner(op);
  if (op->kind != RK_PREMULSUM) raw = -1;
  bool post_div = op->kind == RK_SUMDIV && op->divisor != 1;
#ifdef HAVE_SUM_MANY
  if (op->dtype == ncclFloat32 && op->kind == RK_SUM && nsrc >= 2 && ph_has_avx2()) {
    f32_sum_many((float* const*)dsts, ndst, nstream, (const float* const*)srcs, nsrc, count);
    return;
  }
#endif
  if (nsrc == 2 && raw < 0 && !post_div && !nstream) { /* the common case: one pass, no temporaries */
    if (ndst == 1) {
      comb(dst, srcs[0], srcs[1], count);
      return;
    }
    size_t blk = BLOCK_BYTES / es; /* the other outputs' copies read what L1 still holds */
    for (size_t off = 0; off < count; off += blk) {
      size_t len = MIN(blk, count - off), boff = off * es;
      comb(dst + boff, (const char*)srcs[0] + boff, (const char*)srcs[1] + boff, len);
      for (int d = 1; d < ndst; d++) ph_copy((char*)dsts[d] + boff, dst + boff, len * es);
    }
    return;
  }
  bool alias = nstream > 0; /* streaming: accumulate in L1, write dst once */
  for (int k = 1; k < nsrc; k++)
    if (overlaps(dst, srcs[k], bytes)) alias = true;
  _Alignas(64) char tmp[BLOCK_BYTES];
  _Alignas(64) char rawbuf[BLOCK_BYTES];
  size_t blk = BLOCK_BYTES / es;
  for (size_t off = 0; off < count; off += blk) {
    size_t len = MIN(blk, count - off), boff = off * es;
    char* acc = alias ? tmp : dst + boff;
    const void* s0 = (const char*)srcs[0] + boff;
    if (raw == 0) {
      dt_publish(op, rawbuf, s0, len);
      s0 = rawbuf;
    }
    if (nsrc == 1) {
      memmove(acc, s0, len * es);
    } else {
      for (int k = 1; k < nsrc; k++) {
        const void* sk = (const char*)srcs[k] + boff;
        if (k == raw) {
          dt_publish(op, rawbuf, sk, len);
          sk = rawbuf;
        }
        comb(acc, k == 1 ? s0 : acc, sk, len);
      }
    }
    if (post_div) div_table[op->dtype](acc, len, op->divisor);
    for (int d = 0; d < ndst; d++)
      if (d > 0 || acc != dst + boff) (d < nstream ? ph_stream : ph_copy)((char*)dsts[d] + boff, acc, len * es);
  }
}

void dt_reduce(const struct redop* op, void* dst, void* dst2, const void* const* srcs, int nsrc, int raw,
               size_t count) {
  void* dsts[2] = {dst, dst2};
  reduce_impl(op, dsts, dst2 ? 2 : 1, 0, srcs, nsrc, raw, count);
}

void dt_reduce_stream(const struct redop* op, void* dst, void* dst2, const void* const* srcs, int nsrc, int raw,
                      size_t count) {
  void* dsts[2] = {dst, dst2};
  reduce_impl(op, dsts, dst2 ? 2 : 1, 1, srcs, nsrc, raw, count);
}

void dt_reduce_to(const struct redop* op, void* const* dsts, int ndst, bool stream, const void* const* srcs, int nsrc,
                  size_t count) {
  reduce_impl(op, dsts, ndst, stream ? ndst : 0, srcs, nsrc, -1, count);
}
