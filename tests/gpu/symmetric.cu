// symmetric.cu: collectives on buffers in symmetric windows (the symmetric kernels,
// docs/ARCHITECTURE.md "Symmetric kernels"), --procs processes, each rank on GPU 0 (or on GPU
// rank % devices with --spread).
//
// Check mode (default): with FERRONICKEL_SYMMETRIC=1 (set here before init, so every size takes
// the symmetric kernels), each rank allocates two buffers with ncclMemAlloc, registers each as a
// symmetric window, and runs all-reduce and reduce-scatter for every data type and every op (sum,
// prod, max, min, avg, PreMulSum with a host and with a device scalar, each rank its own scalar),
// and all-gather for every data type; in place and out of place; at several counts; with the
// buffers at offset 0 of their windows and at an odd offset (the kernels' elementwise path).
// Outputs (and a guard band around them) are poisoned first; every element is compared with the
// host reference of tests/gpu/common.cuh, and the guard band must stay poisoned. Then one CUDA
// graph holding an all-reduce, an all-gather and a reduce-scatter is captured, replayed twice and
// checked. Prints "SYMMETRIC: PASS|FAIL ..." last; exits 0 only if every rank passed.
//
// Bench mode (--bench): float sum all-reduce, 8 B to 16 MB, each size run --iters times on
// buffers in symmetric windows (the symmetric kernels) and on cudaMalloc buffers (the ordinary
// kernels); rank 0 prints a table of the median time per call. Timings never fail the run.
//
// usage: symmetric [--procs N] [--spread] [--bench] [--iters N]
#include "common.cuh"
#include "expect.cuh"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

static const unsigned char kPoison = 0xa5;
static const size_t kGuard = 64;  // bytes checked on each side of an output

enum Coll { C_ALLREDUCE, C_ALLGATHER, C_REDUCESCATTER };
static const char* kCollName[] = {"allreduce", "allgather", "reducescatter"};

struct Rank {
  int rank, n;
  ncclComm_t comm;
  cudaStream_t s;
  char* send;  // ncclMemAlloc'd, registered as a symmetric window over all of it
  char* recv;
  size_t bytes;
  ncclWindow_t wsend, wrecv;
  void* dscalar;
};

// The op of a case, made for this rank (PreMulSum: this rank's own scalar).
static ncclRedOp_t makeOp(Rank& R, int dt, int opk) {
  if (opk < OP_PMS_HOST) return (ncclRedOp_t)opk;  // sum, prod, max, min, avg
  uint64_t iv;
  double dv;
  premulScalar(dt, opk, R.rank, &iv, &dv);
  uint8_t sb[16] = {0};
  storeVal(sb, 0, dt, iv, dv);
  ncclRedOp_t op;
  if (opk == OP_PMS_HOST) {
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op, sb, (ncclDataType_t)dt, ncclScalarHostImmediate, R.comm));
  } else {
    CUDACHECK(cudaMemcpy(R.dscalar, sb, 16, cudaMemcpyHostToDevice));
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op, R.dscalar, (ncclDataType_t)dt, ncclScalarDevice, R.comm));
  }
  return op;
}

struct Layout {
  char* in;    // this rank's input
  char* out;   // the whole output
  size_t inBytes, outBytes;
};

// Where a case's input and output lie: `off` bytes into the windows; in place as NCCL defines it.
static Layout layout(Rank& R, int coll, size_t count, int dt, bool inPlace, size_t off) {
  size_t e = kDt[dt].size, n = R.n;
  Layout L;
  L.inBytes = (coll == C_REDUCESCATTER ? n : 1) * count * e;
  L.outBytes = (coll == C_ALLGATHER ? n : 1) * count * e;
  L.out = R.recv + kGuard + off;
  if (!inPlace) L.in = R.send + kGuard + off;
  else if (coll == C_ALLREDUCE || coll == C_REDUCESCATTER) L.in = L.out;
  else L.in = L.out + R.rank * count * e;
  if (inPlace && coll == C_REDUCESCATTER) L.out = L.in + R.rank * count * e;
  return L;
}

