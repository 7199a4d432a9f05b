/* The device-API host functions of nccl_device/host.h on the host library: communicator properties,
 * teams (every rank of a host communicator shares one machine's memory, so the LSA team is the
 * world and the rail team is this rank alone), the requirement arithmetic that needs no device
 * (LSA barrier, LL all-to-all), and NCCL's ncclInvalidUsage with a last-error text naming the
 * function for what only a GPU has: device communicators, multimem, GIN and CFT. */
#include <stdlib.h>

#include "comm.h"
#include "debug.h"
#include "devapi.h"
#include "handles.h"

static ncclResult_t unsupported(struct ncclComm* c, const char* opname, const char* what) {
  CWARN(c, "%s : not supported by the pycoll host library (%s)", opname, what);
  return ncclInvalidUsage;
}

NCCL_API void ncclResetDebugInitInternal(void) { ncclResetDebugInit(); }

NCCL_API ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclCommQueryProperties", &c);
  if (r != ncclSuccess) return r;
  if (!props) {
    CWARN(c, "ncclCommQueryProperties : props argument is NULL");
    comm_release(c);
    return ncclInvalidArgument;
  }
  const size_t head = offsetof(ncclCommProperties_t, rank);
  if (props->magic != NCCL_API_MAGIC || props->size < head) {
    CWARN(c, "ncclCommQueryProperties : props is not initialised with NCCL_COMM_PROPERTIES_INITIALIZER "
          "(magic %#x, size %zu)", props->magic, props->size);
    comm_release(c);
    return ncclInvalidArgument;
  }
  if ((r = comm_ensure_ready(c, "ncclCommQueryProperties")) != ncclSuccess) {
    comm_release(c);
    return r;
  }
  ncclCommProperties_t p;
  memset(&p, 0, sizeof p);
  p.rank = c->rank;
  p.nRanks = c->nranks;
  p.cudaDev = c->cuda_dev;
  p.nvmlDev = c->cuda_dev;
  p.deviceApiSupport = false;
  p.multimemSupport = false;
  p.ginType = NCCL_GIN_TYPE_NONE;
  p.nLsaTeams = 1;
  p.hostRmaSupport = true; /* ncclPutSignal / ncclSignal / ncclWaitSignal run on the host streams */
  p.railedGinType = NCCL_GIN_TYPE_NONE;
  p.commHash = c->nonce[0] ^ (c->nonce[1] * 0x9e3779b97f4a7c15ull);
  p.ginMinStride = 0;
  p.ginConnectionType = NCCL_GIN_CONNECTION_NONE;
  p.devCommRuntimeVersionSize = 0;
  /* the caller's struct may be an older, shorter layout: fill only the fields its size covers */
  size_t n = MIN(props->size, sizeof p);
  memcpy((char*)props + head, (const char*)&p + head, n - head);
  comm_release(c);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                        ncclDevComm_t* outDevComm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclDevCommCreate", &c);
  if (r != ncclSuccess) return r;
  if (!reqs || !outDevComm) {
    CWARN(c, "ncclDevCommCreate : %s argument is NULL", reqs ? "outDevComm" : "reqs");
    r = ncclInvalidArgument;
  } else {
    r = unsupported(c, "ncclDevCommCreate", "no device API: deviceApiSupport is false");
  }
  comm_release(c);
  return r;
}

NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  struct ncclComm* c;
  ncclResult_t r = comm_acquire(comm, "ncclDevCommDestroy", &c);
  if (r != ncclSuccess) return r;
  (void)devComm;
  r = unsupported(c, "ncclDevCommDestroy", "no device communicator can exist on this library");
  comm_release(c);
  return r;
}

/* ---- window device pointers and LE info ----
 * The LSA and peer pointers are weak: the window code may define them with the peers' mapped
 * addresses of a shared-memory window. */

static ncclResult_t window_check(ncclWindow_t w, void* out, const char* opname) {
  if (!w || !handle_valid(w, H_WINDOW)) {
    WARN("%s : window %p is not a registered window", opname, (void*)w);
    return ncclInvalidArgument;
  }
  if (!out) {
    WARN("%s : output argument is NULL", opname);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static ncclResult_t window_unsupported(ncclWindow_t w, void* out, const char* opname, const char* what) {
  ncclResult_t r = window_check(w, out, opname);
  return r != ncclSuccess ? r : unsupported(NULL, opname, what);
}

NCCL_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr) {
  (void)offset;
  return window_unsupported(window, outPtr, "ncclGetLsaMultimemDevicePointer", "no multimem: multimemSupport is false");
}

NCCL_API ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem,
                                                   void** outPtr) {
  (void)offset;
  (void)multimem;
  return window_unsupported(window, outPtr, "ncclGetMultimemDevicePointer", "no multimem: multimemSupport is false");
}

