/* Groups (ncclGroupStart/End) and background jobs. Inside a group, operations are collected and
 * run together at ncclGroupEnd; communicator jobs (init, finalize, split, shrink, grow) run
 * concurrently, each in its own thread, so one thread can initialise or reshape several
 * communicators whose ranks live in this process. Outside a group a job runs in the calling
 * thread (blocking communicator) or in a background thread (nonblocking: ncclInProgress). */
#ifndef PYCOLL_GROUP_H
#define PYCOLL_GROUP_H

#include "core.h"
#include "enqueue.h"

enum job_kind { JOB_INIT = 1, JOB_FINALIZE, JOB_SPLIT, JOB_SHRINK, JOB_GROW, JOB_WINDOW };

struct job {
  int kind;
  const char* opname;
  struct ncclComm* comm;   /* the comm whose async state reports the job */
  struct ncclComm* child;  /* split/shrink: the comm being created */
  ncclComm_t* slot;        /* split/shrink: written when the child is ready; init/grow: *newcomm */
  struct ncclComm* parent; /* split/shrink/grow from an existing comm */
  /* init and grow */
  int nranks, rank, seg_kind;
  uint64_t nonce[2];
  uint64_t ids_hash;
  struct proc_id* expected;
  /* split */
  int color, key;
  /* shrink */
  int* exclude;
  int nexclude;
  int flags;
  uint64_t child_seq;
  uint64_t prev_child_count; /* grow: the parent's count of reshapes before this one (restored if it fails) */
  struct ncclWindow_vidmem* window; /* window registration (window.c) */
  ncclResult_t result;
  pthread_t thread;
  struct job* next;
};

int group_depth(void);
/* Whether this thread's open group holds an operation of `c` (issued only at its ncclGroupEnd). */
bool group_holds(const struct ncclComm* c);
/* Records an error returned inside a group: ncclGroupEnd then fails and drops the group. */
ncclResult_t group_note_error(ncclResult_t r);
ncclResult_t group_add_task(struct task* t);

/* Runs a job now, in the background, or at ncclGroupEnd. Takes ownership of `j`. */
ncclResult_t job_launch(struct job* j);
void job_free(struct job* j);

/* Job bodies (init.c, reshape.c). */
ncclResult_t job_run_init(struct job* j);
ncclResult_t job_run_finalize(struct job* j);
ncclResult_t job_run_reshape(struct job* j);
ncclResult_t job_run_window(struct job* j);
void job_window_done(struct job* j);

#endif
