// net_bench.cu: the nine collectives of nccl-tests between processes that each claim a host of
// their own (NCCL_HOSTID), so the library under test moves every byte through its NET transport
// (for ferronickel: the proxy thread and the Socket net; for NVIDIA's NCCL: NET/Socket), all on one
// GPU. With --one-host the processes keep the machine's host identity, so the library picks P2P
// or, under NCCL_P2P_DISABLE=1, SHM; --gpus G puts rank r on GPU dev + r % G (NCCL needs a GPU per
// rank). With --uts a host is told apart as production does, by host name: each rank process takes
// a UTS namespace of its own with its own host name, and no NCCL_HOSTID (needs CAP_SYS_ADMIN).
// --per-host R puts R consecutive ranks on each host (the same NCCL_HOSTID, or the same host name
// in their own namespaces), so that NET between hosts and P2P or SHM inside one mix; NCCL then
// needs --gpus R or more.
//
// Public NCCL API only: the same binary runs against either library (LD_LIBRARY_PATH). One process
// per rank, forked after ncclGetUniqueId and before any CUDA call; the processes share a page of
// memory for the control plane (barriers, the stop decision, the timings), so nothing but the
// measured calls goes over the library's network.
//
// Collectives, float, sum, root 0 (--root R: another), out of place, each as nccl-tests runs it: all_reduce,
// all_gather, reduce_scatter, broadcast, reduce, sendrecv (a ring: send to rank+1, receive from
// rank-1, in one group), alltoall (ncclSend/ncclRecv with every peer, itself included, in one
// group), gather and scatter (ncclSend/ncclRecv to and from root 0, itself included, in one group).
// Sizes as nccl-tests' -b/-e: a size S is S/4 floats, and for the collectives whose buffers differ
// per rank (all_gather, reduce_scatter, alltoall, gather, scatter) each rank's part is S/4/n floats
// and the size reported is the larger buffer, n x part x 4 bytes (all_gather's and gather's output,
// reduce_scatter's and scatter's input, alltoall's either); a size whose part is 0 floats is left
// out. Bus bandwidth as nccl-tests: all_reduce 2(n-1)/n x algbw; all_gather, reduce_scatter,
// alltoall, gather, scatter (n-1)/n; broadcast, reduce, sendrecv 1; algbw = size / time.
//
// Per collective and size: one checked call (outputs poisoned, inputs rank r element j =
// r*4096 + j%4093, exact in float even summed over 8 ranks, every output element compared on the
// host), --warmup more calls, a barrier of all ranks, then timed calls one at a time, each
// followed by a barrier (the ranks leave a barrier together, at a start line 20 us after the last
// one came): CUDA events around the one call on each rank's stream, wait for the end
// event. A call's time is the slowest rank's. Rank 0 stops the timed calls after --iters, or once
// --budget-s has passed and at least 5 were timed, and tells the others at the barrier, so every
// rank makes the same calls. Rows give the median (p50), p99 (nearest rank), mean, and the
// bandwidths at the median.
// A watchdog per rank (SIGALRM after --timeout-s in one size, or at init or teardown) names the
// collective, size and stage it was stuck in and exits 3.
//
// usage: net_bench [--nranks 2] [--dev 0] [--gpus 1] [--one-host | --uts] [--colls all|a,b,c]
//                  [--min 8] [--max 512M] [--iters 200] [--warmup 3] [--budget-s 0.25] [--timeout-s 60]
//                  [--calls] [--gap-us 0] [--graph K] [--busy C [--busy-alu]] [--pin K] [--root 0]
// --busy C: while a size's warm-up and timed calls run, C blocks of a kernel on another stream of
// the rank read and write a 256 MiB buffer without pause, as compute beside communication does
// (its stores are what a fence in the library's kernels may have to wait for). With --busy-alu
// the blocks only compute in registers: the same SMs taken, no memory traffic.
// --graph K: each size's K calls are captured into one CUDA graph (global capture mode, as
// PyTorch's default), and a timed call is one launch of that graph: its time is the launch's
// divided by K, the steady state of calls back to back on the device with no host enqueue between
// them. The checked call is then a launch of the graph too. Not with --gap-us.
// --gap-us G: before each timed call, a kernel on the rank's stream that spins G us, as the compute
// before a collective in a training step: the call is enqueued while it runs, so the library sees
// the launch G us before the kernel moves data (its time is not the call's).
// --pin K: rank r runs on K CPUs of its own, the r-th K of those the program may use, as a launcher
// that binds each rank (mpirun --bind-to, a batch system's CPU binding) places a job's processes:
// every thread a library starts then stays on its rank's CPUs (both libraries bind their threads
// within the set they start in), and where the scheduler puts a rank's threads no longer differs
// from one run to the next.
// --root R: the root of broadcast, reduce, gather and scatter (nccl-tests' -r), so that a rooted
// collective's bytes flow toward or away from a rank other than 0.
// --calls adds, after each row, "# calls" lines: the size's five slowest calls with every rank's
// time, and every call's time in order.
// Output: "# ..." header lines, rows "coll bytes iters p50_us p99_us mean_us algbw_GBs busbw_GBs
// wrong", and last "NET_BENCH: PASS" or "NET_BENCH: FAIL <why>" (exit 1).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <string>
#include <vector>

