/* pycoll host library: the functions it exports beyond the NCCL C ABI.
 *
 * The host library (libpycoll_host.so) exports the NCCL 2.32 host API (same names, signatures,
 * return codes) and moves data in host memory between processes of one machine over POSIX shared
 * memory. The `cudaStream_t stream` argument of every collective is a pycollStream_t created here
 * (or NULL, which runs the operation in the calling thread -- on a nonblocking communicator too: the call returns
 * when the operation has run or failed, never ncclInProgress, and waits as long as a live peer stays away; only an
 * abort or revoke from another thread, or the peer's death, ends it early; pass a stream for a call that returns at
 * once). Streams and events have CUDA's shape:
 * work enqueued on a stream runs in order on the stream's own thread; an event recorded on a
 * stream completes when everything enqueued before it has run. Errors of enqueued work are
 * reported through ncclCommGetAsyncError, never through events.
 *
 * Every function returns an ncclResult_t (ncclInvalidArgument for NULL/invalid handles, with a
 * ncclGetLastError text).
 *
 * Where the host library decides what NCCL leaves open:
 *   - An operation interrupted by ncclCommAbort or ncclCommRevoke returns ncclInvalidUsage; a
 *     peer that died, aborted, revoked or destroyed the communicator while this rank waits for it
 *     gives ncclRemoteError. Mismatched operations (type, count, datatype, op, root) across ranks
 *     give ncclInvalidUsage naming both ranks -- on the ranks that compare them: a rank that completes without
 *     waiting for its peers' calls (the sender of a small Send, the root of a Broadcast or Scatter and the other
 *     ranks of a Gather or Reduce on the eager lane) returns ncclSuccess, and only its peers report the mismatch.
 *   - An init whose rendezvous still misses ranks after PYCOLL_HOST_INIT_TIMEOUT returns ncclTimeout (on the ranks
 *     that came too), naming the missing ranks (NCCL itself waits for ever). A rank that arrives at a rendezvous
 *     whose first rank's process is gone (it made the segment and died there) returns ncclRemoteError at once.
 *   - ncclCommFinalize waits for the operations enqueued on the communicator and then for every
 *     rank to finalize or destroy it; ncclCommDestroy is local.
 *   - A stream holds at most PYCOLL_HOST_STREAM_DEPTH operations queued and not begun (a GPU's launch queue
 *     holds about 1024 kernels): a collective, or the ncclGroupEnd of a group, queuing one more onto a full stream
 *     waits until one is taken. The wait ends with the error that the work queued before it meets when the
 *     communicator is aborted (ncclInvalidUsage), revoked (ncclInvalidUsage) or fails (its error; a peer that
 *     exited: ncclRemoteError), nothing queued; and with the operation queued over the bound when a signal is
 *     delivered to the waiting thread, so that the caller handles it. The NULL stream queues nothing.
 *   - Memory statistics are 0 (no GPU memory). ncclCommWindowRegister is collective: every rank maps
 *     every peer's ncclMemAlloc memory (window.c); an AllReduce whose buffers lie in windows on every
 *     rank reduces straight between them (coll.c).
 *
 * Environment (read once per process unless noted):
 *   NCCL_COMM_BLOCKING        overrides config.blocking (0/1), as in NCCL
 *   NCCL_DEBUG=WARN|INFO      log to stderr
 *   PYCOLL_HOST_INIT_TIMEOUT  seconds a rendezvous waits for missing ranks (300; 0: forever),
 *                             read at every init
 *   PYCOLL_HOST_SPIN_NS       how long a waiter spins before yielding (50000) when its peer runs
 *                             on another CPU; waiters yield at once when the peer shares their CPU
 *   PYCOLL_HOST_YIELD_NS      how long it then yields before sleeping on a futex (300000)
 *   PYCOLL_HOST_YIELD_ADAPT   1 (default): where most of a communicator's waits for its peers that
 *                             yielded that long slept anyway of late (other processes compete for the
 *                             CPUs), they yield 25 us before sleeping, every 32nd the whole budget
 *                             (wait.h: struct yield_record); 0: always the whole budget
 *   PYCOLL_HOST_PEER_CHECK_NS how often a waiter looks at its peers' processes, and its longest sleep
 *                             (1000000; 100000 to 1e10); a peer on this host that dies wakes it at
 *                             once anyway (its life word, a robust futex, and the exit watcher)
 *   PYCOLL_HOST_ONESHOT_MAX   AllReduce/Reduce up to this many bytes use one phase (32768)
 *   PYCOLL_HOST_CHUNK_BYTES   pipeline chunk of larger AllReduce/Reduce (524288; 64 to 2^30)
 *   PYCOLL_HOST_STREAM_MIN    AllReduce/Reduce outputs, and those of operations over windows, of at
 *                             least this many bytes are written with streaming stores (0: never); unset,
 *                             from 8 MiB on each size class takes the stores its first six operations
 *                             measured faster (coll.c)
 *   PYCOLL_HOST_WINDOW_ALLREDUCE  0: no AllReduce goes straight between windows (1, the default)
 *   PYCOLL_HOST_WINDOW_COLLECTIVES  0: no Reduce, Broadcast, AllGather, ReduceScatter, AlltoAll,
 *                             Gather or Scatter goes straight between windows (1, the default)
 *   PYCOLL_HOST_EAGER         0: small collectives queued on an idle helping stream get no pass in the
 *                             caller's thread first (1, the default; stream.c)
 *   PYCOLL_HOST_STREAM_DEPTH  the most operations a stream holds queued and not begun (1024; 0: no bound;
 *                             at most 2^24; stream.c)
 *   PYCOLL_HOST_GROUP_BATCH   0: a group's small collectives take one step each; 1 (the default): those
 *                             of one communicator that every rank groups alike share one step (coll.c)
 *   (each is checked by env.c: a bad value is refused with a WARN, see env.h for the bounds)
 *   PYCOLL_HOST_BIND=1        bind the thread initialising rank r to the (r mod #allowed)-th
 *                             allowed CPU when there are enough CPUs (off by default: threads it
 *                             starts later inherit the binding), like Open MPI's default binding
 */
