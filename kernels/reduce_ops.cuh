// reduce_ops.cuh: element arithmetic for the 12 data types and the reduction operators.
//
// Native types compute in T (integers wrap as in C). __half, __nv_bfloat16 and the two fp8 types
// compute in float and round back to nearest-even once per operation (fp8 saturates to the largest
// finite value, as cuda_fp8.h's constructors do), so every rank rounds identically.
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "device_abi.h"

// Conv<T>: the type T is computed in (Acc) and the conversions to and from it.
template <typename T>
struct Conv {
  using Acc = T;
  static __device__ __forceinline__ Acc up(T x) { return x; }
  static __device__ __forceinline__ T down(Acc x) { return x; }
};
template <>
struct Conv<__half> {
  using Acc = float;
  static __device__ __forceinline__ float up(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half down(float x) { return __float2half_rn(x); }
};
template <>
struct Conv<__nv_bfloat16> {
  using Acc = float;
  static __device__ __forceinline__ float up(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 down(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Conv<__nv_fp8_e4m3> {
  using Acc = float;
  static __device__ __forceinline__ float up(__nv_fp8_e4m3 x) { return float(x); }
  static __device__ __forceinline__ __nv_fp8_e4m3 down(float x) { return __nv_fp8_e4m3(x); }
};
template <>
struct Conv<__nv_fp8_e5m2> {
  using Acc = float;
  static __device__ __forceinline__ float up(__nv_fp8_e5m2 x) { return float(x); }
  static __device__ __forceinline__ __nv_fp8_e5m2 down(float x) { return __nv_fp8_e5m2(x); }
};

// The four arithmetic reductions, as functors on the type an element is computed in (Conv<T>::Acc).
// Max/min use fmax/fmin for floating point (a NaN loses to a number, as in NCCL), compare otherwise.
struct FnAdd {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
struct FnMul {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a * b; }
};
struct FnMax {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a < b ? b : a; }
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};
struct FnMin {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return b < a ? b : a; }
  __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmin(a, b); }
};

// Fn applied to two elements of type T: computed in Conv<T>::Acc (integer promotion wraps back to
// T through the cast), rounded back to T once.
template <typename Fn, typename T> __device__ __forceinline__ T elApply(T a, T b) {
  using C = Conv<T>;
  return C::down(static_cast<typename C::Acc>(Fn()(C::up(a), C::up(b))));
}

// An operator has: kReduce (false only for the pure-copy kernel), reduce(a, b), pre(x) applied to
// this rank's own input where it enters a reduction, and post(x) applied where a final reduced value
// is produced; kPre/kPost say whether pre/post are more than the identity (movements that only copy
// then share one type-independent mover). Constructed once per work from the work and nRanks.
//
// Sum, Prod, Max and Min are one shape: reduce with Fn, nothing before or after.
template <typename T, typename Fn>
struct OpReduce {
  static constexpr bool kReduce = true, kPre = false, kPost = false;
  __device__ OpReduce(const fnWork&, int) {}
  __device__ __forceinline__ T reduce(T a, T b) const { return elApply<Fn>(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};
template <typename T> using OpSum = OpReduce<T, FnAdd>;
template <typename T> using OpProd = OpReduce<T, FnMul>;
template <typename T> using OpMax = OpReduce<T, FnMax>;
template <typename T> using OpMin = OpReduce<T, FnMin>;
// Sum of scalar * input. The scalar is a device pointer (read once here) or the low sizeof(T)
// bytes of the immediate.
template <typename T>
struct OpPreMulSum {
  static constexpr bool kReduce = true, kPre = true, kPost = false;
  T scalar;
  __device__ OpPreMulSum(const fnWork& w, int) {
    if (w.scalarIsPtr) {
      scalar = *reinterpret_cast<const T*>(w.scalar);
    } else {
      uint64_t bits = w.scalar;
      memcpy(&scalar, &bits, sizeof(T));  // little-endian: the low bytes
    }
  }
  __device__ __forceinline__ T reduce(T a, T b) const { return elApply<FnAdd>(a, b); }
  __device__ __forceinline__ T pre(T x) const { return elApply<FnMul>(x, scalar); }
  __device__ __forceinline__ T post(T x) const { return x; }
};
// Integer average: the sum, divided (C integer division) by nRanks where the final value appears.
template <typename T>
struct OpSumPostDiv {
  static constexpr bool kReduce = true, kPre = false, kPost = true;
  int nRanks;  // an int, not T: 8-bit types cannot hold more than 127/255 ranks
  __device__ OpSumPostDiv(const fnWork&, int n) : nRanks(n) {}
  __device__ __forceinline__ T reduce(T a, T b) const { return elApply<FnAdd>(a, b); }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return static_cast<T>(x / nRanks); }
};
// The pure data-movement kernel (fnCopy): reduction works are not compiled for it.
template <typename T>
struct OpNone {
  static constexpr bool kReduce = false, kPre = false, kPost = false;
  __device__ OpNone(const fnWork&, int) {}
  __device__ OpNone() {}
  __device__ __forceinline__ T reduce(T a, T) const { return a; }
  __device__ __forceinline__ T pre(T x) const { return x; }
  __device__ __forceinline__ T post(T x) const { return x; }
};

// What one data movement reads and writes (template flags of reduceCopy and Prims::step).
enum : int {
  F_RECV = 1,   // source: the receive FIFO slot
  F_USRC = 2,   // source: the user's input
  F_UDST = 4,   // destination: the user's output
  F_SEND = 8,   // destination: the send FIFO slot (the peer's)
  F_PRE = 16,   // apply Op::pre to the user's input (it enters a reduction)
  F_POST = 32,  // apply Op::post to the result (it is a final reduced value)
};

// The per-element result of a movement: reduce(recv, pre(user)), then post.
template <typename T, typename Op, int F>
__device__ __forceinline__ T combine(const Op& op, T rv, T uv) {
  if constexpr ((F & F_USRC) && (F & F_PRE)) uv = op.pre(uv);
  T r;
  if constexpr ((F & F_RECV) && (F & F_USRC)) r = op.reduce(rv, uv);
  else if constexpr (F & F_RECV) r = rv;
  else r = uv;
  if constexpr (F & F_POST) r = op.post(r);
  return r;
}

// combine() over a vector of whole elements (a 16-byte pack, an 8-byte LL word); a pure copy keeps
// the vector untouched.
template <typename T, typename Op, int F, typename V>
__device__ __forceinline__ V combineVec(const Op& op, V rv, V uv) {
  constexpr bool kArith = ((F & F_RECV) && (F & F_USRC)) || (F & (F_PRE | F_POST));
  if constexpr (!kArith) {
    return (F & F_RECV) ? rv : uv;
  } else {
    constexpr int N = sizeof(V) / sizeof(T);
    T a[N], b[N];
    memcpy(a, &rv, sizeof(V));
    memcpy(b, &uv, sizeof(V));
#pragma unroll
    for (int i = 0; i < N; i++) a[i] = combine<T, Op, F>(op, a[i], b[i]);
    memcpy(&rv, a, sizeof(V));
    return rv;
  }
}

// Same-width unsigned storage: movements that only copy run on it, so every kernel of the module
// shares the few copy bodies instead of compiling its own.
template <int W> struct BitsOf;
template <> struct BitsOf<1> { using type = uint8_t; };
template <> struct BitsOf<2> { using type = uint16_t; };
template <> struct BitsOf<4> { using type = uint32_t; };
template <> struct BitsOf<8> { using type = uint64_t; };