#include "size_arg.h"

enum Coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, SENDRECV, ALLTOALL, GATHER, SCATTER, NCOLLS };
static const char* kCollName[NCOLLS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                                        "sendrecv",   "alltoall",   "gather",         "scatter"};
static const int kMaxRanks = 8, kMaxIters = 1000, kMinIters = 5;

// Where this rank is, for the watchdog and the error macros.
static int gRank = -1;
static volatile int gColl = -1, gIter = -1;
static volatile size_t gBytes = 0;
static const char* volatile gStage = "start";

static void where(char* buf, size_t len) {
  int at = snprintf(buf, len, "rank %d, %s", gRank, gStage);
  if (gColl >= 0 && at > 0 && (size_t)at < len)
    at += snprintf(buf + at, len - at, ", %s %zu B", kCollName[gColl], (size_t)gBytes);
  if (gIter >= 0 && at > 0 && (size_t)at < len) snprintf(buf + at, len - at, ", timed call %d", gIter);
}

// A failed CUDA or NCCL call: what failed, where this rank was, and the exit code that says which.
static void failCall(const char* file, int line, const char* call, const char* err, const char* more, int code) {
  char w[160];
  where(w, sizeof w);
  fprintf(stderr, "%s:%d %s: %s%s%s (%s)\n", file, line, call, err, more ? " " : "", more ? more : "", w);
  _exit(code);
}
#define CK(cmd)                                                                                 \
  do {                                                                                          \
    cudaError_t e_ = (cmd);                                                                     \
    if (e_ != cudaSuccess) failCall(__FILE__, __LINE__, #cmd, cudaGetErrorString(e_), nullptr, 3); \
  } while (0)
#define NK(cmd)                                                                                              \
  do {                                                                                                       \
    ncclResult_t r_ = (cmd);                                                                                 \
    if (r_ != ncclSuccess) failCall(__FILE__, __LINE__, #cmd, ncclGetErrorString(r_), ncclGetLastError(nullptr), 4); \
  } while (0)

// SIGALRM: a rank stuck past --timeout-s (or told by the parent that a peer died) says where.
static void onAlarm(int) {
  char w[160], line[224];
  where(w, sizeof w);
  int len = snprintf(line, sizeof line, "NET_BENCH: HANG watchdog: %s\n", w);
  if (len > 0 && write(2, line, (size_t)len) < 0) _exit(3);
  _exit(3);
}

// The control plane, in memory every rank process shares (mmap before fork).
struct Shared {
  std::atomic<int> arrived, gen;
  std::atomic<int> at[kMaxRanks];    // the barrier generation each rank last arrived at
  int stop[2];                       // rank 0's stop decision, by barrier generation parity
  float us[kMaxRanks][kMaxIters];    // this size's timed calls, per rank
  long wrongNow[kMaxRanks];          // this size's wrong output elements, per rank
  long wrong[kMaxRanks];             // all sizes
  char firstWrong[kMaxRanks][160];   // the first wrong element each rank saw
  double startLine;                  // when the ranks leave the last barrier (CLOCK_MONOTONIC, s)
};

// How far ahead of the barrier's release its start line lies: more than the ranks spinning on the
// release take to see it (well under a microsecond, a few after a yield).
static const double kStartLead = 20e-6;

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// All ranks meet; rank 0's `stop` (ignored elsewhere) reaches every rank. Waits at most
// timeoutS, then names the ranks that never came and exits 3. Every rank then waits for the start
// line the last one to arrive set, kStartLead after it came, so that they leave together: without
// it the last rank left first (it sees its own arrival at once, the others when the release
// reaches them), and a collective whose receivers arrive last (a broadcast's, a reduce's root)
// timed their lead, 0.15-2.6 us in the median, on top of the library's time.
static bool barrier(Shared* sh, int rank, int n, bool stop, double timeoutS) {
  const char* stage = gStage;
  gStage = "barrier";
  const int g = sh->gen.load(std::memory_order_acquire);
  if (rank == 0) sh->stop[g & 1] = stop;
  sh->at[rank].store(g + 1, std::memory_order_relaxed);
  if (sh->arrived.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
    sh->arrived.store(0, std::memory_order_relaxed);
    sh->startLine = now() + kStartLead;  // published by the release below
    sh->gen.store(g + 1, std::memory_order_release);
  } else {
    const double deadline = now() + timeoutS;
    for (long spin = 0; sh->gen.load(std::memory_order_acquire) == g; spin++) {
      if (spin % 1024 == 1023) {
        if (now() > deadline) {
          char w[160];
          where(w, sizeof w);
          fprintf(stderr, "NET_BENCH: HANG %s: waited %.0f s for rank(s):", w, timeoutS);
          for (int r = 0; r < n; r++)
            if (sh->at[r].load(std::memory_order_relaxed) <= g) fprintf(stderr, " %d", r);
          fprintf(stderr, "\n");
          _exit(3);
        }
        sched_yield();
      }
    }
  }
  // Read before the next barrier's release can move it: that needs this rank's arrival there.
  const double line = sh->startLine;
  while (now() < line) {
  }
  gStage = stage;
  return sh->stop[g & 1] != 0;
}

// One collective at one size: its counts, the size reported and the bus bandwidth factor.
struct Shape {
  size_t part;       // elements each rank's call names (nccl-tests' count parameter)
  size_t recvElems;  // elements of the receive buffer the call writes (root's, for gather)
  size_t bytes;      // the size reported
  double busFactor;
};

static Shape shapeOf(int coll, size_t sizeBytes, int n) {
  const size_t count = sizeBytes / sizeof(float), part = count / n;
  const double ring = double(n - 1) / n;
  switch (coll) {
    case ALL_REDUCE: return {count, count, count * 4, 2 * ring};
    case ALL_GATHER:
    case GATHER:
    case ALLTOALL: return {part, part * n, part * n * 4, ring};
    case REDUCE_SCATTER:
    case SCATTER: return {part, part, part * n * 4, ring};
    default: return {count, count, count * 4, 1.0};  // broadcast, reduce, sendrecv
  }
}

static float input(int rank, size_t j) { return float(rank * 4096 + int(j % 4093)); }

// The rooted collectives' root (--root).
static int gRoot = 0;

static void run(int coll, const Shape& s, const float* send, float* recv, int rank, int n, ncclComm_t comm,
                cudaStream_t st) {
  const size_t c = s.part;
  switch (coll) {
    case ALL_REDUCE: NK(ncclAllReduce(send, recv, c, ncclFloat, ncclSum, comm, st)); break;
    case ALL_GATHER: NK(ncclAllGather(send, recv, c, ncclFloat, comm, st)); break;
    case REDUCE_SCATTER: NK(ncclReduceScatter(send, recv, c, ncclFloat, ncclSum, comm, st)); break;
    case BROADCAST: NK(ncclBroadcast(send, recv, c, ncclFloat, gRoot, comm, st)); break;
    case REDUCE: NK(ncclReduce(send, recv, c, ncclFloat, ncclSum, gRoot, comm, st)); break;
    case SENDRECV:
      NK(ncclGroupStart());
      NK(ncclSend(send, c, ncclFloat, (rank + 1) % n, comm, st));
      NK(ncclRecv(recv, c, ncclFloat, (rank + n - 1) % n, comm, st));
      NK(ncclGroupEnd());
      break;
    case ALLTOALL:
      NK(ncclGroupStart());
      for (int p = 0; p < n; p++) {
        NK(ncclSend(send + p * c, c, ncclFloat, p, comm, st));
        NK(ncclRecv(recv + p * c, c, ncclFloat, p, comm, st));
      }
      NK(ncclGroupEnd());
      break;
    case GATHER:
      NK(ncclGroupStart());
      NK(ncclSend(send, c, ncclFloat, gRoot, comm, st));
      if (rank == gRoot)
        for (int p = 0; p < n; p++) NK(ncclRecv(recv + p * c, c, ncclFloat, p, comm, st));
      NK(ncclGroupEnd());
      break;
    case SCATTER:
      NK(ncclGroupStart());
      if (rank == gRoot)
        for (int p = 0; p < n; p++) NK(ncclSend(send + p * c, c, ncclFloat, p, comm, st));
      NK(ncclRecv(recv, c, ncclFloat, gRoot, comm, st));
      NK(ncclGroupEnd());
      break;
  }
}

// The value this rank's output element j must hold; false where the call writes nothing here.
static bool expected(int coll, const Shape& s, int rank, int n, size_t j, float* want) {
  const size_t c = s.part;
  auto sum = [&](size_t at) {
    double v = 0;
    for (int p = 0; p < n; p++) v += input(p, at);
    return float(v);
  };
  switch (coll) {
    case ALL_REDUCE: *want = sum(j); return true;
    case ALL_GATHER: *want = input(int(j / c), j % c); return true;
    case REDUCE_SCATTER: *want = sum(rank * c + j); return true;
    case BROADCAST: *want = input(gRoot, j); return true;
    case REDUCE: *want = sum(j); return rank == gRoot;
    case SENDRECV: *want = input((rank + n - 1) % n, j); return true;
    case ALLTOALL: *want = input(int(j / c), rank * c + j % c); return true;
    case GATHER: *want = input(int(j / c), j % c); return rank == gRoot;
    case SCATTER: *want = input(gRoot, rank * c + j); return true;
  }
  return false;
}

// The number of output elements this rank's call writes (0 where it writes none).
static size_t outElems(int coll, const Shape& s, int rank) {
  if ((coll == REDUCE || coll == GATHER) && rank != gRoot) return 0;
  return s.recvElems;
}

struct Opts {
  int n = 2, dev = 0, gpus = 1, perHost = 1, iters = 200, warmup = 3, gapUs = 0, graph = 0, busy = 0, pin = 0;
  bool oneHost = false, uts = false, calls = false, busyAlu = false;
  size_t minB = 8, maxB = 512 << 20;
  double budget = 0.25, timeoutS = 60;
  std::vector<int> colls;
};

// --calls: where a size's tail comes from. Its five slowest calls (index, and each rank's time:
// is it one rank, the same one each time?) and every call in order (periodic, early, clustered?).
static void printCalls(const Shared* sh, int coll, size_t bytes, int iters, int n) {
  std::vector<int> order(iters);
  for (int i = 0; i < iters; i++) order[i] = i;
  auto slowest = [&](int i) {
    float m = 0;
    for (int r = 0; r < n; r++) m = std::max(m, sh->us[r][i]);
    return m;
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return slowest(a) > slowest(b); });
  printf("# calls %s %zu slowest:", kCollName[coll], bytes);
  for (int k = 0; k < std::min(iters, 5); k++) {
    printf(" #%d", order[k]);
    for (int r = 0; r < n; r++) printf("%c%.1f", r ? '/' : '=', sh->us[r][order[k]]);
  }
  printf("\n# calls %s %zu in order:", kCollName[coll], bytes);
  for (int i = 0; i < iters; i++) printf(" %.1f", slowest(i));
  printf("\n");
}

// --gap-us: the compute before a timed call.
__global__ void spinKernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// --busy: reads and writes buf (n4 16-byte words), or with alu only computes, until *stop (host
// memory) is nonzero. One thread a block reads the flag, once a pass: every thread reading host
// memory would flood PCIe with reads, which compute kernels do not do.
__global__ void busyKernel(float4* buf, size_t n4, const volatile int* stop, bool alu) {
  __shared__ int done;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  float x = threadIdx.x;
  for (;;) {
    if (threadIdx.x == 0) done = *stop;
    __syncthreads();
    if (done) break;
    __syncthreads();  // every thread has read done before thread 0 writes it again
    if (alu) {
      for (int i = 0; i < 1 << 16; i++) x = x * 0.999f + 1.f;
      continue;
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
      float4 v = buf[i];
      buf[i] = make_float4(v.x + 1.f, v.y + 1.f, v.z + 1.f, v.w + 1.f);
    }
  }
  if (x == 0.f) buf[0].x = x;  // keeps the compute
}

// One launch of this size's calls: K captured in a graph under --graph K, else one call.
struct Calls {
  cudaGraphExec_t exec = nullptr;
  void launch(int coll, const Shape& s, const float* send, float* recv, int rank, int n, ncclComm_t comm,
              cudaStream_t st) {
    if (exec)
      CK(cudaGraphLaunch(exec, st));
    else
      run(coll, s, send, recv, rank, n, comm, st);
  }
};

static Calls capture(int coll, const Shape& s, const float* send, float* recv, int rank, int n, ncclComm_t comm,
                     cudaStream_t st, int k) {
  Calls c;
  if (k == 0) return c;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < k; i++) run(coll, s, send, recv, rank, n, comm, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&c.exec, g, 0));
  CK(cudaGraphDestroy(g));
  return c;
}

