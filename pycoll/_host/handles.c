#include "handles.h"

#include <pthread.h>
#include <stdlib.h>

struct entry {
  uintptr_t key; /* 0 empty, 1 deleted */
  int kind;
  size_t extra;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry* table;
static size_t cap, used, live;

void handle_lock(void) { pthread_mutex_lock(&mu); }
void handle_unlock(void) { pthread_mutex_unlock(&mu); }

static size_t slot_of(uintptr_t k) { return (size_t)mix64(k) & (cap - 1); }

static struct entry* find(uintptr_t k) {
  if (!cap) return NULL;
  for (size_t i = slot_of(k), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
    if (table[i].key == 0) return NULL;
    if (table[i].key == k) return &table[i];
  }
  return NULL;
}

static void grow(void) {
  size_t ncap = cap ? cap * 2 : 256;
  struct entry* old = table;
  size_t ocap = cap;
  table = calloc(ncap, sizeof *table);
  cap = ncap;
  used = live = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].key > 1) {
      size_t j = slot_of(old[i].key);
      while (table[j].key) j = (j + 1) & (cap - 1);
      table[j] = old[i];
      used++;
      live++;
    }
  free(old);
}

bool handle_valid_locked(const void* p, int kind) {
  struct entry* e = find((uintptr_t)p);
  return e && e->kind == kind;
}

bool handle_valid(const void* p, int kind) {
  handle_lock();
  bool ok = handle_valid_locked(p, kind);
  handle_unlock();
  return ok;
}

void handle_add(const void* p, int kind, size_t extra) {
  handle_lock();
  if ((used + 1) * 2 > cap) grow();
  uintptr_t k = (uintptr_t)p;
  size_t i = slot_of(k);
  while (table[i].key > 1 && table[i].key != k) i = (i + 1) & (cap - 1);
  if (table[i].key <= 1) {
    if (table[i].key == 0) used++;
    live++;
  }
  table[i].key = k;
  table[i].kind = kind;
  table[i].extra = extra;
  handle_unlock();
}

bool handle_remove(const void* p, int kind, size_t* extra) {
  handle_lock();
  struct entry* e = find((uintptr_t)p);
  bool ok = e && e->kind == kind;
  if (ok) {
    if (extra) *extra = e->extra;
    e->key = 1;
    live--;
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
