#include "env.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>


/* Settings are read in constructors too (no thread's last error to set, NCCL_DEBUG not consulted):
 * a bad one is always printed. */
static void env_warn(const char* name, const char* value, const char* rule, const char* then) {
  fprintf(stderr, "pycoll host library: WARN %s=%s is invalid: %s%s\n", name, value, rule, then);
  fflush(stderr);
}

static const char* env_value(const char* name) {
  const char* e = getenv(name);
  return (e && *e) ? e : NULL;
}

bool env_u64(const char* name, uint64_t lo, uint64_t hi, uint64_t def, uint64_t* out) {
  *out = def;
  const char* e = env_value(name);
  if (!e) return true;
  const char* p = e;
  while (*p == ' ' || *p == '\t') p++;
  char rule[128];
  snprintf(rule, sizeof rule, "it must be a whole number in [%llu, %llu]", (unsigned long long)lo,
           (unsigned long long)hi);
  if (*p < '0' || *p > '9') {
    env_warn(name, e, rule, "; using the default");
    return false;
  }
  errno = 0;
  char* end;
  unsigned long long v = strtoull(p, &end, 10);
  while (*end == ' ' || *end == '\t' || *end == '\n') end++;
  if (errno || *end || v < lo || v > hi) {
    env_warn(name, e, rule, "; using the default");
    return false;
  }
  *out = v;
  return true;
}

bool env_seconds(const char* name, double lo, double hi, double def, double* out) {
  *out = def;
  const char* e = env_value(name);
  if (!e) return true;
  char rule[128];
  snprintf(rule, sizeof rule, "it must be a finite number of seconds in [%g, %g]", lo, hi);
  errno = 0;
  char* end;
  double v = strtod(e, &end);
  while (*end == ' ' || *end == '\t' || *end == '\n') end++;
  if (end == e || errno || *end || !isfinite(v) || v < lo || v > hi) {
    env_warn(name, e, rule, "");
    return false;
  }
  *out = v;
  return true;
}

bool env_bind(void) {
  uint64_t v; /* the blanks env_u64 skips (Python's check strips the same): " 1" was accepted there, ignored here */
  env_u64("PYCOLL_HOST_BIND", 0, 1, 0, &v);
  return v != 0;
}
