/* A tuner plugin for tests/plugins.rs, built against src/plugin/plugin_abi.h once per ABI version
 * (-DTUNER_VERSION=2..5; 0 exports no table). TEST_TUNER_FORCE="algo,proto,channels" names the
 * (NCCL algorithm index, NCCL protocol index) the plugin wants and the channels it asks for:
 * v3+ set that entry of the cost table to 0 (if offered), v2 names it. -DFAIL_INIT makes init
 * fail, -DFAIL_COLL makes getCollInfo fail. */
#include <stdio.h>
#include <stdlib.h>
#include "plugin_abi.h"

static int want_algo = -1, want_proto = -1, want_channels = 0;

__attribute__((unused)) static ncclResult_t setup(void** ctx) {
  const char* f = getenv("TEST_TUNER_FORCE");
  if (f) sscanf(f, "%d,%d,%d", &want_algo, &want_proto, &want_channels);
  *ctx = &want_algo;
#ifdef FAIL_INIT
  return ncclInternalError;
#else
  return ncclSuccess;
#endif
}

__attribute__((unused)) static ncclResult_t fini(void* ctx) { return ctx == &want_algo ? ncclSuccess : ncclInternalError; }

__attribute__((unused)) static ncclResult_t table_coll(void* ctx, ncclFunc_t f, size_t n, int ops, float** cost, int na, int np, int* nch) {
  (void)f; (void)n; (void)ops;
#ifdef FAIL_COLL
  return ncclInvalidUsage;
#endif
  if (ctx != &want_algo || na != NCCL_NUM_ALGORITHMS || np != NCCL_NUM_PROTOCOLS) return ncclInternalError;
  float (*table)[NCCL_NUM_PROTOCOLS] = (float (*)[NCCL_NUM_PROTOCOLS])cost;
  if (want_algo >= 0 && table[want_algo][want_proto] != NCCL_ALGO_PROTO_IGNORE) table[want_algo][want_proto] = 0.0f;
  if (want_channels > 0) *nch = want_channels;
  return ncclSuccess;
}

#if TUNER_VERSION == 5
static ncclResult_t init5(void** ctx, uint64_t id, size_t nranks, size_t nnodes, ncclDebugLogger_t log,
                          ncclNvlDomainInfo_v5_t* nvl, ncclTunerConstants_v5_t* c) {
  (void)id;
  if (nranks == 0 || nnodes == 0 || !log || !nvl || !c || nvl->nNvlDomains != (int)nnodes) return ncclInternalError;
  log(NCCL_LOG_INFO, 0x40, __FILE__, __LINE__, "test tuner v5: %zu ranks on %zu nodes", nranks, nnodes);
  return setup(ctx);
}
static ncclResult_t coll5(void* ctx, ncclFunc_t f, size_t n, int ops, float** cost, int na, int np, int reg, int* nch) {
  (void)reg;
  return table_coll(ctx, f, n, ops, cost, na, np, nch);
}
const ncclTuner_v5_t ncclTunerPlugin_v5 = {"fntest5", init5, coll5, fini};
#elif TUNER_VERSION >= 2
static ncclResult_t init_old(size_t nranks, size_t nnodes, ncclDebugLogger_t log, void** ctx) {
  if (nranks == 0 || nnodes == 0 || !log) return ncclInternalError;
  return setup(ctx);
}
#if TUNER_VERSION == 4
static ncclResult_t coll4(void* ctx, ncclFunc_t f, size_t n, int ops, float** cost, int na, int np, int reg, int* nch) {
  (void)reg;
  return table_coll(ctx, f, n, ops, cost, na, np, nch);
}
const ncclTuner_v4_t ncclTunerPlugin_v4 = {"fntest4", init_old, coll4, fini};
#elif TUNER_VERSION == 3
const ncclTuner_v3_t ncclTunerPlugin_v3 = {"fntest3", init_old, table_coll, fini};
#else
static ncclResult_t coll2(void* ctx, ncclFunc_t f, size_t n, int collnet, int nvls, int ops, int* algo, int* proto,
                          int* nch) {
  (void)f; (void)n; (void)collnet; (void)nvls; (void)ops;
#ifdef FAIL_COLL
  return ncclInvalidUsage;
#endif
  if (ctx != &want_algo) return ncclInternalError;
  *algo = want_algo;
  *proto = want_proto;
  if (want_channels > 0) *nch = want_channels;
  return ncclSuccess;
}
const ncclTuner_v2_t ncclTunerPlugin_v2 = {"fntest2", init_old, coll2, fini};
#endif
#else
int fn_no_tuner_here = 1;
#endif
