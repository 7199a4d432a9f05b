/* Failpoints (see failpoint.h). */
#include "failpoint.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "debug.h"

#define FP_MAX 32
#define FP_NAME 96

struct fp_entry {
  char name[FP_NAME];
  bool prefix; /* the name ended with '*' */
  int action;  /* 1 kill, 2 stop, 3 raise, 4 note, 5 sleep */
  long ms;     /* sleep(MS) */
  long nth;
  bool repeat;
  long rank; /* -1: any */
  long replacement; /* -1: any */
  long passes;
  char trace[256]; /* a file each firing is appended to ("" none) */
};

int fp_state = 0;
static struct fp_entry fp_entries[FP_MAX];
static int fp_count = 0;
static long fp_rank = -1, fp_replacement = 0;
static pthread_once_t fp_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t fp_mu = PTHREAD_MUTEX_INITIALIZER;

static long env_long(const char* name, long dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end;
  long x = strtol(v, &end, 10);
  return *end ? dflt : x;
}

static void trim(char** s, char** e) {
  while (*s < *e && (**s == ' ' || **s == '\t')) (*s)++;
  while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t')) (*e)--;
}

/* one entry [s, e): NAME=ACTION[@N[+]][;rank=R][;replacement=K|any]; host.* entries only */
static void parse_entry(char* s, char* e) {
  trim(&s, &e);
  char* semi = memchr(s, ';', (size_t)(e - s));
  char* head_end = semi ? semi : e;
  char* eq = memchr(s, '=', (size_t)(head_end - s));
  if (!eq || fp_count == FP_MAX) return;
  char *ns = s, *ne = eq, *as = eq + 1, *ae = head_end;
  trim(&ns, &ne);
  trim(&as, &ae);
  size_t nlen = (size_t)(ne - ns);
  if (nlen == 0 || nlen >= FP_NAME) return;
  struct fp_entry f = {.nth = 1, .rank = -1, .replacement = 0};
  memcpy(f.name, ns, nlen);
  f.name[nlen] = 0;
  if (nlen && f.name[nlen - 1] == '*') {
    f.prefix = true;
    f.name[nlen - 1] = 0;
  }
  size_t cmp = f.prefix ? MIN(strlen(f.name), 5) : 5; /* keep what can match a host.* name */
  if (strncmp(f.name, "host.", cmp) != 0) return;
  char* at = memchr(as, '@', (size_t)(ae - as));
  char* act_end = at ? at : ae;
  size_t alen = (size_t)(act_end - as);
  if (alen == 4 && !memcmp(as, "kill", 4)) f.action = 1;
  else if (alen == 4 && !memcmp(as, "stop", 4)) f.action = 2;
  else if (alen == 5 && !memcmp(as, "raise", 5)) f.action = 3;
  else if (alen == 4 && !memcmp(as, "note", 4)) f.action = 4;
  else if (alen > 7 && !memcmp(as, "sleep(", 6) && as[alen - 1] == ')') {
    char* end;
    f.ms = strtol(as + 6, &end, 10);
    if (end != as + alen - 1 || f.ms < 0) return;
    f.action = 5;
  } else return; /* "off" or unknown: the Python side reports bad values */
  if (at) {
    f.nth = strtol(at + 1, NULL, 10);
    f.repeat = ae > at && ae[-1] == '+';
    if (f.nth < 1) return;
  }
  while (semi && semi < e) {
    char* fs = semi + 1;
    semi = memchr(fs, ';', (size_t)(e - fs));
    char* fe = semi ? semi : e;
    trim(&fs, &fe);
    if ((size_t)(fe - fs) > 5 && !memcmp(fs, "rank=", 5)) f.rank = strtol(fs + 5, NULL, 10);
    else if ((size_t)(fe - fs) > 12 && !memcmp(fs, "replacement=", 12))
      f.replacement = !memcmp(fs + 12, "any", 3) ? -1 : strtol(fs + 12, NULL, 10);
    else if ((size_t)(fe - fs) > 6 && (size_t)(fe - fs) - 6 < sizeof f.trace && !memcmp(fs, "trace=", 6))
      memcpy(f.trace, fs + 6, (size_t)(fe - fs) - 6);
  }
  fp_entries[fp_count++] = f;
}

static void fp_read(void) {
  const char* spec = getenv("PYCOLL_FAILPOINTS");
  fp_rank = env_long("PYCOLL_RANK", -1);
  fp_replacement = env_long("PYCOLL_REPLACEMENT", 0);
  if (spec && *spec) {
    char* copy = strdup(spec);
    if (copy) {
      char *s = copy, *end = copy + strlen(copy);
      while (s < end) {
        char* comma = memchr(s, ',', (size_t)(end - s));
        char* e = comma ? comma : end;
        parse_entry(s, e);
        s = e + 1;
      }
      free(copy);
    }
  }
  __atomic_store_n(&fp_state, fp_count ? 2 : 1, __ATOMIC_RELEASE);
}

int fp_hit_slow(const char* name) {
  pthread_once(&fp_once, fp_read);
  if (__atomic_load_n(&fp_state, __ATOMIC_ACQUIRE) != 2) return 0;
  int action = 0;
  long pass = 0;
  long ms = 0;
  const char* trace = NULL;
  pthread_mutex_lock(&fp_mu);
  for (int i = 0; i < fp_count && !action; i++) {
    struct fp_entry* f = &fp_entries[i];
    bool match = f->prefix ? strncmp(name, f->name, strlen(f->name)) == 0 : strcmp(name, f->name) == 0;
    if (!match || (f->rank >= 0 && f->rank != fp_rank)) continue;
    if (f->replacement >= 0 && f->replacement != fp_replacement) continue;
    long n = ++f->passes;
    if (n == f->nth || (f->repeat && n > f->nth)) {
      action = f->action;
      pass = n;
      ms = f->ms;
      trace = f->trace[0] ? f->trace : NULL;
    }
  }
  pthread_mutex_unlock(&fp_mu);
  if (trace) {
    static const char* names[] = {"", "kill", "stop", "raise", "note", "sleep"};
    FILE* out = fopen(trace, "a");
    if (out) {
      fprintf(out, "%s %s %ld %ld %ld\n", name, names[action], fp_rank, (long)getpid(), pass);
      fclose(out);
    }
  }
  if (action == 1) raise(SIGKILL);
  if (action == 2) raise(SIGSTOP);
  if (action == 5) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  if (action == 3) {
    WARN("failpoint %s: failing the call", name);
    return 1;
  }
  return 0;
}
