/* Every reduction kernel of the host library on unaligned arrays (NCCL takes them; numpy makes them), built with
 * -fsanitize=alignment,undefined -fno-sanitize-recover by tests/host/test_host_colls.py: a typed access the
 * alignment of its arrays does not allow is undefined behaviour that today's compiler happens to forgive. */
#include <stdio.h>
#include <string.h>

#include "datatype.h"

int main(void) {
  static char buf[4][4096 + 64];
  for (int dt = 0; dt < ncclNumTypes; dt++)
    for (int kind = RK_SUM; kind <= RK_SUMDIV; kind++)
      for (int off = 1; off < 8; off += 2)
        for (int n = 1; n < 300; n += 37) {
          struct redop op = {.kind = kind, .dtype = dt, .scalar = 1, .divisor = kind == RK_SUMDIV && dt < 6 ? 3 : 1};
          memset(buf, 1, sizeof buf);
          const void* srcs[3] = {buf[0] + off, buf[1] + off, buf[2] + off};
          void* dsts[2] = {buf[3] + off, buf[2] + off};
          dt_reduce(&op, buf[0] + off, NULL, srcs, 2, kind == RK_PREMULSUM ? 0 : -1, n);
          dt_reduce(&op, buf[3] + off, buf[1] + off, srcs, 3, -1, n);
          dt_reduce_stream(&op, buf[3] + off, NULL, srcs, 3, -1, n);
          dt_reduce_to(&op, dsts, 2, true, srcs, 2, n);
          dt_publish(&op, buf[3] + off, srcs[0], n);
        }
  puts("ok");
  return 0;
}
