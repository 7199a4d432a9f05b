/* Failpoints of the host library: the host.* entries of PYCOLL_FAILPOINTS (grammar in
 * pycoll/failpoints.py), read with getenv once, at the first failpoint. A "kill" is raise(SIGKILL),
 * a "stop" raise(SIGSTOP); a "raise" makes fp_hit return nonzero and the caller fail with
 * ncclSystemError; a "sleep(MS)" sleeps MS milliseconds in the calling thread, then goes on. Off, a
 * failpoint is one relaxed load and a predicted branch.
 *
 * The names (pycoll.failpoints.HOST_POINTS lists the same):
 *   host.init.begin, host.init.end            every rendezvous (init, and the child of a shrink or grow)
 *   host.coll.before_fill, host.coll.after_arrive, host.coll.after_consume, host.coll.done
 *                                             each step of a collective
 *   host.shrink.begin, host.shrink.end        ncclCommShrink's exchange on the parent
 *   host.grow.begin, host.grow.end            ncclCommGrow's rendezvous
 *   host.coll.window                          an AllReduce over windows, after this rank reduced its slice
 *                                             into every rank's buffer, before the last arrival
 *   host.coll.eager                           a small rooted collective's sender, before each message it
 *                                             writes into the eager lane (coll.c)
 *   host.coll.check_waited                    a collective waiting for one rank looks at another that has not
 *                                             done its part yet, before it asks whether that one failed or
 *                                             left (coll.c: coll_check_waited, every PYCOLL_HOST_PEER_CHECK_NS)
 *   host.wait.check_peer                      a waiter, before it asks whether the rank it waits for failed or
 *                                             left (every round of its yields and sleeps: enqueue.c, check_peers)
 *   host.wait.brief                           an operation's wait for its peers that begins yielding briefly,
 *                                             its communicator's such waits having mostly slept of late
 *                                             (PYCOLL_HOST_YIELD_ADAPT: wait.h), before its first step
 *                                             ("raise" fails the operations instead)
 *   host.window.exchange                      ncclCommWindowRegister, before its descriptor exchange
 *   host.signal.wait                          ncclWaitSignal, when it starts waiting
 *   host.stream.defer                         before queuing work on a helping stream whose thread is not
 *                                             woken for it at once (ranks outnumber CPUs: stream.c)
 *   host.stream.handback                      a thread that is not a stream's own has run its work for
 *                                             PYCOLL_HOST_INLINE_NS (a caller) or to the end of its wait (a
 *                                             waiter): before it hands what is unfinished back to the stream
 *                                             ("raise" fails those operations instead)
 *   host.stream.takeover                      a stream's thread taking over work handed back to it whose
 *                                             thread did not come back for it within PYCOLL_HOST_DEFER_NS
 *                                             ("raise" fails those operations instead)
 *   host.stream.order                         an operation submitted to another stream than its communicator's
 *                                             last unfinished one (or to the NULL stream), before it is made to
 *                                             wait for that one (stream.c: stream_order) ("raise" fails the
 *                                             operation instead)
 *   host.stream.full                          a thread queuing an operation onto a stream that holds
 *                                             PYCOLL_HOST_STREAM_DEPTH already, as it begins to wait for room,
 *                                             and each pycollStreamWaitRoom that finds the stream full (the
 *                                             Communicator's wait calls it every 5 ms) ("raise": the call fails
 *                                             instead, nothing queued)
 */
#ifndef PYCOLL_FAILPOINT_H
#define PYCOLL_FAILPOINT_H

#include "core.h"

extern int fp_state; /* 0: not read yet, 1: off, 2: armed */

int fp_hit_slow(const char* name);

static inline int fp_hit(const char* name) {
  if (LIKELY(__atomic_load_n(&fp_state, __ATOMIC_RELAXED) == 1)) return 0;
  return fp_hit_slow(name);
}

#endif
