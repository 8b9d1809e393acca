// Shared by tests/gpu/check.cu and benches/nccl_bench.cu.
//
// Why one header: the checker and the benchmark must agree on how inputs are generated and how
// a result is judged.  Inputs are a pure function of (seed, dtype, value class, rank, index), so
//   * any process can recompute every rank's input on the host (multi-process checks need no
//     extra communication to build the reference), and
//   * the device generator and the host reference are the same code (__host__ __device__).
// Every generated value is exactly representable in its dtype, so the stored input is known
// exactly; only the collective's own rounding needs a tolerance.
//
// Only the public NCCL API and the CUDA runtime are used, so the same binaries run against
// NVIDIA's libnccl.so.2 and ours.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

// ---------------------------------------------------------------------------------------------
// Error checking: every CUDA / NCCL call goes through one of these; failures name file:line.
// ---------------------------------------------------------------------------------------------
#define CUDACHECK(cmd)                                                                        \
  do {                                                                                        \
    cudaError_t e_ = (cmd);                                                                   \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "FATAL %s:%d CUDA error %s (%s) in: %s\n", __FILE__, __LINE__,          \
              cudaGetErrorName(e_), cudaGetErrorString(e_), #cmd);                            \
      fflush(stderr);                                                                         \
      exit(3);                                                                                \
    }                                                                                         \
  } while (0)