#ifndef PYCOLL_HOST_H
#define PYCOLL_HOST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA ordinal that communicators made afterwards in the calling thread report (default 0). */
void pycollSetDevice(int device);

typedef struct pycollStream* pycollStream_t;
typedef struct pycollEvent* pycollEvent_t;
typedef struct pycollGraph* pycollGraph_t;

/* The host library's own version: major*10000 + minor*100 + patch. ncclGetVersion reports the
 * NCCL API level the library implements (23203). */
int pycollHostGetVersion(int* version);

/* Stream flags. PYCOLL_STREAM_INLINE: work submitted while the stream is idle runs in the
 * caller's thread (in stream order; events recorded after it complete when it is done), for at most
 * PYCOLL_HOST_INLINE_NS (10 ms): then what is unfinished goes back to the stream, ahead of what
 * was queued meanwhile, and the call returns; a wait that runs work (pycollEventWaitRun) takes it up
 * again, and the stream's thread takes it over only after PYCOLL_HOST_DEFER_NS. */
#define PYCOLL_STREAM_INLINE 0x1
/* PYCOLL_STREAM_BLOCKING (creation only): once a legacy stream is set (pycollStreamSetLegacy), work on
 * this stream and work on the legacy stream wait for each other, as a CUDA stream created without
 * cudaStreamNonBlocking does with the legacy default stream. */
#define PYCOLL_STREAM_BLOCKING 0x2
/* PYCOLL_STREAM_HELP: a thread waiting for an event recorded on this stream with pycollEventWaitRun
 * runs the work queued before the event itself when the stream's thread has not begun it -- in stream
 * order, as that thread would -- instead of waking it and waiting. And a small collective (one step of the
 * segment, a few KiB) submitted while such a stream is idle and not PYCOLL_STREAM_INLINE runs as far as it
 * can without waiting in the caller's thread first -- to its end where the peers' shares are there -- and
 * only the rest goes to the stream's thread (PYCOLL_HOST_EAGER=0: none of it). */
#define PYCOLL_STREAM_HELP 0x4

int pycollStreamCreate(pycollStream_t* stream);
int pycollStreamCreateWithFlags(pycollStream_t* stream, int flags);
int pycollStreamSetFlags(pycollStream_t stream, int flags);
/* Waits for the work already enqueued, then frees the stream. */
int pycollStreamDestroy(pycollStream_t stream);
int pycollStreamSynchronize(pycollStream_t stream);
/* ncclSuccess when everything enqueued has run, ncclInProgress otherwise. */
int pycollStreamQuery(pycollStream_t stream);
/* Waits at most `timeout_ns` for room on `stream`: ncclSuccess once it holds fewer than PYCOLL_HOST_STREAM_DEPTH
 * operations not begun (at once where it does, or has no bound), ncclInProgress while it is still full. A caller
 * that would rather wait in slices -- to look at its deadlines and signals in between -- than in the queuing call
 * (pycoll's Communicator) calls it first. A signal delivered to the calling thread ends it early. */
int pycollStreamWaitRoom(pycollStream_t stream, uint64_t timeout_ns);
/* Work enqueued on `stream` after this call waits until `event` has completed. */
int pycollStreamWaitEvent(pycollStream_t stream, pycollEvent_t event);

