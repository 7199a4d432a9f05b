/* Host streams and events: CUDA's shape on a CPU. A stream is a thread running what is enqueued
 * on it in order; an event recorded on a stream completes when the stream reaches it. */
#ifndef PYCOLL_STREAM_H
#define PYCOLL_STREAM_H

#include "core.h"
#include "enqueue.h"

bool stream_valid(pycollStream_t s);
bool event_valid(pycollEvent_t e);
/* Whether the last records of `start` and `end` have completed, and either `end`'s before t_ns (now_ns's clock; 0:
 * never) or, both recorded on one stream, no operation of that stream ended failed between them (NULL stream: of
 * the process, host_tasks_failed). */
bool events_clean(pycollEvent_t start, pycollEvent_t end, uint64_t t_ns);
/* An operation of stream `s` (0, 1 and 2: none) ended failed (finish_task). */
void stream_note_failed(pycollStream_t s);
/* Queues a list of tasks (one group's tasks for this stream) to run together, in order. */
ncclResult_t stream_submit(pycollStream_t s, struct task* list);
/* Queues one group's tasks spanning several streams on `s`, in issue order, as NCCL joins a group's streams: the
 * list waits for the work queued so far on the `n` streams `others`, and their work queued from now on waits for
 * the list. `done` (it holds NULL-stream tasks, which run before the group returns): not NULL, *done is a marker
 * that fires once the list has run, for stream_marker_wait (NULL: it has run already). An error: nothing was queued
 * (the caller finishes the list). */
ncclResult_t stream_submit_joined(pycollStream_t s, pycollStream_t const* others, int n, struct task* list,
                                  void** done);
/* Waits for a marker stream_submit_joined gave and releases it (its stream may be destroyed meanwhile: a destroy runs
 * what was queued before it stops). */
void stream_marker_wait(void* m);
/* A task list about to run in the calling thread (the NULL stream) waits here for its communicators' unfinished
 * tasks submitted to streams before it (their operations run in issue order, as NCCL's). */
void stream_order_wait(struct task* list);
/* A task finished (tasks_finish): what waits for it as its communicator's last goes on. */
void stream_order_done(struct task* t);
/* What a stream handle means for the calling thread (NULL, 1, 2: see pycollStreamSetLegacy). */
pycollStream_t stream_resolve(pycollStream_t s);
/* Records `e` on `s` (NULL: completes now). */
ncclResult_t stream_record(pycollEvent_t e, pycollStream_t s);

/* Launch-completion events of the *Config collectives: armed at enqueue, fired when the operation
 * starts executing. */
void* event_arm(pycollEvent_t e);
void marker_fire(void* m);
void marker_release(void* m);

#endif
