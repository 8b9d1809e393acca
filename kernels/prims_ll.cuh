// prims_ll.cuh: the data movers of the LL and LL128 protocols. Both carry the step's flag inside
// the data, so a receiver polls the data itself and no fence or step counter stands between a store
// and its use; Prims (prims.cuh) adds the flow control.
//
// Both move 8-byte words of user data. Word i of a buffer is its bytes [8i, 8i + 8); the last word
// of a step may be partial (only its valid bytes are read and written), and a buffer that is not
// 8-byte aligned is read and written byte by byte.
#pragma once
#include "common.cuh"
#include "reduce_ops.cuh"

// Word i of a user buffer of nbytes bytes; bytes past the end read as 0 and are never touched.
__device__ __forceinline__ uint64_t loadWord(const void* base, size_t i, size_t nbytes) {
  const size_t off = i * 8;
  if (off + 8 <= nbytes && (reinterpret_cast<uintptr_t>(base) & 7) == 0) {
    return *reinterpret_cast<const uint64_t*>(static_cast<const char*>(base) + off);
  }
  uint64_t v = 0;
  for (size_t b = 0; b < 8 && off + b < nbytes; b++) v |= uint64_t(static_cast<const uint8_t*>(base)[off + b]) << (8 * b);
  return v;
}
__device__ __forceinline__ void storeWord(void* base, size_t i, size_t nbytes, uint64_t v) {
  const size_t off = i * 8;
  if (off + 8 <= nbytes && (reinterpret_cast<uintptr_t>(base) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(static_cast<char*>(base) + off) = v;
    return;
  }
  for (size_t b = 0; b < 8 && off + b < nbytes; b++) static_cast<uint8_t*>(base)[off + b] = uint8_t(v >> (8 * b));
}

// ---- LL: 16-byte lines {data lo, flag, data hi, flag} -----------------------------------------

__device__ __forceinline__ void storeLL(char* line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(uint32_t(v)), "r"(flag),
               "r"(uint32_t(v >> 32)), "r"(flag)
               : "memory");
}

// Polls one line until both of its flags are `flag` (a 16-byte store may land as two 8-byte
// halves). Returns FN_DEV_OK with the word, or the reason to stop.
__device__ __forceinline__ int readLL(const fnDevComm* comm, const char* line, uint32_t flag, uint64_t& v) {
  WaitClock clock;
  for (;;) {
    uint32_t d0, f0, d1, f1;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(line)
                 : "memory");
    if (f0 == flag && f1 == flag) {
      v = uint64_t(d0) | uint64_t(d1) << 32;
      return FN_DEV_OK;
    }
    if (const int stop = clock.tick(comm)) return stop;
  }
}

// One LL step's movement of n elements as F says (F flags as in reduceCopy), word i on line i:
// receive slot rslot (lines flagged rflag) and/or user input → user output and/or send slot sslot
// (written with sflag). Returns FN_DEV_OK or the reason this thread stopped.
template <typename T, typename Op, int F>
__device__ __noinline__ int llMove(const Group g, const fnDevComm* comm, const Op op, const char* rslot,
                                   uint32_t rflag, char* sslot, uint32_t sflag, const T* usrc, T* udst, size_t n) {
  const size_t nbytes = n * sizeof(T), nWords = divUp(nbytes, 8);
  for (size_t i = g.tid; i < nWords; i += g.nthreads) {
    uint64_t rv = 0, uv = 0;
    if constexpr (F & F_RECV) {
      if (const int stop = readLL(comm, rslot + 16 * i, rflag, rv)) return stop;
    }
    if constexpr (F & F_USRC) uv = loadWord(usrc, i, nbytes);
    const uint64_t r = combineVec<T, Op, F>(op, rv, uv);
    if constexpr (F & F_UDST) storeWord(udst, i, nbytes, r);
    if constexpr (F & F_SEND) storeLL(sslot + 16 * i, r, sflag);
  }
  return FN_DEV_OK;
}

// ---- LL128: 128-byte lines of 15 data words and a flag word ----------------------------------
//
// Eight consecutive lanes of a warp own a line: lane k < 7 holds words 2k and 2k + 1, lane 7 holds
// word 14 and the flag. Each lane stores and loads its 16 bytes with one vector instruction, so the
// warp writes and reads a whole line in one 128-byte transaction; over NVLink (and within a GPU) such
// a line arrives whole, so a line whose flag is fresh holds fresh data (NCCL's LL128 rests on the
// same property).

__device__ __forceinline__ void storeLL128(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void loadLL128(const char* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// One LL128 step's movement, like llMove. Warps take 4 lines at a time; a warp's lanes stay
// converged around every line access.
template <typename T, typename Op, int F>
__device__ __noinline__ int ll128Move(const Group g, const fnDevComm* comm, const Op op, const char* rslot,
                                      uint64_t rflag, char* sslot, uint64_t sflag, const T* usrc, T* udst,
                                      size_t n) {
  constexpr int W = FN_LL128_LINE_WORDS;
  const size_t nbytes = n * sizeof(T), nLines = divUp(divUp(nbytes, 8), W);
  const int lane = g.tid & 31, k = lane & 7, warp = g.tid >> 5, nWarps = g.nthreads >> 5;
  const bool flagLane = k == 7;
  for (size_t first = size_t(warp) * 4; first < nLines; first += size_t(nWarps) * 4) {
    const size_t line = first + (lane >> 3);
    const bool live = line < nLines;
    const size_t w0 = line * W + 2 * k;  // this lane's first word
    const size_t at = line * 128 + k * 16;
    uint64_t r0 = 0, r1 = 0;
    if constexpr (F & F_RECV) {
      WaitClock clock;
      for (;;) {
        if (live) loadLL128(rslot + at, r0, r1);
        if (!__any_sync(0xffffffffu, live && flagLane && r1 != rflag)) break;
        int stop = lane == 0 ? clock.tick(comm) : FN_DEV_OK;
        stop = __shfl_sync(0xffffffffu, stop, 0);
        if (stop) return stop;
      }
    }
    uint64_t u0 = 0, u1 = 0;
    if constexpr (F & F_USRC) {
      if (live) {
        u0 = loadWord(usrc, w0, nbytes);
        if (!flagLane) u1 = loadWord(usrc, w0 + 1, nbytes);
      }
    }
    const uint64_t o0 = combineVec<T, Op, F>(op, r0, u0);
    const uint64_t o1 = flagLane ? sflag : combineVec<T, Op, F>(op, r1, u1);
    if constexpr (F & F_UDST) {
      if (live) {
        storeWord(udst, w0, nbytes, o0);
        if (!flagLane) storeWord(udst, w0 + 1, nbytes, o1);
      }
    }
    if constexpr (F & F_SEND) {
      __syncwarp();
      if (live) storeLL128(sslot + at, o0, o1);
    }
  }
  return FN_DEV_OK;
}
