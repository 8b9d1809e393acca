/*
 * ferronickel: the kinds of network offload a net plugin's device handle names (NCCL 2.28.9's
 * nccl_device/net_device.h, same names and values). The device API's GIN backends are two of them;
 * ferronickel drives none of them from the GPU (nccl_device/gin.h).
 */
#ifndef NCCL_NET_DEVICE_H_
#define NCCL_NET_DEVICE_H_

#include <stddef.h>

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0
#define NCCL_NET_MTU_SIZE 4096
#define NCCL_NET_DEVICE_UNPACK_VERSION 0x7

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
} ncclNetDeviceType;

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v7_t;

typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v10_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v11_t ncclNetDeviceHandle_t;

#endif /* NCCL_NET_DEVICE_H_ */