static void enqueue(Rank& R, int coll, const Layout& L, size_t count, int dt, ncclRedOp_t op) {
  auto t = (ncclDataType_t)dt;
  if (coll == C_ALLREDUCE) NCCLCHECK(ncclAllReduce(L.in, L.out, count, t, op, R.comm, R.s));
  else if (coll == C_ALLGATHER) NCCLCHECK(ncclAllGather(L.in, L.out, count, t, R.comm, R.s));
  else NCCLCHECK(ncclReduceScatter(L.in, L.out, count, t, op, R.comm, R.s));
}

// Poisons the receive window, then writes this rank's input.
static void prepare(Rank& R, int coll, const Layout& L, size_t count, int dt, int opk, uint64_t seed) {
  CUDACHECK(cudaMemsetAsync(R.recv, kPoison, R.bytes, R.s));
  launchGen(L.in, L.inBytes / kDt[dt].size, dt, valClassFor(opk), seed, R.rank, 0, R.s);
}

// Compares every output element with the reference, and the guard bands around the region the
// collective may write (in place: input and output together) with the poison.
static void verify(Rank& R, int coll, const Layout& L, size_t count, int dt, int opk, uint64_t seed,
                   const std::string& what) {
  bool inPlace = L.in >= R.recv && L.in < R.recv + R.bytes;
  char* lo = inPlace ? std::min(L.in, L.out) : L.out;
  char* hi = inPlace ? std::max(L.in + L.inBytes, L.out + L.outBytes) : L.out + L.outBytes;
  std::vector<unsigned char> h((hi - lo) + 2 * kGuard);
  CUDACHECK(cudaMemcpy(h.data(), lo - kGuard, h.size(), cudaMemcpyDeviceToHost));
  const unsigned char* out = h.data() + kGuard + (L.out - lo);
  size_t e = kDt[dt].size, bad = 0, first = (size_t)-1;
  size_t nOut = L.outBytes / e;
  for (size_t i = 0; i < nOut; i++) {
    uint64_t giv;
    double gdv;
    loadVal(out, i, dt, &giv, &gdv);
    bool ok;
    if (coll == C_ALLGATHER) {
      uint64_t wiv;
      double wdv;
      genVal(dt, valClassFor(opk), seed, (int)(i / count), i % count, &wiv, &wdv);
      ok = dtIsInt(dt) ? giv == wiv : gdv == wdv;
    } else {
      uint64_t idx = coll == C_REDUCESCATTER ? R.rank * count + i : i;
      RefVal ref = reduceRef(dt, opk, R.n, seed, idx);
      ok = valueMatches(dt, opk == OP_MAX || opk == OP_MIN, R.n, ref, giv, gdv);
    }
    if (!ok) {
      if (first == (size_t)-1) first = i;
      bad++;
    }
  }
  EXPECT(bad == 0, "%s: %zu of %zu elements wrong, first at %zu", what.c_str(), bad, nOut, first);
  size_t guardBad = 0;
  for (size_t i = 0; i < kGuard; i++) {
    guardBad += h[i] != kPoison;
    guardBad += h[h.size() - 1 - i] != kPoison;
  }
  EXPECT(guardBad == 0, "%s: %zu guard bytes around the output were written", what.c_str(), guardBad);
}

