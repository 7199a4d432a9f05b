/* ncclConfig_t parsing, as NCCL's parseCommConfig does it: copy at most sizeof(ncclConfig_t)
 * bytes, check the magic, reset fields newer than config->version, validate, apply defaults, then
 * let NCCL_COMM_BLOCKING override the blocking attribute. */
#include "core.h" /* first: defines _GNU_SOURCE */
#include <stdlib.h>

#include "comm.h"
#include "debug.h"

void config_defaults(ncclConfig_t* c) {
  memset(c, 0, sizeof *c);
  c->size = sizeof(ncclConfig_t);
  c->magic = NCCL_API_MAGIC;
  c->version = NCCL_VERSION_CODE;
  int* ints[] = {&c->blocking,          &c->cgaClusterSize, &c->minCTAs,          &c->maxCTAs,
                 &c->splitShare,        &c->trafficClass,   &c->collnetEnable,    &c->CTAPolicy,
                 &c->shrinkShare,       &c->nvlsCTAs,       &c->nChannelsPerNetPeer, &c->nvlinkCentricSched,
                 &c->graphUsageMode,    &c->numRmaCtx,      &c->maxP2pPeers,      &c->graphStreamOrdering,
                 &c->launchOrderImplicit, &c->numRmaSig,    &c->rmaEagerInit,     &c->hostCftMode,
                 &c->nvlsHostMode};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) *ints[i] = NCCL_CONFIG_UNDEF_INT;
}

#define UNDEF NCCL_CONFIG_UNDEF_INT
#define BAD(cond, fmt, ...)                         \
  do {                                              \
    if (cond) {                                     \
      CWARN(comm, fmt, __VA_ARGS__);                \
      return ncclInvalidArgument;                   \
    }                                               \
  } while (0)
#define DEFAULT(field, v) \
  if (c.field == UNDEF) c.field = (v)

static void env_override(ncclConfig_t* c) {
  const char* e = getenv("NCCL_COMM_BLOCKING");
  if (e) {
    int v = atoi(e);
    if (v == 0 || v == 1) c->blocking = v;
  }
}

