/* Prints the size and every field offset of the net plugin ABI types, as declared in
 * src/transport/net/net_plugin_abi.h; tests/net.rs compares them with the Rust mirrors. */
#include <stddef.h>
#include <stdio.h>
#include "net_plugin_abi.h"

#define SZ(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OF(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))

int main(void) {
  SZ(ncclNetDeviceHandle_v8_t);
  OF(ncclNetDeviceHandle_v8_t, netDeviceType); OF(ncclNetDeviceHandle_v8_t, netDeviceVersion);
  OF(ncclNetDeviceHandle_v8_t, handle); OF(ncclNetDeviceHandle_v8_t, size); OF(ncclNetDeviceHandle_v8_t, needsProxyProgress);
  SZ(ncclNetVDeviceProps_v9_t); OF(ncclNetVDeviceProps_v9_t, ndevs); OF(ncclNetVDeviceProps_v9_t, devs);
  SZ(ncclNetCommConfig_v10_t); OF(ncclNetCommConfig_v10_t, trafficClass);
#define PROPS_COMMON(t) OF(t, name); OF(t, pciPath); OF(t, guid); OF(t, ptrSupport); OF(t, regIsGlobal)
  SZ(ncclNetProperties_v8_t); PROPS_COMMON(ncclNetProperties_v8_t);
  OF(ncclNetProperties_v8_t, speed); OF(ncclNetProperties_v8_t, port); OF(ncclNetProperties_v8_t, latency);
  OF(ncclNetProperties_v8_t, maxComms); OF(ncclNetProperties_v8_t, maxRecvs); OF(ncclNetProperties_v8_t, netDeviceType);
  OF(ncclNetProperties_v8_t, netDeviceVersion);
#define PROPS_V9(t) PROPS_COMMON(t); OF(t, forceFlush); OF(t, speed); OF(t, port); OF(t, latency); OF(t, maxComms); \
  OF(t, maxRecvs); OF(t, netDeviceType); OF(t, netDeviceVersion); OF(t, vProps); OF(t, maxP2pBytes); OF(t, maxCollBytes)
  SZ(ncclNetProperties_v9_t); PROPS_V9(ncclNetProperties_v9_t);
  SZ(ncclNetProperties_v11_t); PROPS_V9(ncclNetProperties_v11_t); OF(ncclNetProperties_v11_t, maxMultiRequestSize);
  SZ(ncclNetCommAttr_v11_t); OF(ncclNetCommAttr_v11_t, maxConcurrentPeers); OF(ncclNetCommAttr_v11_t, minConcurrentPeers);
  OF(ncclNetCommAttr_v11_t, maxFlowsPerPeer); OF(ncclNetCommAttr_v11_t, minFlowsPerPeer);
  SZ(ncclNetAttr_v11_t); OF(ncclNetAttr_v11_t, sendCommAttr); OF(ncclNetAttr_v11_t, recvCommAttr);
  OF(ncclNetAttr_v11_t, op); OF(ncclNetAttr_v11_t, algo); OF(ncclNetAttr_v11_t, proto);
#define NET_COMMON(t) OF(t, name); OF(t, init); OF(t, devices); OF(t, getProperties); OF(t, listen); OF(t, connect); \
  OF(t, accept); OF(t, regMr); OF(t, regMrDmaBuf); OF(t, deregMr); OF(t, isend); OF(t, irecv); OF(t, iflush); OF(t, test); \
  OF(t, closeSend); OF(t, closeRecv); OF(t, closeListen); OF(t, getDeviceMr); OF(t, irecvConsumed)
  SZ(ncclNet_v8_t); NET_COMMON(ncclNet_v8_t);
  SZ(ncclNet_v9_t); NET_COMMON(ncclNet_v9_t); OF(ncclNet_v9_t, makeVDevice);
  SZ(ncclNet_v10_t); NET_COMMON(ncclNet_v10_t); OF(ncclNet_v10_t, makeVDevice);
  SZ(ncclNet_v11_t); NET_COMMON(ncclNet_v11_t); OF(ncclNet_v11_t, makeVDevice); OF(ncclNet_v11_t, finalize);
  OF(ncclNet_v11_t, setNetAttr);
  return 0;
}