/* ncclGetLsaDevicePointer and ncclGetPeerDevicePointer (a peer's window mapped here) are in window.c. */

NCCL_API ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId* leId,
                                                  size_t* leOffset) {
  (void)offset;
  (void)leOffset;
  return window_unsupported(window, leId, "ncclGetMultimemDeviceLeInfo", "no CFT: cftSupport is false");
}

NCCL_API ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam,
                                             ncclCftLeId* leId, size_t* leOffset) {
  (void)offset;
  (void)peerCft;
  (void)cftTeam;
  (void)leOffset;
  return window_unsupported(window, leId, "ncclGetCftDeviceLeInfo", "no CFT: cftSupport is false");
}

NCCL_API ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId,
                                              size_t* leOffset) {
  (void)offset;
  (void)peerWorld;
  (void)leOffset;
  return window_unsupported(window, leId, "ncclGetPeerDeviceLeInfo", "no CFT: cftSupport is false");
}

/* ---- teams: an invalid communicator or an unsupported team gives the empty team {0, 0, 0} ---- */

static const ncclTeam_t empty_team = {0, 0, 0};

static bool team_comm(ncclComm_t comm, const char* opname, int* rank, int* nranks) {
  struct ncclComm* c;
  if (comm_acquire(comm, opname, &c) != ncclSuccess) return false;
  bool ok = comm_ensure_ready(c, opname) == ncclSuccess;
  *rank = c->rank;
  *nranks = c->nranks;
  comm_release(c);
  return ok;
}

NCCL_API ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  int rank, nranks;
  if (!team_comm(comm, "ncclTeamWorld", &rank, &nranks)) return empty_team;
  ncclTeam_t t = {nranks, rank, 1};
  return t;
}

NCCL_API ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  int rank, nranks;
  if (!team_comm(comm, "ncclTeamLsa", &rank, &nranks)) return empty_team;
  ncclTeam_t t = {nranks, rank, 1};
  return t;
}

NCCL_API ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  int rank, nranks;
  if (!team_comm(comm, "ncclTeamRail", &rank, &nranks)) return empty_team;
  ncclTeam_t t = {1, 0, nranks}; /* the outer factor of the LSA team, which is the world */
  return t;
}

NCCL_API ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode) {
  int rank, nranks;
  (void)mode;
  if (team_comm(comm, "ncclTeamCft", &rank, &nranks)) unsupported(NULL, "ncclTeamCft", "no CFT: cftSupport is false");
  return empty_team;
}

NCCL_API ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm) {
  int rank, nranks;
  if (team_comm(comm, "ncclTeamCftMultimem", &rank, &nranks))
    unsupported(NULL, "ncclTeamCftMultimem", "no CFT multimem: cftMulticastSupport is false");
  return empty_team;
}

/* The world rank of member `rank` of `team`, as seen from this rank (a member of it): -1 when
 * the result is not a rank of the communicator. */
static int team_to_world(ncclComm_t comm, ncclTeam_t team, int rank, const char* opname) {
  int me, nranks;
  if (!team_comm(comm, opname, &me, &nranks)) return -1;
  if (team.nRanks <= 0 || rank < 0 || rank >= team.nRanks || team.rank < 0 || team.rank >= team.nRanks) {
    WARN("%s : rank %d is not a member of the team {nRanks %d, rank %d, stride %d}", opname, rank, team.nRanks,
         team.rank, team.stride);
    return -1;
  }
  long long world = (long long)me + (long long)(rank - team.rank) * team.stride;
  if (world < 0 || world >= nranks) {
    WARN("%s : team {nRanks %d, rank %d, stride %d} member %d maps to world rank %lld, outside 0..%d", opname,
         team.nRanks, team.rank, team.stride, rank, world, nranks - 1);
    return -1;
  }
  return (int)world;
}

NCCL_API int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_to_world(comm, team, rank, "ncclTeamRankToWorld");
}

