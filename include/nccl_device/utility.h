/*
 * ferronickel: the inlining macros of NCCL 2.28.9's device API and the few helpers its device
 * headers share (namespace nccl::utility). Kernels written against NVIDIA's headers use the same
 * macro names, so they compile against these unchanged (README.md, "The device API").
 */
#ifndef NCCL_DEVICE_UTILITY_H_
#define NCCL_DEVICE_UTILITY_H_

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

#if defined(__CUDACC__)
#define NCCL_DEVICE_INLINE __device__ __forceinline__
#define NCCL_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#if !defined(__host__)
#define __host__
#endif
#define NCCL_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE inline __attribute__((always_inline))
#endif

#ifndef NCCL_EXTERN_C
#if defined(__cplusplus)
#define NCCL_EXTERN_C extern "C"
#else
#define NCCL_EXTERN_C
#endif
#endif

#if defined(__CUDACC__)
#include <cuda/atomic>
#endif

#if defined(__cplusplus)
namespace nccl {
namespace utility {

template <typename X, typename Y>
NCCL_HOST_DEVICE_INLINE constexpr auto divUp(X x, Y y) -> decltype(x + y) {
  return (x + y - 1) / y;
}

template <typename Int>
NCCL_HOST_DEVICE_INLINE constexpr bool isPow2(Int x) {
  return (x & (x - 1)) == 0;
}

/* `base` moved by `delta4G` units of 4 GiB, modulo 2^64: the step between the LSA ranks' views
 * of one window (struct ncclWindow_vidmem, field stride4G). */
template <typename T>
NCCL_HOST_DEVICE_INLINE T add4G(T base, uint32_t delta4G) {
  return (T)((uintptr_t)base + ((uint64_t)delta4G << 32));
}

/* a <= b where both count up and may wrap: b - a is "small" (under half the range). */
template <typename Uint>
NCCL_HOST_DEVICE_INLINE bool rollingLessEq(Uint a, Uint b, int nBits = 8 * sizeof(Uint)) {
  Uint mask = Uint(-1) >> (8 * sizeof(Uint) - nBits);
  return ((b - a) & mask) <= (mask >> 1);
}

#if defined(__CUDACC__)
/* The acquire half of a memory order (what a wait needs), and the release half (what an arrive
 * needs). */
NCCL_DEVICE_INLINE cuda::memory_order acquireOrderOf(cuda::memory_order order) {
  if (order == cuda::memory_order_release) return cuda::memory_order_relaxed;
  if (order == cuda::memory_order_acq_rel) return cuda::memory_order_acquire;
  return order;
}
NCCL_DEVICE_INLINE cuda::memory_order releaseOrderOf(cuda::memory_order order) {
  if (order == cuda::memory_order_acquire) return cuda::memory_order_relaxed;
  if (order == cuda::memory_order_acq_rel) return cuda::memory_order_release;
  return order;
}

NCCL_DEVICE_INLINE int lane() {
  int id;
  asm("mov.u32 %0, %%laneid;" : "=r"(id));
  return id;
}
NCCL_DEVICE_INLINE uint32_t lanemask_lt() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

/* A load through the read-only cache: windows and device communicators do not change while a
 * kernel runs. */
template <typename T>
NCCL_DEVICE_INLINE T loadConst(T const* p) {
  static_assert(sizeof(T) % 4 == 0 && alignof(T) >= 4, "loadConst reads whole 32-bit words");
  union {
    uint32_t word[sizeof(T) / 4];
    T value;
  } u;
  for (int i = 0; i < (int)(sizeof(T) / 4); i++) u.word[i] = __ldg((uint32_t const*)p + i);
  return u.value;
}
#endif /* __CUDACC__ */

} /* namespace utility */
} /* namespace nccl */
#endif /* __cplusplus */

#endif /* NCCL_DEVICE_UTILITY_H_ */