#define NCCLCHECK(cmd)                                                                        \
  do {                                                                                        \
    ncclResult_t r_ = (cmd);                                                                  \
    if (r_ != ncclSuccess) {                                                                  \
      fprintf(stderr, "FATAL %s:%d NCCL error %d (%s) in: %s\n", __FILE__, __LINE__, (int)r_, \
              ncclGetErrorString(r_), #cmd);                                                  \
      fflush(stderr);                                                                         \
      exit(3);                                                                                \
    }                                                                                         \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Data types
// ---------------------------------------------------------------------------------------------
enum { NDTYPES = 12 };

struct DtInfo {
  const char* name;    // our printed name
  const char* ntName;  // nccl-tests' name (benchmark output)
  int size;
  int isInt;
  int isSigned;
  int manBits;  // float: explicit mantissa bits (eps = 2^-manBits); int: 0
  int expBits;  // minifloats: exponent bits (for the exact encoder/decoder)
  int bias;
};

static const DtInfo kDt[NDTYPES] = {
    {"int8", "int8", 1, 1, 1, 0, 0, 0},          {"uint8", "uint8", 1, 1, 0, 0, 0, 0},
    {"int32", "int32", 4, 1, 1, 0, 0, 0},        {"uint32", "uint32", 4, 1, 0, 0, 0, 0},
    {"int64", "int64", 8, 1, 1, 0, 0, 0},        {"uint64", "uint64", 8, 1, 0, 0, 0, 0},
    {"float16", "half", 2, 0, 1, 10, 5, 15},     {"float32", "float", 4, 0, 1, 23, 8, 127},
    {"float64", "double", 8, 0, 1, 52, 11, 1023}, {"bfloat16", "bfloat16", 2, 0, 1, 7, 8, 127},
    {"fp8e4m3", "f8e4m3", 1, 0, 1, 3, 4, 7},     {"fp8e5m2", "f8e5m2", 1, 0, 1, 2, 5, 15},
};

static inline int dtypeFromName(const char* s) {
  for (int i = 0; i < NDTYPES; i++)
    if (!strcmp(s, kDt[i].name) || !strcmp(s, kDt[i].ntName)) return i;
  if (!strcmp(s, "float") || !strcmp(s, "f32")) return 7;
  if (!strcmp(s, "half") || !strcmp(s, "f16")) return 6;
  if (!strcmp(s, "double") || !strcmp(s, "f64")) return 8;
  if (!strcmp(s, "bf16")) return 9;
  if (!strcmp(s, "int")) return 2;
  if (!strcmp(s, "e4m3") || !strcmp(s, "fp8")) return 10;
  if (!strcmp(s, "e5m2")) return 11;
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Reduction kinds: the five built-ins plus PreMulSum with a host scalar and a device scalar.
// ---------------------------------------------------------------------------------------------
enum OpKind { OP_SUM = 0, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PMS_HOST, OP_PMS_DEV, NOPKINDS };
static const char* kOpName[NOPKINDS] = {"sum", "prod", "max", "min", "avg", "pmsH", "pmsD"};

// Value classes: which distribution the inputs come from (chosen per op so the result is
// exact or has a known error bound).
enum ValClass { VC_SUM = 0, VC_PROD = 1, VC_AVG = 2 };
__host__ __device__ inline int valClassFor(int opk) {
  return opk == OP_PROD ? VC_PROD : opk == OP_AVG ? VC_AVG : VC_SUM;
}

// ---------------------------------------------------------------------------------------------
// Counter-based RNG (splitmix64 finalizer): value = f(seed, rank, index), no state.
// ---------------------------------------------------------------------------------------------
__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
__host__ __device__ inline uint64_t rnd64(uint64_t seed, int rank, uint64_t idx) {
  return mix64(seed ^ mix64(((uint64_t)(rank + 1) << 44) ^ idx));
}

// Canonical integer form: the value truncated to the dtype's width, then sign-extended
// (signed types) or zero-extended (unsigned) to 64 bits.  Wrapping arithmetic on canonical
// values in uint64 followed by canon() is exactly the dtype's wrapping arithmetic.
__host__ __device__ inline uint64_t canon(int dt, uint64_t x) {
  switch (dt) {
    case ncclInt8: return (uint64_t)(int64_t)(int8_t)(uint8_t)x;
    case ncclUint8: return x & 0xffULL;
    case ncclInt32: return (uint64_t)(int64_t)(int32_t)(uint32_t)x;
    case ncclUint32: return x & 0xffffffffULL;
    default: return x;
  }
}

// Integer inputs.  Sum/Max/Min/PreMulSum: full-range random (exercises wrap-around).
// Prod: small non-zero values (products wrap deterministically but are not all zero).
// Avg: small values so that no implementation-defined widening can change the result.
__host__ __device__ inline uint64_t genInt(int dt, int cls, uint64_t seed, int rank, uint64_t idx) {
  uint64_t h = rnd64(seed, rank, idx);
  int sg = (dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64);
  if (cls == VC_PROD) {
    if (sg) {
      int64_t t[6] = {-3, -2, -1, 1, 2, 3};
      return canon(dt, (uint64_t)t[h % 6]);
    }
    return canon(dt, 1 + h % 3);
  }
  if (cls == VC_AVG) return sg ? canon(dt, (uint64_t)((int64_t)(h % 32) - 16)) : canon(dt, h % 32);
  return canon(dt, h);
}

// Float inputs, all exactly representable in the dtype:
//   double: 53-bit integers * 2^-49 in [-8,8); float: 24-bit integers * 2^-20 in [-8,8);
//   half/bf16: k/4 with |k| <= 32; fp8: integers in [-8,8].
//   Prod: values near 1 from {0.75,1,1.25,1.5,-1,-1.25} (products of 8 stay in [0.1,26]).
__host__ __device__ inline double genFlt(int dt, int cls, uint64_t seed, int rank, uint64_t idx) {
  uint64_t h = rnd64(seed, rank, idx);
  if (cls == VC_PROD) {
    const double t[6] = {0.75, 1.0, 1.25, 1.5, -1.0, -1.25};
    return t[h % 6];
  }
  switch (dt) {
    case ncclFloat64: return ldexp((double)((int64_t)(h >> 11) - (1LL << 52)), -49);
    case ncclFloat32: return ldexp((double)((int64_t)(h >> 40) - (1LL << 23)), -20);
    case ncclFloat16:
    case ncclBfloat16: return 0.25 * (double)((int)(h % 65) - 32);
    default: return (double)((int)(h % 17) - 8);
  }
}

// Exact encoder for minifloats (half, bf16, fp8): valid for zero and normal values that are
// exactly representable, which is all the generator produces.  Own code instead of CUDA's
// conversion intrinsics so host and device encode identically.
__host__ __device__ inline uint32_t encodeMini(double v, int expBits, int manBits, int bias) {
  uint32_t s = v < 0 ? 1u : 0u;
  double a = fabs(v);
  uint32_t bits = 0;
  if (a != 0.0) {
    int e;
    double m = frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
    uint32_t ef = (uint32_t)(e - 1 + bias);
    uint32_t mf = (uint32_t)((m * 2.0 - 1.0) * (double)(1u << manBits));
    bits = (ef << manBits) | mf;
  }
  return (s << (expBits + manBits)) | bits;
}

// Exact decoder for minifloats, including subnormals, inf and NaN (fp8 e4m3 has no inf;
// its only NaN is S.1111.111).
__host__ __device__ inline double decodeMini(uint32_t b, int expBits, int manBits, int bias, int e4m3) {
  uint32_t s = (b >> (expBits + manBits)) & 1u;
  uint32_t e = (b >> manBits) & ((1u << expBits) - 1);
  uint32_t m = b & ((1u << manBits) - 1);
  double v;
  uint32_t emax = (1u << expBits) - 1;
  if (e4m3) {
    if (e == emax && m == (1u << manBits) - 1) return NAN;
  } else if (e == emax) {
    return m ? NAN : (s ? -INFINITY : INFINITY);
  }
  if (e == 0) v = ldexp((double)m, 1 - bias - manBits);
  else v = ldexp((double)((1u << manBits) | m), (int)e - bias - manBits);
  return s ? -v : v;
}

// Store a generated value (canonical int or exact double) into element i of buf.
__host__ __device__ inline void storeVal(void* buf, size_t i, int dt, uint64_t iv, double dv) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)iv; break;
    case ncclInt32:
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)iv; break;
    case ncclInt64:
    case ncclUint64: ((uint64_t*)buf)[i] = iv; break;
    case ncclFloat32: ((float*)buf)[i] = (float)dv; break;
    case ncclFloat64: ((double*)buf)[i] = dv; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = (uint16_t)encodeMini(dv, 5, 10, 15); break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = (uint16_t)encodeMini(dv, 8, 7, 127); break;
    case ncclFloat8e4m3: ((uint8_t*)buf)[i] = (uint8_t)encodeMini(dv, 4, 3, 7); break;
    case ncclFloat8e5m2: ((uint8_t*)buf)[i] = (uint8_t)encodeMini(dv, 5, 2, 15); break;
  }
}

