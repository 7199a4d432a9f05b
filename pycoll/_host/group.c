#include "group.h"

#include <stdlib.h>
#include <string.h>

#include "debug.h"
#include "stream.h"

static __thread int depth;
static __thread ncclResult_t group_error;
static __thread int group_blocking = -1;
static __thread struct task *task_head, *task_tail;
static __thread struct job *job_head, *job_tail;

int group_depth(void) { return depth; }

bool group_holds(const struct ncclComm* c) {
  for (const struct task* t = task_head; t; t = t->next)
    if (t->comm == c) return true;
  return false;
}

ncclResult_t group_note_error(ncclResult_t r) {
  if (depth > 0 && r != ncclSuccess && r != ncclInProgress && group_error == ncclSuccess) group_error = r;
  return r;
}

static ncclResult_t check_blocking(struct ncclComm* c) {
  int b = COMM_FLAG(c, destroy_called) ? 1 : c->config.blocking;
  if (group_blocking == -1) {
    group_blocking = b;
  } else if (group_blocking != b) {
    WARN("Blocking and nonblocking communicators are not allowed in the same group.");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t group_add_task(struct task* t) {
  ncclResult_t r = check_blocking(t->comm);
  if (r != ncclSuccess) {
    t->next = NULL;
    tasks_finish(t, true);
    return group_note_error(r);
  }
  t->next = NULL;
  if (task_tail) task_tail->next = t;
  else task_head = t;
  task_tail = t;
  return ncclSuccess;
}

/* ---- jobs ---- */

void job_free(struct job* j) {
  if (j->window) job_window_done(j);
  if (j->comm) comm_release(j->comm);
  if (j->parent && j->parent != j->comm) comm_release(j->parent);
  free(j->exclude);
  free(j->expected);
  free(j);
}

static void job_discard_new_comm(struct job* j) {
  struct ncclComm* c = j->kind == JOB_INIT || j->kind == JOB_GROW ? j->comm : j->child;
  if (!c) return;
  if (comm_unregister(c)) {
    comm_teardown(c, RS_ABORTED);
    comm_release(c); /* the registry's reference */
  }
  if (j->slot && (j->kind == JOB_INIT || j->kind == JOB_GROW)) __atomic_store_n(j->slot, NULL, __ATOMIC_RELEASE);
}

static void job_complete(struct job* j, ncclResult_t r) {
  j->result = r;
  switch (j->kind) {
    case JOB_INIT:
    case JOB_GROW:
      if (r != ncclSuccess && j->kind == JOB_GROW && j->parent) {
        /* a grow that failed here counts as no reshape of the parent: a member that never reached it (it found
         * the communicator failed first) would otherwise number the parent's next shrink or split otherwise,
         * and the two would wait for each other's exchange until their timeout */
        pthread_mutex_lock(&j->parent->mu);
        if (j->parent->child_count == j->child_seq) j->parent->child_count = j->prev_child_count;
        pthread_mutex_unlock(&j->parent->mu);
      }
      if (r == ncclSuccess) {
        comm_set_async(j->comm, ncclSuccess);
      } else if (j->comm->config.blocking) {
        comm_set_async(j->comm, r);
        job_discard_new_comm(j);
      } else {
        comm_set_async(j->comm, r);
      }
      break;
    case JOB_FINALIZE:
      comm_set_async(j->comm, r);
      break;
    case JOB_WINDOW: /* a refused window leaves the communicator usable (the window carries the error) */
      comm_set_async(j->comm, r == ncclInvalidArgument ? ncclSuccess : r);
      break;
    case JOB_SPLIT:
    case JOB_SHRINK:
      if (r == ncclSuccess && j->child) {
        comm_set_async(j->child, ncclSuccess);
        __atomic_store_n(j->slot, j->child, __ATOMIC_RELEASE);
        comm_release(j->child); /* the job's reference; the registry keeps its own */
        j->child = NULL;
      } else if (j->child) { /* never registered */
        comm_teardown(j->child, RS_ABORTED);
        comm_release(j->child);
        comm_release(j->child);
        j->child = NULL;
      }
      comm_set_async(j->comm, r);
      break;
  }
}

static ncclResult_t job_body(struct job* j) {
  switch (j->kind) {
    case JOB_INIT:
    case JOB_GROW: return job_run_init(j);
    case JOB_FINALIZE: return job_run_finalize(j);
    case JOB_WINDOW: return job_run_window(j);
    default: return job_run_reshape(j);
  }
}

static ncclResult_t job_exec(struct job* j) {
  struct ncclComm* c = j->comm;
  ncclResult_t r = job_body(j);
  if (r != ncclSuccess) ph_last_error_to_comm(c);
  job_complete(j, r);
  return r;
}

static void* job_thread_detached(void* arg) {
  struct job* j = arg;
  struct ncclComm* c = j->comm;
  comm_ref(c);
  job_exec(j);
  job_free(j);
  __atomic_sub_fetch(&c->job_running, 1, __ATOMIC_ACQ_REL);
  comm_release(c);
  return NULL;
}

static void* job_thread_joined(void* arg) {
  struct job* j = arg;
  job_exec(j);
  return NULL;
}

/* 0, or why the thread did not start (pthread_create's error number: it sets no errno) */
static int spawn(struct job* j, void* (*fn)(void*), bool detached) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int e = pthread_create(&j->thread, &attr, fn, j);
  pthread_attr_destroy(&attr);
  return e;
}

static ncclResult_t run_jobs(struct job* list, bool blocking) {
  ncclResult_t ret = ncclSuccess;
  for (struct job* j = list; j; j = j->next) {
    __atomic_add_fetch(&j->comm->job_running, 1, __ATOMIC_ACQ_REL);
    if (!blocking) comm_set_async(j->comm, ncclInProgress);
  }
  if (!blocking) {
    for (struct job *j = list, *next; j; j = next) {
      next = j->next;
      int e = spawn(j, job_thread_detached, true);
      if (e != 0) {
        CWARN(j->comm, "ncclGroupEnd : cannot start a thread for %s: %s (a limit on threads or processes?)", j->opname,
              strerror(e));
        job_complete(j, ncclSystemError);
        __atomic_sub_fetch(&j->comm->job_running, 1, __ATOMIC_ACQ_REL);
        job_free(j);
        ret = ncclSystemError;
      }
    }
    return ret == ncclSuccess ? ncclInProgress : ret;
  }
  if (!list->next) { /* a single job runs in the calling thread */
    ret = job_exec(list);
  } else {
    for (struct job* j = list; j; j = j->next)
      if (spawn(j, job_thread_joined, false) != 0) j->thread = 0, job_exec(j);
    for (struct job* j = list; j; j = j->next) {
      if (j->thread) pthread_join(j->thread, NULL);
      if (ret == ncclSuccess && j->result != ncclSuccess) ret = j->result;
    }
  }
  for (struct job *j = list, *next; j; j = next) {
    next = j->next;
    struct ncclComm* c = j->comm;
    comm_ref(c);
    job_free(j);
    __atomic_sub_fetch(&c->job_running, 1, __ATOMIC_ACQ_REL);
    comm_release(c);
  }
  return ret;
}

ncclResult_t job_launch(struct job* j) {
  j->next = NULL;
  if (depth > 0) {
    ncclResult_t r = check_blocking(j->comm);
    if (r != ncclSuccess) {
      job_complete(j, r);
      job_free(j);
      return group_note_error(r);
    }
    if (job_tail) job_tail->next = j;
    else job_head = j;
    job_tail = j;
    return ncclSuccess;
  }
  return run_jobs(j, j->comm->config.blocking);
}

/* ---- group calls ---- */

NCCL_API ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

static float estimate_us(struct task* list) {
  float us = 0;
  for (struct task* t = list; t; t = t->next) {
    size_t bytes = t->count * dt_size(t->dtype);
    us += 5.0f + (float)bytes / 2000.0f; /* ~5 us latency, ~2 GB/s through shared memory */
  }
  return us;
}

static bool spans_streams(const struct task* list) {
  for (const struct task* t = list->next; t; t = t->next)
    if (t->stream != list->stream) return true;
  return false;
}

/* A group whose tasks are on more than one stream: NCCL matches a group's operations across the ranks in the order
 * they were issued, whatever their streams, and joins those streams around the group (the group runs after the work
 * queued on each before it, and the work queued on each after the group runs after it). Run per stream, the
 * streams' lists would meet the other ranks' in an order the threads' timing decides: a mismatch, or silently the
 * wrong pairs where their shapes agree. So the whole list runs on the first task's stream (the first that is not
 * NULL), joined with the others; NULL-stream tasks in it make the group return once it has run. */
static ncclResult_t submit_joined(struct task* tasks, void** done) {
  pycollStream_t s = NULL, small[8], *others = small;
  int n = 0, cap = 8;
  bool has_null = false;
  ncclResult_t r = ncclSuccess;
  for (struct task* t = tasks; t && r == ncclSuccess; t = t->next) {
    if (!t->stream) {
      has_null = true;
      continue;
    }
    if (!s) {
      s = t->stream;
      continue;
    }
    bool seen = t->stream == s;
    for (int i = 0; i < n && !seen; i++) seen = others[i] == t->stream;
    if (seen) continue;
    if (n == cap) {
      pycollStream_t* grown = malloc(sizeof *grown * (size_t)cap * 2);
      if (!grown) {
        r = ncclSystemError;
        break;
      }
      memcpy(grown, others, sizeof *grown * (size_t)n);
      if (others != small) free(others);
      others = grown;
      cap *= 2;
    }
    others[n++] = t->stream;
  }
  if (r == ncclSuccess) r = stream_submit_joined(s, others, n, tasks, has_null ? done : NULL);
  if (r != ncclSuccess) tasks_finish(tasks, true);
  if (others != small) free(others);
  return r;
}

/* The communicators of a group's tasks, each entered (comm_enter) while its tasks are queued: `in` false where
 * comm_enter refused it (aborted or revoked) or there was no memory to note it (then as before: not entered). */
struct group_comm {
  struct ncclComm* c;
  bool in;
};
struct group_comms {
  struct group_comm* v;
  int n, cap;
  struct group_comm small[8];
};

/* A communicator aborted from another thread while this thread's group held its operations: pycoll destroys its
 * stream once ncclCommAbort returns, and the group's list -- a group of several streams runs as one list on its
 * first operation's stream -- went to a stream that no thread ran any more, the other communicators' operations
 * with it; their streams, joined after it, then waited for it for ever (their destroy, in an abort, too). So the
 * tasks of a communicator aborted or revoked before the group ends fail here, in this thread (run_tasks fails them
 * at once: comm_enter refuses their communicator), and leave its streams alone; and each other communicator stays
 * entered until its tasks are queued (group_leave): an abort that comes meanwhile waits for that
 * (comm_wait_inactive), so the destroy of the communicator's stream that follows it finds them queued and runs
 * them -- the aborted communicator's failing at once -- before it stops. Returns the tasks to queue. */
static struct task* group_enter(struct task* tasks, struct group_comms* g) {
  g->v = g->small;
  g->n = 0;
  g->cap = 8;
  struct task *keep = NULL, **keep_tail = &keep, *gone = NULL, **gone_tail = &gone;
  for (struct task *t = tasks, *next; t; t = next) {
    next = t->next;
    t->next = NULL;
    int i = 0;
    while (i < g->n && g->v[i].c != t->comm) i++;
    if (i == g->n) {
      if (g->n == g->cap) {
        struct group_comm* grown = malloc(sizeof *grown * (size_t)g->cap * 2);
        if (!grown) { /* not noted: queued, not entered, as before */
          *keep_tail = t;
          keep_tail = &t->next;
          continue;
        }
        memcpy(grown, g->v, sizeof *grown * (size_t)g->n);
        if (g->v != g->small) free(g->v);
        g->v = grown;
        g->cap *= 2;
      }
      g->v[i].c = t->comm;
      g->v[i].in = comm_enter(t->comm);
      if (g->v[i].in) comm_ref(t->comm); /* alive until group_leave, whoever finishes its tasks first */
      g->n++;
    }
    if (g->v[i].in) {
      *keep_tail = t;
      keep_tail = &t->next;
    } else {
      *gone_tail = t;
      gone_tail = &t->next;
    }
  }
  if (gone) {
    run_tasks(gone); /* they fail at once; their failures land in their communicators' errors */
    tasks_finish(gone, true);
  }
  return keep;
}

static void group_leave(struct group_comms* g) {
  for (int i = 0; i < g->n; i++)
    if (g->v[i].in) {
      comm_leave(g->v[i].c);
      comm_release(g->v[i].c);
    }
  if (g->v != g->small) free(g->v);
  g->n = 0;
}

static ncclResult_t group_flush(ncclSimInfo_t* sim) {
  ncclResult_t err = group_error;
  int blocking = group_blocking;
  struct task* tasks = task_head;
  struct job* jobs = job_head;
  group_error = ncclSuccess;
  group_blocking = -1;
  task_head = task_tail = NULL;
  job_head = job_tail = NULL;

  ncclSimInfo_t info;
  if (err == ncclSuccess && sim) {
    size_t size;
    memcpy(&size, sim, sizeof size);
    memset(&info, 0, sizeof info);
    memcpy(&info, sim, MIN(size, sizeof info));
    if (info.magic != NCCL_SIM_INFO_MAGIC) {
      WARN("ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER");
      err = ncclInvalidArgument;
    }
  }
  if (err != ncclSuccess) {
    tasks_finish(tasks, true);
    for (struct job *j = jobs, *next; j; j = next) {
      next = j->next;
      job_complete(j, err);
      job_free(j);
    }
    return err;
  }
  ncclResult_t ret = ncclSuccess;
  if (jobs) ret = run_jobs(jobs, blocking != 0);
  if (sim) {
    info.estimatedTime = estimate_us(tasks);
    size_t size;
    memcpy(&size, sim, sizeof size);
    memcpy(sim, &info, MIN(size, sizeof info));
    tasks_finish(tasks, true);
    return ret;
  }
  struct group_comms held;
  tasks = group_enter(tasks, &held);
  if (tasks && spans_streams(tasks)) {
    void* done = NULL; /* NULL-stream tasks in the list: it has run once this fires */
    ncclResult_t r = submit_joined(tasks, &done);
    group_leave(&held); /* before the wait: an abort does not wait for the group's operations to run */
    if (done) stream_marker_wait(done);
    return r != ncclSuccess && (ret == ncclSuccess || ret == ncclInProgress) ? r : ret;
  }
  /* queue the tasks of each stream first, so they progress while the NULL-stream tasks run here */
  struct task *local = NULL, **local_tail = &local;
  while (tasks) {
    struct task* t = tasks;
    tasks = t->next;
    t->next = NULL;
    if (!t->stream) {
      *local_tail = t;
      local_tail = &t->next;
      continue;
    }
    struct task *same = t, **tail = &t->next, *rest = NULL, **rest_tail = &rest;
    while (tasks) {
      struct task* u = tasks;
      tasks = u->next;
      u->next = NULL;
      if (u->stream == t->stream) {
        *tail = u;
        tail = &u->next;
      } else {
        *rest_tail = u;
        rest_tail = &u->next;
      }
    }
    tasks = rest;
    ncclResult_t r = stream_submit(t->stream, same);
    if (r != ncclSuccess) {
      tasks_finish(same, true);
      if (ret == ncclSuccess || ret == ncclInProgress) ret = r;
    }
  }
  group_leave(&held); /* before the NULL-stream tasks run here, as an abort may come while they do */
  if (local) {
    stream_order_wait(local);
    ncclResult_t r = run_tasks(local);
    tasks_finish(local, true);
    if (r != ncclSuccess && (ret == ncclSuccess || ret == ncclInProgress)) ret = r;
  }
  return ret;
}

NCCL_API ncclResult_t ncclGroupEnd(void) {
  if (depth == 0) {
    WARN("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--depth > 0) return ncclSuccess;
  return group_flush(NULL);
}

NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (depth == 0) {
    WARN("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--depth > 0) return ncclSuccess;
  if (!simInfo) {
    WARN("ncclGroupSimulateEnd : simInfo argument is NULL");
    group_error = ncclInvalidArgument;
  }
  return group_flush(simInfo);
}
