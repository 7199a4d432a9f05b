#include "exitwatch.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "comm.h"
#include "debug.h"
#include "segment.h"
#include "wait.h"

/* The watched communicators (a list through watch_next) and the epoll instance, under `mu`. An event
 * carries the exited process's pid and start time, never a pointer: it is matched against the
 * communicators watched when it is handled, so a communicator removed meanwhile is never touched. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cv = PTHREAD_COND_INITIALIZER;
static struct ncclComm* watched;
static int epfd = -1;
static bool started, ready, atfork_set;

/* The life words of this process's ranks (segment.h) hang in the watcher thread's robust list, which
 * replaces glibc's for that thread (it never takes a robust mutex). The kernel reads the list only when
 * the thread ends; it is changed under `mu`, one pointer store at a time, so that it is whole at any
 * moment the process may be killed. `life_tid`: the watcher's thread id, 0 when it has no robust list. */
static struct robust_list_head life_head;
static uint32_t life_tid;

static uint64_t key_of(const struct proc_id* p) { return (uint64_t)(uint32_t)p->pid << 32 | (uint32_t)p->start; }

static void mark_gone(uint64_t key) {
  pthread_mutex_lock(&mu);
  for (struct ncclComm* c = watched; c; c = c->watch_next) {
    bool hit = false;
    for (int k = 0; k < c->nranks; k++) {
      if (c->peers[k].pidfd >= 0 && key_of(&c->peers[k].proc) == key) {
        __atomic_store_n(&c->peers[k].gone, true, __ATOMIC_RELEASE);
        hit = true;
      }
    }
    if (hit) doorbell_wake(&c->seg.hdr->bell);
  }
  pthread_mutex_unlock(&mu);
}

static void* watch_main(void* arg) {
  int fd = (int)(intptr_t)arg;
  uint32_t tid = 0;
  if (syscall(SYS_set_robust_list, &life_head, sizeof life_head) == 0) tid = (uint32_t)syscall(SYS_gettid);
  else INFO("exit watcher: no robust list (%s): peers find this process's exit through its pidfd", strerror(errno));
  pthread_mutex_lock(&mu);
  life_tid = tid & FUTEX_TID_MASK;
  ready = true;
  pthread_cond_broadcast(&ready_cv);
  pthread_mutex_unlock(&mu);
  struct epoll_event ev[16];
  for (;;) {
    int n = epoll_wait(fd, ev, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      WARN("pycoll host library: the exit watcher stops: epoll_wait: %s", strerror(errno));
      return NULL; /* the waiters still find exited peers at their periodic look */
    }
    for (int i = 0; i < n; i++) mark_gone(ev[i].data.u64);
  }
}

/* In a forked child: no watcher thread runs, and the epoll instance and the communicators are the
 * parent's. The child starts afresh (the first communicator it makes starts its own watcher). */
static void after_fork_child(void) {
  pthread_mutex_init(&mu, NULL);
  pthread_cond_init(&ready_cv, NULL);
  if (epfd >= 0) close(epfd);
  epfd = -1;
  started = ready = false;
  watched = NULL;
  life_tid = 0;
}

/* mu held */
static bool ensure_started(void) {
  if (started) return epfd >= 0;
  started = true;
  if (!atfork_set) {
    pthread_atfork(NULL, NULL, after_fork_child);
    atfork_set = true;
  }
  life_head.list.next = &life_head.list;
  life_head.futex_offset = (long)(offsetof(struct rank_ctrl, life) - offsetof(struct rank_ctrl, life_next));
  life_head.list_op_pending = NULL;
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) {
    WARN("pycoll host library: no exit watcher: epoll_create1: %s", strerror(errno));
    return false;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay with the application's threads */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_t t;
  int r = pthread_create(&t, &attr, watch_main, (void*)(intptr_t)epfd);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) {
    WARN("pycoll host library: no exit watcher: pthread_create: %s", strerror(r));
    close(epfd);
    epfd = -1;
    return false;
  }
  while (!ready) pthread_cond_wait(&ready_cv, &mu); /* its thread id goes into the life words */
  return true;
}

/* mu held: this rank's life word carries the watcher's thread id and joins its robust list. */
static void life_link(struct ncclComm* c) {
  if (!life_tid || c->rank < 0 || c->life_linked) return;
  struct rank_ctrl* me = &c->seg.ctrl[c->rank];
  __atomic_store_n(&me->life, life_tid | FUTEX_WAITERS, __ATOMIC_RELEASE); /* waiters: the kernel wakes one */
  me->life_next = (uint64_t)(uintptr_t)life_head.list.next;
  __atomic_store_n(&life_head.list.next, (struct robust_list*)&me->life_next, __ATOMIC_RELEASE);
  c->life_linked = true;
}

/* mu held: out of the robust list before the segment is unmapped (the word itself stays: a peer reads
 * the rank's state first, and a rank that left is no longer waited for). */
static void life_unlink(struct ncclComm* c) {
  if (!c->life_linked) return;
  struct robust_list* node = (struct robust_list*)&c->seg.ctrl[c->rank].life_next;
  for (struct robust_list** p = &life_head.list.next; *p != &life_head.list; p = &(*p)->next) {
    if (*p == node) {
      __atomic_store_n(p, node->next, __ATOMIC_RELEASE);
      break;
    }
  }
  c->life_linked = false;
}

void exitwatch_add(struct ncclComm* c) {
  pthread_mutex_lock(&mu);
  if (ensure_started()) {
    for (int k = 0; k < c->nranks; k++) {
      if (c->peers[k].pidfd < 0) continue;
      /* once: an exited process's pidfd stays readable, and one wake-up is all it takes */
      struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = key_of(&c->peers[k].proc)};
      if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->peers[k].pidfd, &ev) != 0)
        INFO("exit watcher: cannot watch rank %d (pid %d): %s", k, c->peers[k].proc.pid, strerror(errno));
    }
    life_link(c);
  }
  c->watch_next = watched;
  watched = c;
  c->watch_listed = true;
  pthread_mutex_unlock(&mu);
}

void exitwatch_remove(struct ncclComm* c) {
  pthread_mutex_lock(&mu);
  if (c->watch_listed) {
    for (struct ncclComm** p = &watched; *p; p = &(*p)->watch_next) {
      if (*p == c) {
        *p = c->watch_next;
        break;
      }
    }
    c->watch_listed = false;
  }
  life_unlink(c);
  /* the pidfds leave the epoll set when they are closed (they are never duplicated) */
  pthread_mutex_unlock(&mu);
}
