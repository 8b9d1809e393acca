// net_bench.cu: all-reduce between processes that each claim a host of their own (NCCL_HOSTID),
// so the library under test moves every byte through its NET transport (for ferronickel: the
// proxy thread and the Socket net; for NVIDIA's NCCL: NET/Socket), all on one GPU. With
// --one-host the processes keep the machine's host identity, so the library picks P2P or, under
// NCCL_P2P_DISABLE=1, SHM; --gpus G puts rank r on GPU dev + r % G (NCCL needs a GPU per rank).
// With --uts a host is told apart as production does, by host name: each rank process takes a UTS
// namespace of its own with its own host name, and no NCCL_HOSTID (needs CAP_SYS_ADMIN).
//
// Public NCCL API only: the same binary runs against either library (LD_LIBRARY_PATH). One process
// per rank, forked after ncclGetUniqueId and before any CUDA call. Per size: warm-up, then `iters`
// all-reduces timed with CUDA events on each rank's stream; the slowest rank's time per call is
// reported with nccl-tests' bus bandwidth (2(n-1)/n x size / time). After timing, one more call
// with inputs rank+1 is checked at its first, middle and last element (exact sums of small
// integers in float).
//
// usage: net_bench [--nranks 2] [--dev 0] [--gpus 1] [--one-host | --uts] [--min 8] [--max 512M] [--budget-s 0.25]
// Output: "# net_bench ..." header, then rows "bytes time_us algbw_GBs busbw_GBs" and
// "NET_BENCH: PASS|FAIL".
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

#include <new>
#include <string>
#include <vector>

#include "size_arg.h"

#define CK(cmd)                                                                          \
  do {                                                                                   \
    cudaError_t e_ = (cmd);                                                              \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #cmd, cudaGetErrorString(e_)); \
      _exit(3);                                                                          \
    }                                                                                    \
  } while (0)
#define NK(cmd)                                                                          \
  do {                                                                                   \
    ncclResult_t r_ = (cmd);                                                             \
    if (r_ != ncclSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #cmd, ncclGetErrorString(r_), \
              ncclGetLastError(nullptr));                                                \
      _exit(4);                                                                          \
    }                                                                                    \
  } while (0)

static const int kMaxSizes = 64;
struct Shared {
  double us[8][kMaxSizes];  // per rank, per size: time per call
  int wrong[8];
};

static int rankMain(int rank, int n, int dev, bool oneHost, bool uts, ncclUniqueId id,
                    const std::vector<size_t>& sizes, double budget, Shared* sh) {
  if (!oneHost) {
    char host[32];
    snprintf(host, sizeof host, "fnbench%d", rank);
    if (!uts) {
      setenv("NCCL_HOSTID", host, 1);
    } else if (unshare(CLONE_NEWUTS) != 0 || sethostname(host, strlen(host)) != 0) {
      fprintf(stderr, "rank %d: cannot take host name %s in a UTS namespace of its own: %s\n", rank, host,
              strerror(errno));
      return 3;
    }
  }
  CK(cudaSetDevice(dev));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t maxBytes = sizes.back();
  float *send, *recv;
  CK(cudaMalloc(&send, maxBytes));
  CK(cudaMalloc(&recv, maxBytes));
  CK(cudaMemset(send, 0, maxBytes));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (size_t k = 0; k < sizes.size(); k++) {
    const size_t count = sizes[k] / sizeof(float);
    // Warm-up, then a number of calls every rank derives alike from the size (about the budget
    // at 4 GB/s), so no rank waits for a call another never makes.
    for (int i = 0; i < 3; i++) NK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, st));
    CK(cudaStreamSynchronize(st));
    int iters = (int)(budget * 4e9 / (double)(sizes[k] + (1 << 20)));
    iters = iters < 5 ? 5 : iters > 400 ? 400 : iters;
    float ms;
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < iters; i++) NK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    sh->us[rank][k] = ms * 1e3 / iters;
  }
  // Check: inputs rank+1, so every output element is n(n+1)/2.
  const size_t count = maxBytes / sizeof(float);
  {
    std::vector<float> in(count, float(rank + 1));
    CK(cudaMemcpy(send, in.data(), maxBytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(recv, 0xff, maxBytes));
    NK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, st));
    CK(cudaStreamSynchronize(st));
    const float want = float(n * (n + 1) / 2);
    for (size_t at : {size_t(0), count / 2, count - 1}) {
      float v;
      CK(cudaMemcpy(&v, recv + at, sizeof v, cudaMemcpyDeviceToHost));
      if (v != want) sh->wrong[rank]++;
    }
  }
  NK(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int n = 2, dev = 0, gpus = 1;
  bool oneHost = false, uts = false;
  size_t minB = 8, maxB = 512 << 20;
  double budget = 0.25;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto need = [&]() -> const char* {
      if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); }
      return argv[++i];
    };
    if (a == "--nranks") n = atoi(need());
    else if (a == "--dev") dev = atoi(need());
    else if (a == "--gpus") gpus = atoi(need());
    else if (a == "--one-host") oneHost = true;
    else if (a == "--uts") uts = true;
    else if (a == "--min") minB = parseSize(need());
    else if (a == "--max") maxB = parseSize(need());
    else if (a == "--budget-s") budget = atof(need());
    else {
      fprintf(stderr,
              "usage: net_bench [--nranks 2] [--dev 0] [--gpus 1] [--one-host | --uts] [--min 8] [--max 512M] "
              "[--budget-s 0.25]\n");
      return 2;
    }
  }
  if (n < 2 || n > 8 || gpus < 1 || minB < 8 || maxB < minB || (uts && oneHost)) { fprintf(stderr, "net_bench: bad arguments\n"); return 2; }
  std::vector<size_t> sizes;
  for (size_t s = minB; s <= maxB && sizes.size() < kMaxSizes; s *= 2) sizes.push_back(s);
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id));
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 3; }
  Shared* sh = new (m) Shared();
  int version = 0;
  ncclGetVersion(&version);
  printf("# net_bench: all_reduce float sum, %d processes on GPU %d-%d, %s; NCCL version %d\n", n, dev,
         dev + gpus - 1, oneHost ? "one host" : uts ? "each its own host name (UTS namespace)" : "each its own NCCL_HOSTID",
         version);
  printf("# %12s %12s %10s %10s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs");
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rankMain(r, n, dev + r % gpus, oneHost, uts, id, sizes, budget, sh));
  }
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int stc = 0;
    waitpid(pids[r], &stc, 0);
    if (!WIFEXITED(stc) || WEXITSTATUS(stc) != 0) {
      printf("# rank %d failed (status %d)\n", r, stc);
      bad++;
    }
    bad += sh->wrong[r];
  }
  if (bad == 0) {
    for (size_t k = 0; k < sizes.size(); k++) {
      double us = 0;
      for (int r = 0; r < n; r++) us = sh->us[r][k] > us ? sh->us[r][k] : us;
      const double alg = sizes[k] / (us * 1e3);
      printf("  %12zu %12.2f %10.3f %10.3f\n", sizes[k], us, alg, alg * 2.0 * (n - 1) / n);
    }
  }
  printf("NET_BENCH: %s\n", bad == 0 ? "PASS" : "FAIL");
  return bad == 0 ? 0 : 1;
}