static void runCase(Rank& R, int coll, size_t count, int dt, int opk, bool inPlace, size_t off, uint64_t seed) {
  Layout L = layout(R, coll, count, dt, inPlace, off);
  prepare(R, coll, L, count, dt, opk, seed);
  ncclRedOp_t op = coll == C_ALLGATHER ? ncclSum : makeOp(R, dt, opk);
  enqueue(R, coll, L, count, dt, op);
  CUDACHECK(cudaStreamSynchronize(R.s));
  if (opk >= OP_PMS_HOST && coll != C_ALLGATHER) NCCLCHECK(ncclRedOpDestroy(op, R.comm));
  char what[160];
  snprintf(what, sizeof what, "%s %s %s count %zu %s offset %zu", kCollName[coll], dtName(dt),
           coll == C_ALLGATHER ? "-" : kOpName[opk], count, inPlace ? "in place" : "out of place", off);
  verify(R, coll, L, count, dt, opk, seed, what);
}

// One graph with an all-reduce, an all-gather and a reduce-scatter on disjoint parts of the
// windows, replayed twice (the barriers' counts go on across replays).
static void runGraph(Rank& R) {
  const int dt = ncclFloat32;
  const size_t count = 3000, e = 4, part = 256 << 10;
  cudaStream_t cs;
  CUDACHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  Layout L[3];
  for (int c = 0; c < 3; c++) {
    L[c] = layout(R, c, count, dt, false, c * part);
    EXPECT(L[c].outBytes + 2 * kGuard <= part, "graph parts overlap");
  }
  for (int rep = 0; rep < 2; rep++) {
    CUDACHECK(cudaMemsetAsync(R.recv, kPoison, R.bytes, R.s));
    for (int c = 0; c < 3; c++) launchGen(L[c].in, L[c].inBytes / e, dt, VC_SUM, 77 + rep, R.rank, 0, R.s);
    CUDACHECK(cudaStreamSynchronize(R.s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDACHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    Rank C = R;
    C.s = cs;
    for (int c = 0; c < 3; c++) enqueue(C, c, L[c], count, dt, ncclSum);
    CUDACHECK(cudaStreamEndCapture(cs, &g));
    CUDACHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDACHECK(cudaGraphLaunch(ge, cs));
    CUDACHECK(cudaStreamSynchronize(cs));
    for (int c = 0; c < 3; c++) verify(R, c, L[c], count, dt, OP_SUM, 77 + rep, std::string("graph ") + kCollName[c]);
    CUDACHECK(cudaGraphExecDestroy(ge));
    CUDACHECK(cudaGraphDestroy(g));
  }
  CUDACHECK(cudaStreamDestroy(cs));
}

static double medianUs(Rank& R, void* in, void* out, size_t count, int iters) {
  cudaEvent_t a, b;
  CUDACHECK(cudaEventCreate(&a));
  CUDACHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters + 3; i++) {
    CUDACHECK(cudaEventRecord(a, R.s));
    NCCLCHECK(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, R.comm, R.s));
    CUDACHECK(cudaEventRecord(b, R.s));
    CUDACHECK(cudaEventSynchronize(b));
    float t;
    CUDACHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 3) ms.push_back(t);  // the first calls load kernels
  }
  CUDACHECK(cudaEventDestroy(a));
  CUDACHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0;
}

static void bench(Rank& R, int iters, bool spread) {
  char *pin, *pout;
  CUDACHECK(cudaMalloc(&pin, R.bytes));
  CUDACHECK(cudaMalloc(&pout, R.bytes));
  if (R.rank == 0) {
    printf("symmetric bench: float sum all-reduce, %d processes on %s, median of %d calls (us)\n", R.n,
           spread ? "one GPU each" : "GPU 0", iters);
    printf("%12s %14s %14s %8s\n", "bytes", "symmetric", "ordinary", "ratio");
  }
  for (size_t bytes = 8; bytes <= (16u << 20); bytes *= 2) {
    size_t count = bytes / 4;
    double sym = medianUs(R, R.send + kGuard, R.recv + kGuard, count, iters);
    double ord = medianUs(R, pin, pout, count, iters);
    if (R.rank == 0) printf("%12zu %14.1f %14.1f %8.2f\n", bytes, sym, ord, ord / sym);
  }
  CUDACHECK(cudaFree(pin));
  CUDACHECK(cudaFree(pout));
}