NCCL_API int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_to_world(comm, team, rank, "ncclTeamRankToLsa"); /* the LSA team is the world here */
}

/* ---- resource requirements ---- */

static ncclResult_t requirement_args(const void* handle, const ncclDevResourceRequirements_t* req, int count,
                                     const char* countname, const char* opname) {
  if (!handle || !req) {
    WARN("%s : %s argument is NULL", opname, handle ? "outReq" : "outHandle");
    return ncclInvalidArgument;
  }
  if (count < 0) {
    WARN("%s : %s must be >= 0, got %d", opname, countname, count);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* Per barrier: two epoch words and one multicast inbox, then one unicast inbox per member. */
NCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
                                                      ncclDevResourceRequirements_t* outReq) {
  ncclResult_t r = requirement_args(outHandle, outReq, nBarriers, "nBarriers", "ncclLsaBarrierCreateRequirement");
  if (r != ncclSuccess) return r;
  if (team.nRanks <= 0) {
    WARN("ncclLsaBarrierCreateRequirement : the team is empty (nRanks %d)", team.nRanks);
    return ncclInvalidArgument;
  }
  memset(outReq, 0, sizeof *outReq);
  outHandle->nBarriers = nBarriers;
  outReq->bufferSize = (size_t)(3 + team.nRanks) * (size_t)nBarriers * sizeof(uint32_t);
  outReq->bufferAlign = 4;
  outReq->outBufferHandle = &outHandle->bufHandle;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                                      ncclGinBarrierHandle_t* outHandle,
                                                      ncclDevResourceRequirements_t* outReq) {
  struct ncclComm* c;
  (void)team;
  ncclResult_t r = comm_acquire(comm, "ncclGinBarrierCreateRequirement", &c);
  if (r != ncclSuccess) return r;
  r = requirement_args(outHandle, outReq, nBarriers, "nBarriers", "ncclGinBarrierCreateRequirement");
  if (r == ncclSuccess) r = unsupported(c, "ncclGinBarrierCreateRequirement", "no GIN: ginType is NCCL_GIN_TYPE_NONE");
  comm_release(c);
  return r;
}

/* One slot is 8 bytes of payload: an element of maxEltSize bytes takes ceil(maxEltSize / 8). */
NCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  if (maxElts < 0 || maxEltSize < 0) return -1;
  long long slots = (long long)maxElts * ((maxEltSize + 7) / 8);
  return slots > INT_MAX ? -1 : (int)slots;
}

/* Per block: one epoch line and two banks of nSlots 16-byte lines (the slot and its flag). */
NCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                                 ncclDevResourceRequirements_t* outReq) {
  ncclResult_t r = requirement_args(outHandle, outReq, nBlocks, "nBlocks", "ncclLLA2ACreateRequirement");
  if (r != ncclSuccess) return r;
  if (nSlots < 0) {
    WARN("ncclLLA2ACreateRequirement : nSlots must be >= 0, got %d", nSlots);
    return ncclInvalidArgument;
  }
  memset(outReq, 0, sizeof *outReq);
  outHandle->nSlots = (uint32_t)nSlots;
  outReq->bufferSize = (size_t)nBlocks * (1 + 2 * (size_t)nSlots) * 16;
  outReq->bufferAlign = 16;
  outReq->outBufferHandle = &outHandle->bufHandle;
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2, ncclGinOutboxHandle_t* outHandle,
                                                     ncclDevResourceRequirements_t* outReq) {
  (void)size_log2;
  ncclResult_t r = requirement_args(outHandle, outReq, nBlocks, "nBlocks", "ncclGinOutboxCreateRequirement");
  return r != ncclSuccess ? r : unsupported(NULL, "ncclGinOutboxCreateRequirement", "no GIN: ginType is NCCL_GIN_TYPE_NONE");
}

NCCL_API ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                                       ncclGinInboxA2AHandle_t* outHandle,
                                                       ncclDevResourceRequirements_t* outReq) {
  (void)peers;
  (void)size_log2;
  ncclResult_t r = requirement_args(outHandle, outReq, nBlocks, "nBlocks", "ncclGinInboxA2ACreateRequirement");
  return r != ncclSuccess ? r
                          : unsupported(NULL, "ncclGinInboxA2ACreateRequirement", "no GIN: ginType is NCCL_GIN_TYPE_NONE");
}
