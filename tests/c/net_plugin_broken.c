/* A test net plugin whose init fails: the loader must WARN, naming this file and the symbol,
 * and try the next net. Built against src/transport/net/net_plugin_abi.h by tests/net.rs. */
#include "net_plugin_abi.h"

static ncclResult_t broken_init(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t log,
                                ncclProfilerCallback_t prof) {
  (void)ctx; (void)commId; (void)config; (void)prof;
  log(NCCL_LOG_INFO, NCCL_NET, __FILE__, __LINE__, "fn-broken: refusing to start (%s)", "by design");
  return ncclSystemError;
}

const ncclNet_v11_t ncclNetPlugin_v11 = { .name = "FnBroken", .init = broken_init };