// Load element i of buf: ints in canonical form into *iv, floats as double into *dv.
__host__ __device__ inline void loadVal(const void* buf, size_t i, int dt, uint64_t* iv, double* dv) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8: *iv = canon(dt, ((const uint8_t*)buf)[i]); break;
    case ncclInt32:
    case ncclUint32: *iv = canon(dt, ((const uint32_t*)buf)[i]); break;
    case ncclInt64:
    case ncclUint64: *iv = ((const uint64_t*)buf)[i]; break;
    case ncclFloat32: *dv = ((const float*)buf)[i]; break;
    case ncclFloat64: *dv = ((const double*)buf)[i]; break;
    case ncclFloat16: *dv = decodeMini(((const uint16_t*)buf)[i], 5, 10, 15, 0); break;
    case ncclBfloat16: *dv = decodeMini(((const uint16_t*)buf)[i], 8, 7, 127, 0); break;
    case ncclFloat8e4m3: *dv = decodeMini(((const uint8_t*)buf)[i], 4, 3, 7, 1); break;
    case ncclFloat8e5m2: *dv = decodeMini(((const uint8_t*)buf)[i], 5, 2, 15, 0); break;
  }
}

__host__ __device__ inline int dtIsInt(int dt) { return dt <= ncclUint64; }
__host__ __device__ inline int dtIsSignedInt(int dt) {
  return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64;
}

// Generated value of (rank, idx) as (iv, dv).
__host__ __device__ inline void genVal(int dt, int cls, uint64_t seed, int rank, uint64_t idx,
                                       uint64_t* iv, double* dv) {
  if (dtIsInt(dt)) *iv = genInt(dt, cls, seed, rank, idx);
  else *dv = genFlt(dt, cls, seed, rank, idx);
}

// PreMulSum scalars, per rank (ranks may pass different scalars: the scalar is local).
// Floats: exactly representable in every float dtype.  Ints: small, signed ones negative for
// the device variant.
__host__ __device__ inline void premulScalar(int dt, int opk, int rank, uint64_t* iv, double* dv) {
  if (dtIsInt(dt)) {
    if (opk == OP_PMS_HOST) *iv = canon(dt, (uint64_t)(rank % 3 + 2));
    else *iv = dtIsSignedInt(dt) ? canon(dt, (uint64_t)(-(int64_t)(rank % 2 + 1))) : canon(dt, (uint64_t)(rank % 2 + 1));
  } else {
    const double h[4] = {0.5, 1.25, 0.75, 1.5};
    const double d[4] = {1.5, -0.75, 1.25, -0.5};
    *dv = opk == OP_PMS_HOST ? h[rank % 4] : d[rank % 4];
  }
}

// ---------------------------------------------------------------------------------------------
// Reference reduction.  Ints: exact wrapping arithmetic in the dtype (Avg = wrapped sum / n with
// C truncation).  Floats: computed in double; mag = the scale of the rounding error the
// collective may make (sum of |terms| for sum-like ops, |product| for Prod, 0 for Max/Min).
// ---------------------------------------------------------------------------------------------
struct RefVal {
  uint64_t iv;
  double dv;
  double mag;
};

