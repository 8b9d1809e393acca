// common.cuh: thread groups and their barriers, memory accesses with the right visibility, and
// the one wait loop every FIFO poll goes through (abort, error and timeout checks).
#pragma once
#include <stdint.h>
#include <string.h>
#include "device_abi.h"

// The threads that run one work together. Collectives use the whole CTA (barrier 0); a p2p CTA
// that has both sends and receives splits into two halves with their own named barriers, so a
// send never waits behind a receive of the same CTA (which could deadlock against the peer).
struct Group {
  int tid;       // index within the group
  int nthreads;  // a multiple of 32
  int barId;     // named barrier of this group
};

__device__ __forceinline__ void groupBarrier(const Group& g) {
  asm volatile("bar.sync %0, %1;" ::"r"(g.barId), "r"(g.nthreads) : "memory");
}

// Barrier that also returns whether any thread of the group passed `pred`: how the polling
// thread tells everyone to stop.
__device__ __forceinline__ bool groupBarrierAny(const Group& g, bool pred) {
  int any;
  asm volatile(
      "{ .reg .pred p, q;\n"
      "  setp.ne.s32 p, %1, 0;\n"
      "  bar.red.or.pred q, %2, %3, p;\n"
      "  selp.s32 %0, 1, 0, q; }"
      : "=r"(any)
      : "r"(int(pred)), "r"(g.barId), "r"(g.nthreads)
      : "memory");
  return any != 0;
}

// Polled counters: acquire at system scope, so the FIFO data the peer wrote before the counter is
// visible to this thread and, through the following barrier, to the whole group.
__device__ __forceinline__ uint64_t loadAcquireSys(const volatile uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// FIFO slots are written by another GPU or live in host memory: read them with volatile loads,
// which bypass the non-coherent L1 and observe the latest coherent value. No "memory" clobber: the
// barriers around each step (asm volatile, clobbering memory) already order them.
__device__ __forceinline__ uint4 loadVolatile16(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ T loadVolatile(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
  T v;
  if constexpr (sizeof(T) == 1) {
    uint8_t b = *reinterpret_cast<const volatile uint8_t*>(p);
    memcpy(&v, &b, 1);
  } else if constexpr (sizeof(T) == 2) {
    uint16_t b = *reinterpret_cast<const volatile uint16_t*>(p);
    memcpy(&v, &b, 2);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t b = *reinterpret_cast<const volatile uint32_t*>(p);
    memcpy(&v, &b, 4);
  } else {
    uint64_t b = *reinterpret_cast<const volatile uint64_t*>(p);
    memcpy(&v, &b, 8);
  }
  return v;
}

// Record the first device error for the host (system-scope CAS: several CTAs may fail at once).
__device__ __forceinline__ void reportError(const fnDevComm* comm, uint32_t code) {
  atomicCAS_system(const_cast<uint32_t*>(comm->errorFlag), 0u, code);
}

// The checks every poll loop makes while it spins: the host's abortFlag, another CTA's error and
// comm->timeoutNs. They cost a few loads, so they run once every 1024 polls; the clock starts at the
// first check. Returns FN_DEV_OK to go on polling, or the reason to stop.
struct WaitClock {
  uint32_t polls = 0;
  uint64_t start = 0;
  __device__ __forceinline__ int tick(const fnDevComm* comm) {
    if ((++polls & 1023) != 0) return FN_DEV_OK;
    return slowCheck(comm);
  }
  __device__ __noinline__ int slowCheck(const fnDevComm* comm) {
    if (*comm->abortFlag) {
      reportError(comm, FN_DEV_ABORTED);
      return FN_DEV_ABORTED;
    }
    const uint32_t err = *comm->errorFlag;
    if (err) return int(err);
    const uint64_t now = globalTimerNs();
    if (start == 0) start = now;
    if (comm->timeoutNs && now - start > comm->timeoutNs) {
      reportError(comm, FN_DEV_TIMEOUT);
      return FN_DEV_TIMEOUT;
    }
    return FN_DEV_OK;
  }
};

// Spins until *ctr + add > target (the step's FIFO condition). Returns FN_DEV_OK, or nonzero when
// the caller must stop (see WaitClock). `seen`, when given, receives the value that satisfied it.
__device__ __noinline__ int waitCounter(const fnDevComm* comm, const volatile uint64_t* ctr, uint64_t add,
                                        uint64_t target, uint64_t* seen = nullptr) {
  WaitClock clock;
  uint64_t v;
  while ((v = loadAcquireSys(ctr)) + add <= target) {
    if (const int stop = clock.tick(comm)) return stop;
  }
  if (seen) *seen = v;
  return FN_DEV_OK;
}

__host__ __device__ __forceinline__ uint64_t divUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
__host__ __device__ __forceinline__ uint64_t alignUp(uint64_t a, uint64_t b) { return divUp(a, b) * b; }
__device__ __forceinline__ int ringMod(int a, int n) {
  a %= n;
  return a < 0 ? a + n : a;
}
