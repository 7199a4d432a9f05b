#include "handles.h"

#include <pthread.h>
#include <stdlib.h>

struct entry {
  uintptr_t key; /* 0 empty, 1 deleted */
  int kind;
  size_t extra;
};

/* The table and its size in one allocation, so that a reader without the lock sees a consistent pair.
 * A table outgrown is never freed: a reader may still be in it (the tables double, so all of them
 * together take at most twice the last one). */
struct table {
  size_t cap;
  struct table* older;
  struct entry e[];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct table* tab;
static size_t used, live;
/* Odd while a writer changes the table (under mu): handle_valid reads without the lock and looks
 * again when a writer came in between (a seqlock). */
static unsigned long seq;

void handle_lock(void) { pthread_mutex_lock(&mu); }
void handle_unlock(void) { pthread_mutex_unlock(&mu); }

static void write_begin(void) { __atomic_store_n(&seq, seq + 1, __ATOMIC_RELAXED); __atomic_thread_fence(__ATOMIC_RELEASE); }
static void write_end(void) { __atomic_store_n(&seq, seq + 1, __ATOMIC_RELEASE); }

static size_t slot_of(uintptr_t k, size_t cap) { return (size_t)mix64(k) & (cap - 1); }

static uintptr_t key_of(const struct entry* e) { return __atomic_load_n(&e->key, __ATOMIC_RELAXED); }

static struct entry* find_in(struct table* t, uintptr_t k) {
  if (!t) return NULL;
  size_t cap = t->cap;
  for (size_t i = slot_of(k, cap), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
    uintptr_t x = key_of(&t->e[i]);
    if (x == 0) return NULL;
    if (x == k) return &t->e[i];
  }
  return NULL;
}

static void grow(void) {
  struct table* old = tab;
  size_t ocap = old ? old->cap : 0, ncap = ocap ? ocap * 2 : 256;
  struct table* t = calloc(1, sizeof *t + ncap * sizeof(struct entry));
  if (!t) abort();
  t->cap = ncap;
  t->older = old;
  used = live = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old->e[i].key > 1) {
      size_t j = slot_of(old->e[i].key, ncap);
      while (t->e[j].key) j = (j + 1) & (ncap - 1);
      t->e[j] = old->e[i];
      used++;
      live++;
    }
  __atomic_store_n(&tab, t, __ATOMIC_RELEASE);
}

/* A table mostly of tombstones (handles removed) is rehashed where it is, not doubled: a loop making and freeing
 * handles at ever new addresses (a window registered and closed each step) doubled it again and again, every
 * table kept, with one handle live. A reader in it meanwhile sees the write's seq and looks again. */
static bool rehash(void) {
  size_t cap = tab->cap, n = 0;
  struct entry* keep = malloc((live ? live : 1) * sizeof *keep);
  if (!keep) return false;
  for (size_t i = 0; i < cap; i++)
    if (tab->e[i].key > 1) keep[n++] = tab->e[i];
  for (size_t i = 0; i < cap; i++) __atomic_store_n(&tab->e[i].key, (uintptr_t)0, __ATOMIC_RELAXED);
  for (size_t k = 0; k < n; k++) {
    size_t j = slot_of(keep[k].key, cap);
    while (tab->e[j].key) j = (j + 1) & (cap - 1);
    tab->e[j].kind = keep[k].kind;
    tab->e[j].extra = keep[k].extra;
    __atomic_store_n(&tab->e[j].key, keep[k].key, __ATOMIC_RELAXED);
  }
  used = live = n;
  free(keep);
  return true;
}

bool handle_valid_locked(const void* p, int kind) {
  struct entry* e = find_in(tab, (uintptr_t)p);
  return e && e->kind == kind;
}

/* Without the lock (every call validates its handles, several per operation): a seqlock read. */
bool handle_valid(const void* p, int kind) {
  for (int tries = 0; tries < 4; tries++) {
    unsigned long s0 = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
    if (s0 & 1) continue;
    struct entry* e = find_in(__atomic_load_n(&tab, __ATOMIC_ACQUIRE), (uintptr_t)p);
    bool ok = e && __atomic_load_n(&e->kind, __ATOMIC_RELAXED) == kind;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&seq, __ATOMIC_RELAXED) == s0) return ok;
  }
  handle_lock(); /* writers kept coming: take the lock */
  bool ok = handle_valid_locked(p, kind);
  handle_unlock();
  return ok;
}

void handle_add(const void* p, int kind, size_t extra) {
  handle_lock();
  write_begin();
  if (!tab || (used + 1) * 2 > tab->cap)
    if (!tab || (live + 1) * 4 > tab->cap || !rehash()) grow();
  size_t cap = tab->cap;
  uintptr_t k = (uintptr_t)p;
  size_t i = slot_of(k, cap);
  while (tab->e[i].key > 1 && tab->e[i].key != k) i = (i + 1) & (cap - 1);
  struct entry* e = &tab->e[i];
  if (e->key <= 1) {
    if (e->key == 0) used++;
    live++;
  }
  __atomic_store_n(&e->kind, kind, __ATOMIC_RELAXED);
  e->extra = extra;
  __atomic_store_n(&e->key, k, __ATOMIC_RELAXED);
  write_end();
  handle_unlock();
}

bool handle_remove(const void* p, int kind, size_t* extra) {
  handle_lock();
  struct entry* e = find_in(tab, (uintptr_t)p);
  bool ok = e && e->kind == kind;
  if (ok) {
    write_begin();
    if (extra) *extra = e->extra;
    __atomic_store_n(&e->key, (uintptr_t)1, __ATOMIC_RELAXED);
    live--;
    write_end();
  }
  handle_unlock();
  return ok;
}

#define QUARANTINE 512
static void* quarantine[QUARANTINE];
static size_t qnext;

void quarantine_free(void* p) {
  handle_lock();
  void* old = quarantine[qnext];
  quarantine[qnext] = p;
  qnext = (qnext + 1) % QUARANTINE;
  handle_unlock();
  free(old);
}