static int runRank(const ncclUniqueId& id, int rank, int n, bool benchMode, int iters, bool spread) {
  gRank = rank;
  setenv("FERRONICKEL_SYMMETRIC", "1", 1);
  int ndev = 1;
  CUDACHECK(cudaGetDeviceCount(&ndev));
  CUDACHECK(cudaSetDevice(spread ? rank % ndev : 0));
  Rank R{};
  R.rank = rank;
  R.n = n;
  NCCLCHECK(ncclCommInitRank(&R.comm, n, id, rank));
  CUDACHECK(cudaStreamCreateWithFlags(&R.s, cudaStreamNonBlocking));
  CUDACHECK(cudaMalloc(&R.dscalar, 16));
  R.bytes = benchMode ? (16u << 20) + 4 * kGuard : (4u << 20);
  NCCLCHECK(ncclMemAlloc((void**)&R.send, R.bytes));
  NCCLCHECK(ncclMemAlloc((void**)&R.recv, R.bytes));
  NCCLCHECK(ncclCommWindowRegister(R.comm, R.send, R.bytes, &R.wsend, NCCL_WIN_COLL_SYMMETRIC));
  NCCLCHECK(ncclCommWindowRegister(R.comm, R.recv, R.bytes, &R.wrecv, NCCL_WIN_COLL_SYMMETRIC));
  if (benchMode) {
    bench(R, iters, spread);
  } else {
    const size_t counts[] = {1, 1029, 33000};
    uint64_t seed = 1000;
    for (int dt = 0; dt < NDTYPES; dt++) {
      for (size_t count : counts) {
        for (int inPlace = 0; inPlace < 2; inPlace++) {
          // At the windows' start and at an odd offset (the elementwise path).
          for (size_t off : {(size_t)0, (size_t)kDt[dt].size * 3}) {
            runCase(R, C_ALLGATHER, count, dt, OP_SUM, inPlace, off, seed++);
            for (int opk = 0; opk < NOPKINDS; opk++) {
              runCase(R, C_ALLREDUCE, count, dt, opk, inPlace, off, seed++);
              runCase(R, C_REDUCESCATTER, count, dt, opk, inPlace, off, seed++);
            }
          }
        }
      }
      if (rank == 0) printf("rank 0: %s done (%d failures so far)\n", dtName(dt), gFailures);
      fflush(stdout);
    }
    runGraph(R);
  }
  NCCLCHECK(ncclCommWindowDeregister(R.comm, R.wsend));
  NCCLCHECK(ncclCommWindowDeregister(R.comm, R.wrecv));
  NCCLCHECK(ncclMemFree(R.send));
  NCCLCHECK(ncclMemFree(R.recv));
  CUDACHECK(cudaFree(R.dscalar));
  NCCLCHECK(ncclCommDestroy(R.comm));
  printf("rank %d: %s (%d failures)\n", rank, gFailures ? "FAIL" : "PASS", gFailures);
  return gFailures ? 1 : 0;
}

int main(int argc, char** argv) {
  int procs = 2, iters = 50;
  bool benchMode = false, spread = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bench")) benchMode = true;
    else if (!strcmp(argv[i], "--spread")) spread = true;
    else {
      fprintf(stderr, "usage: symmetric [--procs N] [--spread] [--bench] [--iters N]\n");
      return 2;
    }
  }
  if (procs < 2 || procs > 16 || iters < 1) {
    fprintf(stderr, "--procs %d: 2 to 16; --iters %d: at least 1\n", procs, iters);
    return 2;
  }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  int failed = runRankProcesses(procs, [&](int r) { return runRank(id, r, procs, benchMode, iters, spread); });
  printf("SYMMETRIC: %s (%d processes, %s, %d failed)\n", failed ? "FAIL" : "PASS", procs,
         benchMode ? "bench" : "check", failed);
  return failed ? 1 : 0;
}
