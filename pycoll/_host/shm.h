/* POSIX shared-memory segments and process identity. Every name starts with the process's prefix: "pycoll", or
 * "pycoll_<tag>" under PYCOLL_HOST_SHM_TAG=<tag>, then "-". A segment appears under its final name only fully
 * initialised (created under a temporary name, then linked), and stale segments of dead creators are swept -- those
 * of the process's own prefix only: processes of different tags share no segment and sweep none of the other's. */
#ifndef PYCOLL_SHM_H
#define PYCOLL_SHM_H

#include "core.h"
#include <sys/types.h>


#define SHM_DIR "/dev/shm"
#define SHM_TAG_MAX 15 /* PYCOLL_HOST_SHM_TAG: 1 to 15 of A-Z a-z 0-9 _ */

/* "pycoll" or "pycoll_<tag>", and the tag ("" when none): PYCOLL_HOST_SHM_TAG as first read (an invalid one warns
 * and counts as none) */
const char* shm_prefix(void);
const char* shm_tag(void);

struct proc_id {
  int32_t pid;
  uint64_t start; /* start time in clock ticks since boot: tells a pid's reuse apart */
  uint64_t pidns; /* inode of the pid namespace: pids of other namespaces cannot be checked */
};

void proc_self(struct proc_id* out);
/* 1 when the process runs (not a zombie), 0 when it is gone, -1 when it cannot be told. */
int proc_alive(const struct proc_id* p);
int host_boot_id(uint8_t out[16]);
const char* host_name(void);
int random_bytes(void* buf, size_t len);

/* Opens `name` (e.g. "/pycoll-...") read-write and maps it; ENOENT when absent. */
int shm_open_map(const char* name, void** base, size_t* size);
/* Creates `name` of `size` bytes, runs init(base, arg) on it, then publishes it atomically.
 * Returns 0 and maps it, or EEXIST when someone else published it first. */
int shm_create_map(const char* name, size_t size, void (*init)(void* base, void* arg), void* arg, void** base);
void shm_unlink_name(const char* name);
/* The communicator segments this process maps (seg_view adds one, seg_unmap takes it away): shm_create_map counts
 * what of them no page backs yet -- room they were promised where they were created sparse. */
void shm_note_mapped(void* base, size_t size, bool mapped);
uint64_t shm_unbacked_bytes(void);
/* Unlinks segments whose creator is dead (and temporary files of dead processes). */
void shm_sweep(void);

/* The creator of the published segment `name` (e.g. "/pycoll-..."; its header's first page, mapped read only):
 * seg_creator_of's answer, -1 also where there is none. */
int shm_creator_of(const char* name, struct proc_id* creator);
/* Reads the creator of a published segment (implemented by the bootstrap, which owns the header):
 * 0, -1 when it is not a segment of ours, 1 when it must be left alone for now. */
int seg_creator_of(const void* base, size_t size, struct proc_id* creator);

#endif
