/* Failpoints (see failpoint.h). */
#include "failpoint.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  bool any_rank, any_replacement; /* no rank= filter; replacement=any */
  long rank;
  long replacement;
  long passes;
  char trace[256]; /* a file each firing is appended to ("" none) */
};

int fp_state = 0;
static struct fp_entry fp_entries[FP_MAX];
static int fp_count = 0;
static long fp_rank = -1, fp_replacement = 0;
static bool fp_rank_known = false; /* PYCOLL_RANK set: a rank=R filter matches nothing without it (as in Python) */
static pthread_once_t fp_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t fp_mu = PTHREAD_MUTEX_INITIALIZER;

static long env_long(const char* name, long dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end;
  long x = strtol(v, &end, 10);
  return *end ? dflt : x;
}

static void trim(char** s, char** e) { /* as Python's str.strip(): every blank, newlines included */
  while (*s < *e && isspace((unsigned char)**s)) (*s)++;
  while (*e > *s && isspace((unsigned char)(*e)[-1])) (*e)--;
}

/* [s, e) is a whole integer (blanks around it allowed, as Python's int()) */
static bool whole_long(const char* s, const char* e, long* out) {
  char *ts = (char*)s, *te = (char*)e;
  trim(&ts, &te);
  if (ts == te || te - ts > 24) return false;
  char buf[32], *end;
  memcpy(buf, ts, (size_t)(te - ts));
  buf[te - ts] = 0;
  errno = 0;
  *out = strtol(buf, &end, 10);
  return *end == 0 && errno == 0;
}

static bool is_word(const char* s, const char* e, const char* word) {
  return (size_t)(e - s) == strlen(word) && !memcmp(s, word, (size_t)(e - s));
}

/* one entry [s, e): NAME=ACTION[@N[+]][;rank=R][;replacement=K|any][;trace=PATH]; host.* entries only. The grammar
 * and the blanks it allows are pycoll/failpoints.py's parse(): an entry it would refuse arms nothing here (the
 * Python side refuses the whole value where it runs); a filter not understood drops the entry, never only the
 * filter (a rank=1 restriction lost would fire the failpoint in every rank) */
static void parse_entry(char* s, char* e) {
  trim(&s, &e);
  if (s == e) return;
  char* semi = memchr(s, ';', (size_t)(e - s));
  char* head_end = semi ? semi : e;
  char* eq = memchr(s, '=', (size_t)(head_end - s));
  if (!eq || fp_count == FP_MAX) return;
  char *ns = s, *ne = eq, *as = eq + 1, *ae = head_end;
  trim(&ns, &ne);
  trim(&as, &ae);
  size_t nlen = (size_t)(ne - ns);
  if (nlen == 0 || nlen >= FP_NAME) return;
  struct fp_entry f = {.nth = 1, .any_rank = true, .replacement = 0};
  memcpy(f.name, ns, nlen);
  f.name[nlen] = 0;
  if (nlen && f.name[nlen - 1] == '*') {
    f.prefix = true;
    f.name[nlen - 1] = 0;
  }
  size_t cmp = f.prefix ? MIN(strlen(f.name), 5) : 5; /* keep what can match a host.* name */
  if (strncmp(f.name, "host.", cmp) != 0) return;
  char* at = memchr(as, '@', (size_t)(ae - as));
  char *act_s = as, *act_e = at ? at : ae;
  trim(&act_s, &act_e);
  size_t alen = (size_t)(act_e - act_s);
  if (is_word(act_s, act_e, "kill")) f.action = 1;
  else if (is_word(act_s, act_e, "stop")) f.action = 2;
  else if (is_word(act_s, act_e, "raise")) f.action = 3;
  else if (is_word(act_s, act_e, "note")) f.action = 4;
  else if (alen > 7 && !memcmp(act_s, "sleep(", 6) && act_e[-1] == ')') {
    for (const char* d = act_s + 6; d < act_e - 1; d++)
      if (*d < '0' || *d > '9') return; /* digits only, as Python's sleep\(([0-9]+)\) */
    if (!whole_long(act_s + 6, act_e - 1, &f.ms) || f.ms < 0) return;
    f.action = 5;
  } else return; /* "off" or unknown: the Python side reports bad values */
  if (at) {
    char *cs = at + 1, *ce = ae;
    trim(&cs, &ce);
    f.repeat = ce > cs && ce[-1] == '+';
    if (!whole_long(cs, f.repeat ? ce - 1 : ce, &f.nth) || f.nth < 1) return;
  }
  while (semi && semi < e) {
    char* fs = semi + 1;
    semi = memchr(fs, ';', (size_t)(e - fs));
    char* fe = semi ? semi : e;
    char* feq = memchr(fs, '=', (size_t)(fe - fs));
    char *ks = fs, *ke = feq ? feq : fe, *vs = feq ? feq + 1 : fe, *ve = fe;
    trim(&ks, &ke);
    trim(&vs, &ve);
    bool ok;
    if (is_word(ks, ke, "rank")) {
      ok = whole_long(vs, ve, &f.rank);
      f.any_rank = false;
    } else if (is_word(ks, ke, "replacement")) {
      f.any_replacement = is_word(vs, ve, "any");
      ok = f.any_replacement || whole_long(vs, ve, &f.replacement);
    } else if (is_word(ks, ke, "trace") && ve > vs && (size_t)(ve - vs) < sizeof f.trace) {
      memcpy(f.trace, vs, (size_t)(ve - vs));
      f.trace[ve - vs] = 0;
      ok = true;
    } else
      ok = false;
    if (!ok) {
      WARN("PYCOLL_FAILPOINTS: the filter '%.*s' of %s is not rank=R, replacement=K|any or trace=PATH: the entry is "
           "ignored",
           (int)(fe - fs), fs, f.name);
      return;
    }
  }
  fp_entries[fp_count++] = f;
}

static void fp_read(void) {
  const char* spec = getenv("PYCOLL_FAILPOINTS");
  long rank = env_long("PYCOLL_RANK", LONG_MIN);
  fp_rank_known = rank != LONG_MIN; /* set, and an integer */
  fp_rank = fp_rank_known ? rank : -1;
  fp_replacement = env_long("PYCOLL_REPLACEMENT", 0);
  if (spec && *spec) {
    char* copy = strdup(spec);
    if (copy) {
      char *s = copy, *end = copy + strlen(copy);
      while (s < end) { /* entries end at a comma or a newline, as in Python's parse() */
        char* e = s;
        while (e < end && *e != ',' && *e != '\n') e++;
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
    if (!match || (!f->any_rank && (!fp_rank_known || f->rank != fp_rank))) continue;
    if (!f->any_replacement && f->replacement != fp_replacement) continue;
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