// --pin: binds the calling process to the rank-th `k` of the CPUs it may use; false (saying why) when
// there are fewer than n x k of them.
static bool pinRank(int rank, int n, int k) {
  cpu_set_t allowed, mine;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    fprintf(stderr, "rank %d: sched_getaffinity: %s\n", rank, strerror(errno));
    return false;
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if ((long)cpus.size() < (long)n * k) {
    fprintf(stderr, "rank %d: --pin %d wants %d CPUs for %d ranks, %zu allowed\n", rank, k, n * k, n, cpus.size());
    return false;
  }
  CPU_ZERO(&mine);
  for (int i = rank * k; i < (rank + 1) * k; i++) CPU_SET(cpus[i], &mine);
  if (sched_setaffinity(0, sizeof mine, &mine) != 0) {
    fprintf(stderr, "rank %d: sched_setaffinity: %s\n", rank, strerror(errno));
    return false;
  }
  if (rank == 0 || rank == n - 1)
    printf("# rank %d pinned to CPUs %d-%d of %zu allowed\n", rank, cpus[rank * k], cpus[(rank + 1) * k - 1],
           cpus.size());
  return true;
}

static int rankMain(int rank, const Opts& o, ncclUniqueId id, const std::vector<size_t>& sizes, Shared* sh) {
  const int n = o.n;
  gRank = rank;
  if (o.pin > 0 && !pinRank(rank, n, o.pin)) return 3;
  signal(SIGALRM, onAlarm);
  alarm((unsigned)o.timeoutS);
  gStage = "init";
  if (!o.oneHost) {
    char host[32];
    snprintf(host, sizeof host, "fnbench%d", rank / o.perHost);
    if (!o.uts) {
      setenv("NCCL_HOSTID", host, 1);
    } else if (unshare(CLONE_NEWUTS) != 0 || sethostname(host, strlen(host)) != 0) {
      fprintf(stderr, "rank %d: cannot take host name %s in a UTS namespace of its own: %s\n", rank, host,
              strerror(errno));
      return 3;
    }
  }
  CK(cudaSetDevice(o.dev + rank % o.gpus));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t maxElems = sizes.back() / sizeof(float);
  float *send, *recv;
  CK(cudaMalloc(&send, maxElems * sizeof(float)));
  CK(cudaMalloc(&recv, maxElems * sizeof(float)));
  std::vector<float> host(maxElems);
  for (size_t j = 0; j < maxElems; j++) host[j] = input(rank, j);
  CK(cudaMemcpy(send, host.data(), maxElems * sizeof(float), cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  cudaStream_t busySt = nullptr;
  float4* busyBuf = nullptr;
  int* busyStop = nullptr;
  const size_t busyWords = (256u << 20) / sizeof(float4);
  if (o.busy > 0) {
    CK(cudaStreamCreateWithFlags(&busySt, cudaStreamNonBlocking));
    CK(cudaMalloc(&busyBuf, busyWords * sizeof(float4)));
    CK(cudaMemset(busyBuf, 0, busyWords * sizeof(float4)));
    CK(cudaHostAlloc(&busyStop, sizeof(int), cudaHostAllocMapped));
  }
  std::vector<float> perCall;
  for (int coll : o.colls) {
    gColl = coll;
    for (size_t size : sizes) {
      const Shape s = shapeOf(coll, size, n);
      if (s.part == 0) continue;  // every rank skips alike: the shape depends on size and n only
      gBytes = s.bytes;
      gIter = -1;
      alarm((unsigned)o.timeoutS);
      barrier(sh, rank, n, false, o.timeoutS);  // rank 0 has read the last size's timings

      gStage = "capture";
      Calls calls = capture(coll, s, send, recv, rank, n, comm, st, o.graph);
      gStage = "checked call";
      sh->wrongNow[rank] = 0;
      CK(cudaMemsetAsync(recv, 0xff, s.recvElems * sizeof(float), st));  // NaN: never a wanted value
      calls.launch(coll, s, send, recv, rank, n, comm, st);
      CK(cudaStreamSynchronize(st));
      const size_t out = outElems(coll, s, rank);
      CK(cudaMemcpy(host.data(), recv, out * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < out; j++) {
        float want;
        if (!expected(coll, s, rank, n, j, &want) || host[j] == want) continue;
        if (sh->wrong[rank] + sh->wrongNow[rank] == 0)
          snprintf(sh->firstWrong[rank], sizeof sh->firstWrong[rank], "%s %zu B rank %d element %zu: %g, want %g",
                   kCollName[coll], s.bytes, rank, j, host[j], want);
        sh->wrongNow[rank]++;
      }
      sh->wrong[rank] += sh->wrongNow[rank];

      if (o.busy > 0) {
        *(volatile int*)busyStop = 0;
        busyKernel<<<o.busy, 512, 0, busySt>>>(busyBuf, busyWords, busyStop, o.busyAlu);
        CK(cudaGetLastError());
      }
      gStage = "warm-up";
      for (int i = 0; i < o.warmup; i++) calls.launch(coll, s, send, recv, rank, n, comm, st);
      CK(cudaStreamSynchronize(st));
      // Every rank starts the timed calls together, as nccl-tests' barrier before its timed loop:
      // a rank done with its warm-up early (a sender whose bytes wait in socket buffers) would
      // otherwise time its first call from there, waiting for the others' warm-ups and for the
      // root's check of the checked call's output.
      barrier(sh, rank, n, false, o.timeoutS);

      int iters = 0;
      const double t0 = now();
      for (bool stop = false; !stop;) {
        gStage = "timed call";
        gIter = iters;
        if (o.gapUs > 0) {
          spinKernel<<<1, 1, 0, st>>>((unsigned long long)o.gapUs * 1000ull);
          CK(cudaGetLastError());
        }
        CK(cudaEventRecord(a, st));
        calls.launch(coll, s, send, recv, rank, n, comm, st);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        sh->us[rank][iters++] = ms * 1e3f / std::max(o.graph, 1);
        const bool last = iters >= o.iters || (iters >= kMinIters && now() - t0 >= o.budget);
        stop = barrier(sh, rank, n, last, o.timeoutS);  // rank 0 decides; every rank has written its time
      }
      if (o.busy > 0) {
        *(volatile int*)busyStop = 1;
        CK(cudaStreamSynchronize(busySt));
      }

      if (rank == 0) {
        perCall.assign(iters, 0.f);
        long wrong = 0;
        for (int r = 0; r < n; r++) {
          wrong += sh->wrongNow[r];
          for (int i = 0; i < iters; i++) perCall[i] = std::max(perCall[i], sh->us[r][i]);
        }
        double mean = 0;
        for (float v : perCall) mean += v;
        mean /= iters;
        std::sort(perCall.begin(), perCall.end());
        const double p50 = iters % 2 ? perCall[iters / 2] : 0.5 * (perCall[iters / 2 - 1] + perCall[iters / 2]);
        const double p99 = perCall[(size_t)((99 * iters + 99) / 100) - 1];
        const double alg = s.bytes / (p50 * 1e3);
        printf("  %-14s %12zu %5d %10.2f %10.2f %10.2f %9.3f %9.3f %6ld\n", kCollName[coll], s.bytes, iters, p50,
               p99, mean, alg, alg * s.busFactor, wrong);
        if (o.calls) printCalls(sh, coll, s.bytes, iters, n);
      }
      if (calls.exec) CK(cudaGraphExecDestroy(calls.exec));
    }
  }
  gColl = -1;
  gStage = "teardown";
  alarm((unsigned)o.timeoutS);
  NK(ncclCommDestroy(comm));
  alarm(0);
  // A profiler writes its records here: the rank ends in _exit, which runs no atexit handler
  // (benches/kernel_trace.c).
  cudaProfilerStop();
  return 0;
}

static const char* kUsage =
    "usage: net_bench [--nranks 2] [--dev 0] [--gpus 1] [--one-host | --uts] [--per-host 1] [--colls all|a,b,c]\n"
    "                 [--min 8] [--max 512M] [--iters 200] [--warmup 3] [--budget-s 0.25] [--timeout-s 60]\n"
    "                 [--calls] [--gap-us 0] [--graph K] [--busy C [--busy-alu]] [--pin K] [--root 0]\n"
    "collectives: all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall gather scatter\n";

static bool parseColls(const std::string& list, std::vector<int>* out) {
  out->clear();
  if (list == "all") {
    for (int c = 0; c < NCOLLS; c++) out->push_back(c);
    return true;
  }
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    int c = 0;
    while (c < NCOLLS && name != kCollName[c]) c++;
    if (c == NCOLLS) {
      fprintf(stderr, "net_bench: unknown collective '%s'\n", name.c_str());
      return false;
    }
    out->push_back(c);
    at = end + 1;
  }
  return !out->empty();
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Opts o;
  std::string colls = "all";
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto need = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "missing value for %s\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--nranks") o.n = atoi(need());
    else if (a == "--dev") o.dev = atoi(need());
    else if (a == "--gpus") o.gpus = atoi(need());
    else if (a == "--one-host") o.oneHost = true;
    else if (a == "--uts") o.uts = true;
    else if (a == "--per-host") o.perHost = atoi(need());
    else if (a == "--colls") colls = need();
    else if (a == "--min") o.minB = parseSize(need());
    else if (a == "--max") o.maxB = parseSize(need());
    else if (a == "--iters") o.iters = atoi(need());
    else if (a == "--warmup") o.warmup = atoi(need());
    else if (a == "--budget-s") o.budget = atof(need());
    else if (a == "--timeout-s") o.timeoutS = atof(need());
    else if (a == "--calls") o.calls = true;
    else if (a == "--gap-us") o.gapUs = atoi(need());
    else if (a == "--graph") o.graph = atoi(need());
    else if (a == "--busy") o.busy = atoi(need());
    else if (a == "--busy-alu") o.busyAlu = true;
    else if (a == "--pin") o.pin = atoi(need());
    else if (a == "--root") gRoot = atoi(need());
    else {
      fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  if (o.n < 2 || o.n > kMaxRanks || o.gpus < 1 || o.minB < 8 || o.maxB < o.minB || (o.uts && o.oneHost) ||
      o.perHost < 1 || o.n % o.perHost != 0 || (o.oneHost && o.perHost > 1) ||
      o.iters < kMinIters || o.iters > kMaxIters || o.warmup < 0 || !(o.budget >= 0) || !(o.timeoutS >= 1) ||
      o.gapUs < 0 || o.gapUs > 1000000 || o.graph < 0 || o.graph > 1000 || (o.graph > 0 && o.gapUs > 0) ||
      o.busy < 0 || o.busy > 1024 || o.pin < 0 || gRoot < 0 || gRoot >= o.n ||
      !parseColls(colls, &o.colls)) {
    fprintf(stderr, "net_bench: bad arguments (--nranks 2..%d, --iters %d..%d, --min >= 8, --per-host divides --nranks, --gap-us 0..1000000, --graph 0..1000 and not with --gap-us, --busy 0..1024, --pin >= 0, --root 0..nranks-1)\n%s", kMaxRanks,
            kMinIters, kMaxIters, kUsage);
    return 2;
  }
  std::vector<size_t> sizes;
  for (size_t s = o.minB; s <= o.maxB; s *= 2) sizes.push_back(s);
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id));
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    perror("mmap");
    return 3;
  }
  Shared* sh = new (m) Shared();
  int version = 0;
  ncclGetVersion(&version);
  printf("# net_bench: %d processes on GPU %d-%d, %s, %d a host; NCCL version %d\n", o.n, o.dev, o.dev + o.gpus - 1,
         o.oneHost ? "one host" : o.uts ? "hosts by host name (UTS namespaces)" : "hosts by NCCL_HOSTID",
         o.oneHost ? o.n : o.perHost, version);
  printf("# float, sum, root %d, out of place; per size 1 checked call, %d warm-up, then up to %d timed calls "
         "(at least %d, %.3g s), each alone after %d us of compute on its stream; a call's time is the slowest rank's "
         "(CUDA events)\n",
         gRoot, o.warmup, o.iters, kMinIters, o.budget, o.gapUs);
  if (o.busy > 0)
    printf("# --busy %d: %d blocks %s on another stream during the warm-up and timed calls\n", o.busy, o.busy,
           o.busyAlu ? "compute in registers" : "read and write 256 MiB");
  if (o.graph > 0)
    printf("# --graph %d: each timed call is one launch of a graph of %d calls, its time divided by %d\n", o.graph,
           o.graph, o.graph);
  printf("# %-14s %12s %5s %10s %10s %10s %9s %9s %6s\n", "coll", "bytes", "iters", "p50_us", "p99_us", "mean_us",
         "algbw_GBs", "busbw_GBs", "wrong");
  fflush(stdout);
  std::vector<pid_t> pids(o.n);
  for (int r = 0; r < o.n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 3;
    }
    if (pids[r] == 0) _exit(rankMain(r, o, id, sizes, sh));
  }
  // Reap the ranks. Once one has failed, the rest would only wait for it: after a grace period
  // each still running gets SIGALRM, so its watchdog says where it was and ends it.
  int failed = 0, code = 0, left = o.n;
  double alarmAt = 0;
  std::vector<bool> done(o.n, false);
  std::string why;
  while (left > 0) {
    for (int r = 0; r < o.n; r++) {
      int stc = 0;
      if (done[r] || waitpid(pids[r], &stc, WNOHANG) != pids[r]) continue;
      done[r] = true;
      left--;
      if (!WIFEXITED(stc) || WEXITSTATUS(stc) != 0) {
        char msg[96];
        if (WIFEXITED(stc)) snprintf(msg, sizeof msg, "rank %d exited %d", r, WEXITSTATUS(stc));
        else snprintf(msg, sizeof msg, "rank %d killed by signal %d", r, WTERMSIG(stc));
        printf("# %s\n", msg);
        if (failed++ == 0) {
          why = msg;
          code = WIFEXITED(stc) ? WEXITSTATUS(stc) : 3;
          alarmAt = now() + 5;
        }
      }
    }
    if (alarmAt > 0 && now() > alarmAt) {
      for (int r = 0; r < o.n; r++)
        if (!done[r]) kill(pids[r], SIGALRM);
      alarmAt = 0;
    }
    if (left > 0) usleep(20000);
  }
  long wrong = 0;
  for (int r = 0; r < o.n; r++) {
    if (sh->wrong[r] > 0) printf("# rank %d: %ld wrong element(s), first: %s\n", r, sh->wrong[r], sh->firstWrong[r]);
    if (sh->wrong[r] > 0 && wrong == 0 && why.empty()) why = std::string("wrong result: ") + sh->firstWrong[r];
    wrong += sh->wrong[r];
  }
  if (failed == 0 && wrong == 0) {
    printf("NET_BENCH: PASS\n");
    return 0;
  }
  printf("NET_BENCH: FAIL %s\n", why.c_str());
  return failed ? code : 1;
}
