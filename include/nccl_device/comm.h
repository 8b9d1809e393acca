/*
 * ferronickel: the device communicator of NCCL 2.28.9's device API. struct ncclDevComm and the
 * host functions that make it are in nccl_device/core.h; its teams are in nccl_device/team.h, the
 * pointers into its windows and resource buffers in nccl_device/ptr.h.
 */
#ifndef NCCL_DEVICE_COMM_H_
#define NCCL_DEVICE_COMM_H_
#include "core.h"
#include "ptr.h"
#include "team.h"
#endif /* NCCL_DEVICE_COMM_H_ */
