/* pycoll host library: the functions it exports beyond the NCCL C ABI.
 *
 * The host library (libpycoll_host.so) exports the NCCL 2.32 host API (same names, signatures,
 * return codes) and moves data in host memory between processes of one machine over POSIX shared
 * memory. The `cudaStream_t stream` argument of every collective is a pycollStream_t created here
 * (or NULL, which runs the operation in the calling thread). Streams and events have CUDA's shape:
 * work enqueued on a stream runs in order on the stream's own thread; an event recorded on a
 * stream completes when everything enqueued before it has run. Errors of enqueued work are
 * reported through ncclCommGetAsyncError, never through events.
 *
 * Every function returns an ncclResult_t (ncclInvalidArgument for NULL/invalid handles, with a
 * ncclGetLastError text).
 */
#ifndef PYCOLL_HOST_H
#define PYCOLL_HOST_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pycollStream* pycollStream_t;
typedef struct pycollEvent* pycollEvent_t;

/* The host library's own version: major*10000 + minor*100 + patch. ncclGetVersion reports the
 * NCCL API level the library implements (23203). */
int pycollHostGetVersion(int* version);

int pycollStreamCreate(pycollStream_t* stream);
/* Waits for the work already enqueued, then frees the stream. */
int pycollStreamDestroy(pycollStream_t stream);
int pycollStreamSynchronize(pycollStream_t stream);
/* ncclSuccess when everything enqueued has run, ncclInProgress otherwise. */
int pycollStreamQuery(pycollStream_t stream);
/* Work enqueued on `stream` after this call waits until `event` has completed. */
int pycollStreamWaitEvent(pycollStream_t stream, pycollEvent_t event);

int pycollEventCreate(pycollEvent_t* event);
int pycollEventDestroy(pycollEvent_t event);
/* Record on a stream; a NULL stream completes the event at once. */
int pycollEventRecord(pycollEvent_t event, pycollStream_t stream);
/* ncclSuccess when complete (or never recorded), ncclInProgress otherwise. */
int pycollEventQuery(pycollEvent_t event);
int pycollEventSynchronize(pycollEvent_t event);
/* Milliseconds between the completion of two completed events: ncclInProgress while either has
 * not completed yet, ncclInvalidUsage if either was never recorded. */
int pycollEventElapsedTime(float* ms, pycollEvent_t start, pycollEvent_t end);

#ifdef __cplusplus
}
#endif
#endif