ncclResult_t parse_config(ncclConfig_t* dst, const ncclConfig_t* user, const char* opname, struct ncclComm* comm) {
  (void)opname;
  ncclConfig_t c, def;
  config_defaults(&c);
  config_defaults(&def);
  if (user) {
    size_t size;
    memcpy(&size, user, sizeof size);
    if (size > sizeof c) size = sizeof c;
    c.magic = 0;
    memcpy(&c, user, size);
    if (c.magic != NCCL_API_MAGIC) {
      CWARN(comm, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
      return ncclInvalidArgument;
    }
    unsigned v = c.version;
    if (v < NCCL_VERSION(2, 14, 0)) c.blocking = def.blocking;
    if (v < NCCL_VERSION(2, 17, 0)) {
      c.cgaClusterSize = def.cgaClusterSize;
      c.minCTAs = def.minCTAs;
      c.maxCTAs = def.maxCTAs;
      c.netName = def.netName;
    }
    if (v < NCCL_VERSION(2, 25, 0)) c.trafficClass = def.trafficClass;
    if (v < NCCL_VERSION(2, 27, 0)) {
      c.collnetEnable = def.collnetEnable;
      c.CTAPolicy = def.CTAPolicy;
      c.shrinkShare = def.shrinkShare;
      c.nvlsCTAs = def.nvlsCTAs;
    }
    if (v < NCCL_VERSION(2, 28, 0)) {
      c.nChannelsPerNetPeer = def.nChannelsPerNetPeer;
      c.nvlinkCentricSched = def.nvlinkCentricSched;
    }
    if (v < NCCL_VERSION(2, 29, 0)) {
      c.graphUsageMode = def.graphUsageMode;
      c.numRmaCtx = def.numRmaCtx;
    }
    if (v < NCCL_VERSION(2, 30, 0)) c.maxP2pPeers = def.maxP2pPeers;
    if (v < NCCL_VERSION(2, 30, 5)) c.graphStreamOrdering = def.graphStreamOrdering;
    if (v < NCCL_VERSION(2, 31, 0)) {
      c.launchOrderImplicit = def.launchOrderImplicit;
      c.numRmaSig = def.numRmaSig;
      c.rmaEagerInit = def.rmaEagerInit;
      c.hostCftMode = def.hostCftMode;
      c.nvlsHostMode = def.nvlsHostMode;
    }
  }
  BAD(c.blocking != UNDEF && c.blocking != 0 && c.blocking != 1, "Invalid config blocking attribute value %d",
      c.blocking);
  BAD(c.cgaClusterSize != UNDEF && c.cgaClusterSize < 0, "Invalid config cgaClusterSize attribute value %d",
      c.cgaClusterSize);
  BAD((c.minCTAs != UNDEF && c.minCTAs <= 0) || (c.maxCTAs != UNDEF && c.maxCTAs <= 0) || (c.minCTAs > c.maxCTAs),
      "Invalid config min/max channels attribute value %d/%d", c.minCTAs, c.maxCTAs);
  BAD(c.splitShare != UNDEF && c.splitShare != 0 && c.splitShare != 1, "Invalid config splitShare attribute value %d",
      c.splitShare);
  BAD(c.collnetEnable != UNDEF && (c.collnetEnable < 0 || c.collnetEnable > 1),
      "Invalid config collnetEnable attribute value %d", c.collnetEnable);
  BAD(c.CTAPolicy != UNDEF && (c.CTAPolicy < 0 || c.CTAPolicy > (NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO)),
      "Invalid config policy attribute value %d", c.CTAPolicy);
  BAD(c.shrinkShare != UNDEF && c.shrinkShare != 0 && c.shrinkShare != 1,
      "Invalid config shrinkShare attribute value %d", c.shrinkShare);
  BAD(c.nvlsCTAs != UNDEF && c.nvlsCTAs <= 0, "Invalid config nvlsCTAs attribute value %d", c.nvlsCTAs);
  BAD(c.nChannelsPerNetPeer != UNDEF && (c.nChannelsPerNetPeer <= 0 || c.nChannelsPerNetPeer > 64),
      "Invalid config nChannelsPerNetPeer attribute value %d", c.nChannelsPerNetPeer);
  BAD(c.nvlinkCentricSched != UNDEF && c.nvlinkCentricSched != 0 && c.nvlinkCentricSched != 1,
      "Invalid config nvlinkCentricSched attribute value %d", c.nvlinkCentricSched);
  BAD(c.graphUsageMode != UNDEF && (c.graphUsageMode < 0 || c.graphUsageMode > 2),
      "Invalid config graphUsageMode attribute value %d", c.graphUsageMode);
  BAD(c.numRmaCtx != UNDEF && c.numRmaCtx < 0, "Invalid config numRmaCtx attribute value %d", c.numRmaCtx);
  BAD(c.maxP2pPeers != UNDEF && c.maxP2pPeers <= 0, "Invalid config maxP2pPeers attribute value %d", c.maxP2pPeers);
  BAD(c.graphStreamOrdering != UNDEF && c.graphStreamOrdering != 0 && c.graphStreamOrdering != 1,
      "Invalid config graphStreamOrdering attribute value %d", c.graphStreamOrdering);
  BAD(c.launchOrderImplicit != UNDEF && c.launchOrderImplicit != 0 && c.launchOrderImplicit != 1,
      "Invalid config launchOrderImplicit attribute value %d", c.launchOrderImplicit);
  BAD(c.numRmaSig != UNDEF && c.numRmaSig < 0, "Invalid config numRmaSig attribute value %d", c.numRmaSig);
  BAD(c.rmaEagerInit != UNDEF && c.rmaEagerInit != 0 && c.rmaEagerInit != 1,
      "Invalid config rmaEagerInit attribute value %d", c.rmaEagerInit);
  BAD(c.hostCftMode != UNDEF && (c.hostCftMode < 1 || c.hostCftMode > 3),
      "Invalid config hostCftMode attribute value %d", c.hostCftMode);
  BAD(c.nvlsHostMode != UNDEF && !(c.nvlsHostMode >= 0 && c.nvlsHostMode <= 2) && c.nvlsHostMode != INT_MAX,
      "Invalid config nvlsHostMode attribute value %d", c.nvlsHostMode);

  DEFAULT(blocking, 1);
  DEFAULT(cgaClusterSize, 4);
  DEFAULT(minCTAs, 1);
  DEFAULT(maxCTAs, 64);
  DEFAULT(splitShare, 0);
  DEFAULT(collnetEnable, 0);
  DEFAULT(CTAPolicy, NCCL_CTA_POLICY_DEFAULT);
  DEFAULT(shrinkShare, 0);
  DEFAULT(nvlinkCentricSched, 0);
  DEFAULT(graphUsageMode, 2);
  DEFAULT(numRmaCtx, 1);
  DEFAULT(graphStreamOrdering, 1);
  c.size = sizeof c;
  c.magic = NCCL_API_MAGIC;
  c.version = NCCL_VERSION_CODE;
  env_override(&c);
  *dst = c;
  return ncclSuccess;
}

void config_inherit(ncclConfig_t* dst, const ncclConfig_t* parent) {
  *dst = *parent;
  env_override(dst);
}
