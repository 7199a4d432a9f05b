/* The device-API host types of nccl_device/host.h and nccl_device/core.h (NCCL 2.32.3) that the
 * host library's devapi.c exports functions over. Layouts must match that release exactly. */
#ifndef PYCOLL_DEVAPI_H
#define PYCOLL_DEVAPI_H

#include <stdbool.h>

#include "nccl_types.h"

typedef struct ncclTeam {
  int nRanks, rank, stride;
} ncclTeam_t;

typedef uint32_t ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;
typedef uint32_t ncclCftLeId;

typedef enum {
  NCCL_GIN_CONNECTION_NONE,
  NCCL_GIN_CONNECTION_FULL,
  NCCL_GIN_CONNECTION_RAIL,
  NCCL_GIN_CONNECTION_CUSTOM_STRIDE,
} ncclGinConnectionType_t;

typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4,
  NCCL_GIN_TYPE_EFA_GDA = 5,
  NCCL_GIN_MAX_TYPES = 6,
} ncclGinType_t;

typedef enum { NCCL_CFT_TEAM_FLAT, NCCL_CFT_TEAM_HIER_MULTIMEM, NCCL_CFT_TEAM_HIER_LSA } ncclCftTeamMode_t;

typedef struct ncclMultimemHandle { void* mcBasePtr; } ncclMultimemHandle_t;
typedef struct ncclLsaBarrierHandle { ncclDevResourceHandle_t bufHandle; int nBarriers; } ncclLsaBarrierHandle_t;
typedef struct ncclGinBarrierHandle { ncclGinSignal_t signal0; ncclDevResourceHandle_t unused; } ncclGinBarrierHandle_t;
typedef struct ncclLLA2AHandle { ncclDevResourceHandle_t bufHandle; uint32_t nSlots; } ncclLLA2AHandle_t;
typedef struct ncclGinOutboxHandle { ncclDevResourceHandle_t bufHandle; uint32_t size_log2; } ncclGinOutboxHandle_t;
typedef struct ncclGinInboxA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  ncclGinSignal_t signals;
  uint32_t size_log2;
  uint32_t nPeers_rcp32;
} ncclGinInboxA2AHandle_t;

typedef struct ncclDevComm ncclDevComm_t; /* device-side layout; never touched on the host library */

typedef struct ncclDevResourceRequirements {
  struct ncclDevResourceRequirements* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
} ncclDevResourceRequirements_t;

typedef struct ncclDevCommRequirements ncclDevCommRequirements_t; /* read only by device-capable libraries */

typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;
  bool multimemSupport;
  ncclGinType_t ginType;
  int nLsaTeams;
  bool hostRmaSupport;
  ncclGinType_t railedGinType;
  uint64_t commHash;
  int ginMinStride;
  ncclGinConnectionType_t ginConnectionType;
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  bool cftSupport;
  bool cftMulticastSupport;
  bool cftCountedSupport;
} ncclCommProperties_t;

_Static_assert(sizeof(ncclCommProperties_t) == 152, "ncclCommProperties_t layout of NCCL 2.32.3");
_Static_assert(sizeof(ncclDevResourceRequirements_t) == 56, "ncclDevResourceRequirements_t layout of NCCL 2.32.3");

#endif
