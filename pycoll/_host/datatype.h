/* Datatypes and reductions, with NCCL's results. Every binary step rounds back to the element type, as NCCL's
 * kernels do, so a reduction over ranks 0..n-1 in order equals functools.reduce(op, arrays) in numpy / ml_dtypes
 * arithmetic bit for bit, but where NCCL's arithmetic differs from numpy's:
 *   - max and min ignore a NaN operand (NCCL's fmaxf/fminf, __hmax/__hmin: numpy's fmax/fmin): the result is NaN
 *     only where every rank's value is;
 *   - float8 results saturate (NCCL converts them with __NV_SATFINITE): a sum, product or scaled value beyond the
 *     largest finite value, and an e5m2 infinity, become that value with its sign (448 for e4m3fn, 57344 for
 *     e5m2), not NaN or infinity as in ml_dtypes; NaN stays NaN.
 * float16, bfloat16 and float8 values are widened to float32, combined, and rounded to nearest-even (NCCL computes
 * float8 in float16 on sm_90: the same roundings for two float8 operands). Integer arithmetic wraps. */
#ifndef PYCOLL_DATATYPE_H
#define PYCOLL_DATATYPE_H

#include "core.h"

enum redop_kind { RK_SUM = 0, RK_PROD, RK_MAX, RK_MIN, RK_PREMULSUM, RK_SUMDIV };

/* A reduction resolved for one operation: what ranks combine with, and how each rank transforms
 * its own contribution before publishing it (PreMulSum/Avg on floats multiply by a scalar; Avg on
 * integers divides the final sum). */
struct redop {
  int kind;
  int dtype;
  uint64_t scalar; /* RK_PREMULSUM: the scalar's bits in `dtype` */
  int divisor;     /* RK_SUMDIV */
};

size_t dt_size(int dtype);
bool dt_is_float(int dtype);

/* dst = premultiplied src (a plain copy for every kind but RK_PREMULSUM). */
void dt_publish(const struct redop* op, void* dst, const void* src, size_t count);

/* dst (and dst2 when not NULL) = srcs[0] op srcs[1] op ... op srcs[nsrc-1], left to right. Sources
 * are published values except srcs[raw] (raw >= 0), which is transformed with dt_publish first.
 * RK_SUMDIV divides the final sum. dst may alias any source. */
void dt_reduce(const struct redop* op, void* dst, void* dst2, const void* const* srcs, int nsrc, int raw,
               size_t count);

/* dt_reduce writing dst with streaming stores (for outputs too large to stay in cache; dst2, when
 * given, is written normally). Fenced on return. */
void dt_reduce_stream(const struct redop* op, void* dst, void* dst2, const void* const* srcs, int nsrc, int raw,
                      size_t count);

/* dt_reduce of published values (no srcs[raw]) into ndst outputs, each written with streaming
 * stores if `stream` (fenced on return). */
void dt_reduce_to(const struct redop* op, void* const* dsts, int ndst, bool stream, const void* const* srcs, int nsrc,
                  size_t count);

/* Scalar conversions exposed for PreMulSum scalars and tests. */
float dt_half_to_float(uint16_t h);
uint16_t dt_float_to_half(float f);
uint64_t dt_scalar_from_double(int dtype, double v);

#endif
