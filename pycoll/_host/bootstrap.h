/* Unique ids and the rendezvous that turns one into a mapped communicator segment.
 *
 * A unique id names a segment; it is created lazily by the first rank to arrive (so an id that is
 * never used leaves nothing behind). Every rank claims its slot, the last one to arrive unlinks
 * the name, and everybody waits until all have arrived. A rank that detects misuse or a failure
 * poisons the rendezvous (all waiting ranks fail with its error) and unlinks the name. */
#ifndef PYCOLL_BOOTSTRAP_H
#define PYCOLL_BOOTSTRAP_H

#include "core.h"
#include "segment.h"

#define UID_MAGIC 0x31484350u /* "PCH1" */
#define UID_VERSION 1
enum uid_kind { UID_INIT = 1, UID_GROW = 2 };

/* The 128-byte ncclUniqueId of the host library. */
struct host_uid {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint8_t boot_id[16];
  uint64_t nonce[2];
  int32_t creator_pid;
  int32_t parent_nranks;  /* grow ids: size of the communicator that grows */
  uint64_t child_count;   /* grow ids: which reshape of the parent */
  char host[56];
  char shm_tag[SHM_TAG_MAX + 1]; /* the creator's PYCOLL_HOST_SHM_TAG: every rank's must be the same */
};
_Static_assert(sizeof(struct host_uid) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

ncclResult_t uid_make(ncclUniqueId* out, int kind, const uint64_t nonce[2], int parent_nranks,
                      uint64_t child_count);
/* Validates an id received from the user (magic, version, same host). */
ncclResult_t uid_parse(const ncclUniqueId* id, struct host_uid* out, const char* opname, struct ncclComm* comm);

struct rendezvous {
  const uint64_t* nonce;
  int nranks;
  int rank;
  int kind;
  uint64_t token;
  uint64_t ids_hash;
  const struct proc_id* expected; /* optional, [nranks]: members known in advance (pid 0: unknown) */
  uint32_t* const* abort_flags;    /* stop as soon as one is set */
  int nabort;
  uint64_t timeout_ns; /* 0: wait forever */
  const char* opname;
  struct ncclComm* comm; /* for the error text */
};

ncclResult_t rendezvous_join(const struct rendezvous* r, struct seg* out);

/* Default rendezvous timeout: PYCOLL_HOST_INIT_TIMEOUT seconds (300; 0 disables it). */
/* PYCOLL_HOST_INIT_TIMEOUT in ns (0: forever); false (after a WARN) when the variable is invalid. */
bool rendezvous_timeout_ns(uint64_t* out);
uint64_t new_claim_token(void);

#endif
