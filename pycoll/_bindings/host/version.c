#include "pycoll_host.h"
__attribute__((visibility("default"))) int pycollHostGetVersion(int* version) {
  if (!version) return 4;
  *version = 100;
  return 0;
}
