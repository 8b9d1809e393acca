/*
 * ferronickel: NCCL 2.28.9's device API, for kernels that communicate by themselves through
 * symmetric windows (README.md, "The device API"). Include it in CUDA code compiled by nvcc, after
 * or instead of nccl.h; C and C++ host code may include it for the host side (ncclDevCommCreate,
 * the requirement structs and the team functions).
 *
 * Provided: teams, cooperative groups, window and resource-buffer pointers, ncclSymPtr, LSA
 * barriers and the LSA form of ncclBarrierSession, ncclFindWindow. Declared but not provided:
 * multimem (the functions trap) and GIN (ncclDevCommCreate refuses it; its device functions trap).
 */
#ifndef NCCL_DEVICE_H_
#define NCCL_DEVICE_H_
#include "nccl.h"
#include "nccl_device/utility.h"
#include "nccl_device/core.h"
#include "nccl_device/coop.h"
#include "nccl_device/team.h"
#include "nccl_device/ptr.h"
#include "nccl_device/comm.h"
#include "nccl_device/lsa_barrier.h"
#include "nccl_device/net_device.h"
#include "nccl_device/gin.h"
#include "nccl_device/gin_barrier.h"
#include "nccl_device/barrier.h"
#endif /* NCCL_DEVICE_H_ */
