/* The exit watcher: one thread, asleep in epoll_wait on the pidfds of this process's communicators'
 * peers. When a peer process exits, the communicators it belongs to mark it gone and their doorbells
 * ring: a rank waiting for it (a collective, a rendezvous) wakes and fails at once, instead of at its
 * next periodic look at the peers (peer_check_ns, wait.h). Peers on other hosts or in another pid
 * namespace have no pidfd and are not watched here.
 *
 * The same thread keeps this process's life words (segment.h) in its robust list: when the process
 * dies, the kernel marks them before it tears the process down (a pidfd turns readable only after
 * that: 5-15 ms for a process with torch loaded), and a peer waiting on one wakes at once (wait.h). */
#ifndef PYCOLL_EXITWATCH_H
#define PYCOLL_EXITWATCH_H

struct ncclComm;

/* `c` (attached: segment mapped, peers known) is watched from now on: its peers' pidfds are added. */
void exitwatch_add(struct ncclComm* c);
/* `c` is no longer watched (before its segment is unmapped and its pidfds closed). */
void exitwatch_remove(struct ncclComm* c);

#endif