__host__ __device__ inline RefVal reduceRef(int dt, int opk, int nranks, uint64_t seed, uint64_t idx) {
  int cls = valClassFor(opk);
  RefVal r;
  r.iv = 0;
  r.dv = 0;
  r.mag = 0;
  if (dtIsInt(dt)) {
    int sg = dtIsSignedInt(dt);
    uint64_t acc = 0;
    for (int q = 0; q < nranks; q++) {
      uint64_t x = genInt(dt, cls, seed, q, idx);
      if (opk == OP_PMS_HOST || opk == OP_PMS_DEV) {
        uint64_t s;
        double dd;
        premulScalar(dt, opk, q, &s, &dd);
        x = canon(dt, x * s);
      }
      if (q == 0) { acc = x; continue; }
      switch (opk) {
        case OP_PROD: acc = canon(dt, acc * x); break;
        case OP_MAX: acc = sg ? ((int64_t)x > (int64_t)acc ? x : acc) : (x > acc ? x : acc); break;
        case OP_MIN: acc = sg ? ((int64_t)x < (int64_t)acc ? x : acc) : (x < acc ? x : acc); break;
        default: acc = canon(dt, acc + x); break;
      }
    }
    if (opk == OP_AVG) {
      if (sg) acc = canon(dt, (uint64_t)((int64_t)acc / (int64_t)nranks));
      else acc = acc / (uint64_t)nranks;
    }
    r.iv = acc;
    return r;
  }
  double acc = 0, mag = 0;
  for (int q = 0; q < nranks; q++) {
    double x = genFlt(dt, cls, seed, q, idx);
    if (opk == OP_PMS_HOST || opk == OP_PMS_DEV) {
      uint64_t si;
      double s;
      premulScalar(dt, opk, q, &si, &s);
      x *= s;
    }
    if (opk == OP_AVG) x /= nranks;
    if (q == 0) {
      acc = x;
      mag = fabs(x);
      continue;
    }
    switch (opk) {
      case OP_PROD: acc *= x; break;
      case OP_MAX: acc = x > acc ? x : acc; break;
      case OP_MIN: acc = x < acc ? x : acc; break;
      default: acc += x; mag += fabs(x); break;
    }
  }
  if (opk == OP_PROD) mag = fabs(acc);
  if (opk == OP_MAX || opk == OP_MIN) mag = 0;
  r.dv = acc;
  r.mag = mag;
  return r;
}

// Tolerance (floats): |got - ref| <= (nranks + 2) * eps(dtype) * mag + 1e-12, eps = 2^-manBits:
//   float64 2^-52, float32 2^-23, float16 2^-10, bfloat16 2^-7, fp8e4m3 2^-3, fp8e5m2 2^-2.
// Why: recursive summation of n terms rounds at most n-1 times by u = eps/2 each, PreMulSum and
// Avg add one rounding of x*s, and the double reference itself is off by < n*2^-53; (n+2)*eps
// is about twice that bound.  Max/Min and pure copies: exact.  Ints: exact.
__host__ __device__ inline int valueMatches(int dt, int exact, int nranks, const RefVal& ref, uint64_t giv,
                                            double gdv) {
  if (dtIsInt(dt)) return giv == ref.iv;
  if (isnan(gdv)) return 0;
  if (exact) return gdv == ref.dv;
  double eps = ldexp(1.0, -(int)(dt == ncclFloat64 ? 52 : dt == ncclFloat32 ? 23 : dt == ncclFloat16 ? 10
                                 : dt == ncclBfloat16 ? 7 : dt == ncclFloat8e4m3 ? 3 : 2));
  double tol = (nranks + 2) * eps * ref.mag + 1e-12;
  return fabs(gdv - ref.dv) <= tol;
}

#ifndef COMMON_NO_KERNELS  // (host-only unit test of the functions above defines it)
// ---------------------------------------------------------------------------------------------
// Device kernels: fill a buffer with rank `rank`'s generated values (index base idx0), and an
// element-wise checker used by the benchmark.
// ---------------------------------------------------------------------------------------------
__global__ void genKernel(void* buf, size_t n, int dt, int cls, uint64_t seed, int rank, uint64_t idx0) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t iv = 0;
    double dv = 0;
    genVal(dt, cls, seed, rank, idx0 + i, &iv, &dv);
    storeVal(buf, i, dt, iv, dv);
  }
}

static inline void launchGen(void* buf, size_t n, int dt, int cls, uint64_t seed, int rank, uint64_t idx0,
                             cudaStream_t s) {
  if (n == 0) return;
  size_t blocks = (n + 255) / 256;
  if (blocks > 2048) blocks = 2048;
  genKernel<<<(unsigned)blocks, 256, 0, s>>>(buf, n, dt, cls, seed, rank, idx0);
  CUDACHECK(cudaGetLastError());
}

#endif  // COMMON_NO_KERNELS

static inline const char* dtName(int dt) { return (dt >= 0 && dt < NDTYPES) ? kDt[dt].name : "?"; }

// Runs rank(r) in `procs` forked processes (after ncclGetUniqueId, before any CUDA call of the
// parent) and waits for them all; how many did not exit 0 (each named on stderr).
template <typename Rank>
static int runRankProcesses(int procs, Rank rank) {
  fflush(stdout);
  std::vector<pid_t> pids(procs);
  for (int r = 0; r < procs; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return procs;
    }
    if (pids[r] == 0) {
      int rc = rank(r);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  int failed = 0;
  for (int r = 0; r < procs; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d ended with status %#x\n", r, st);
      failed++;
    }
  }
  return failed;
}