int pycollEventCreate(pycollEvent_t* event);
int pycollEventDestroy(pycollEvent_t event);
/* Record on a stream; a NULL stream completes the event at once. */
int pycollEventRecord(pycollEvent_t event, pycollStream_t stream);
/* ncclSuccess when complete (or never recorded), ncclInProgress otherwise. */
int pycollEventQuery(pycollEvent_t event);
int pycollEventSynchronize(pycollEvent_t event);
/* Waits at most timeout_ns (UINT64_MAX: forever): ncclSuccess once complete, else ncclInProgress. */
int pycollEventWait(pycollEvent_t event, uint64_t timeout_ns);
/* Like pycollEventWait, but when the event was recorded on a PYCOLL_STREAM_HELP stream whose thread
 * has not begun the work queued before it, the calling thread runs that work first (in stream order,
 * as the stream's thread would), within timeout_ns: what is unfinished then goes back to the stream,
 * left to this thread's next such wait for PYCOLL_HOST_DEFER_NS before the stream's thread takes it. */
int pycollEventWaitRun(pycollEvent_t event, uint64_t timeout_ns);
/* A host-controlled event: Arm makes it incomplete (streams waiting on it stop there) until Fire
 * completes it, from any thread. The emulated GPU runs user "kernels" with them. */
int pycollEventArm(pycollEvent_t event);
int pycollEventFire(pycollEvent_t event);
/* Milliseconds between the completion of two completed events: ncclInProgress while either has
 * not completed yet, ncclInvalidUsage if either was never recorded. */
int pycollEventElapsedTime(float* ms, pycollEvent_t start, pycollEvent_t end);

/* The emulated GPU (pycoll.emulated). SetLegacy(L) makes the stream handles NULL and 1
 * (cudaStreamLegacy) mean L in every call (collectives included) and 2 (cudaStreamPerThread) the
 * calling thread's own PYCOLL_STREAM_BLOCKING stream, created on first use; SetLegacy(NULL) restores
 * the host backend's meaning (NULL: run in the calling thread). Resolve returns what a handle
 * means for the calling thread. */
int pycollStreamSetLegacy(pycollStream_t legacy);
int pycollStreamResolve(pycollStream_t stream, pycollStream_t* out);
/* Graph capture: between Begin and End, operations submitted to the stream are recorded into a
 * graph instead of run (they hold their communicators; finalize does not wait for them); Launch
 * submits them again, in order, to a stream, as often as wanted; Destroy frees the graph. */
int pycollStreamBeginCapture(pycollStream_t stream);
int pycollStreamEndCapture(pycollStream_t stream, pycollGraph_t* graph);
int pycollGraphLaunch(pycollGraph_t graph, pycollStream_t stream);
int pycollGraphDestroy(pycollGraph_t graph);

/* Waits at most timeout_ns (UINT64_MAX: forever) until the communicator's asynchronous state
 * (ncclCommGetAsyncError) is no longer ncclInProgress -- a nonblocking init, split, shrink, grow,
 * finalize or revoke has ended: ncclSuccess then (read the state itself with ncclCommGetAsyncError),
 * else ncclInProgress. What a poll of ncclCommGetAsyncError does, without sleeping between polls. */
struct ncclComm;
int pycollCommWaitReady(struct ncclComm* comm, uint64_t timeout_ns);
/* *count: the sends, receives, puts and signals with `peer` that this rank enqueued on the communicator (in an open
 * group too) and that have not finished -- 0 once its part with that peer is done, whatever else still runs
 * (another peer's operations of the same group). A wait_signal, which waits for several peers, is not counted. */
int pycollCommPeerOpen(struct ncclComm* comm, int peer, int* count);
/* The process of rank `peer` as it joined the communicator: its pid, its start time (clock ticks since boot, as
 * /proc/<pid>/stat's field 22) and its pid namespace's inode -- what a watcher on this host needs before the peer
 * publishes anything itself. ncclInvalidUsage once the communicator was torn down (destroyed or aborted). */
int pycollCommPeerProcess(struct ncclComm* comm, int peer, int* pid, uint64_t* start, uint64_t* pidns);
/* *clean: 1 when the last records of `start` and `end` (an operation's events) have completed and the operation did
 * not fail -- `end` completed before the communicator's asynchronous state became an error (always, where it is
 * none), or, both recorded on one stream, no operation of that stream ended failed between the two (a stream goes
 * on past a failed operation, so its events complete too) -- else 0: its results stand where 1. */
int pycollCommEventsClean(struct ncclComm* comm, pycollEvent_t start, pycollEvent_t end, int* clean);
/* Why this rank is about to abort or revoke the communicator, where the library itself did not fail it (a failure
 * its caller found: a stopped peer, a timeout): a peer that meets the aborted or revoked communicator is told "rank
 * R aborted the communicator after it failed: <text>" (the first 195 bytes), not only "rank R aborted ...", which
 * names the rank that found the fault. Ignored where the library failed the communicator already (its own text
 * stays) or a note was given before. */
int pycollCommNoteFailure(struct ncclComm* comm, const char* text);

#ifdef __cplusplus
}
#endif
#endif
