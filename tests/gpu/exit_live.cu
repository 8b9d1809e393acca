// exit_live.cu: jobs that end with their communicators alive, as nccl-tests `-p 1` and many training
// scripts do (no ncclCommDestroy; the process returns from main or calls exit).
//
// Host C++ built by nvcc on the GPU machine against the public NCCL API only. Each iteration forks
// --procs rank processes (after ncclGetUniqueId, before any CUDA call), all on GPU 0; each rank
// all-reduces rank+1 into a poisoned output, checks every element, waits a random 0-5 ms, and ends
// in the iteration's way (they take turns):
//   return   returns from main;
//   exit     calls exit(0);
//   memfree  frees its ncclMemAlloc buffers with the communicator alive, then returns;
//   barrier  waits for every rank at a barrier in shared memory (as MPI_Barrier; MPI_Finalize),
//            then returns.
// With --procs 1 --ranks N the one process drives N ranks on GPU 0 (ncclCommInitAll, devices
// repeated). With --hosts H the ranks split into H "hosts" (NCCL_HOSTID per child) and talk over
// NET; with NCCL_P2P_DISABLE=1 in the environment ranks of one host use SHM.
// Every process must exit 0 with no signal, within --bound-s; the gpu_check step also requires
// no WARN and no panic in the output. Prints "EXIT_LIVE: PASS|FAIL ..." last.
//
// With --leaver the last rank returns right after the checked all-reduce, and the others, 300 ms
// later, start another all-reduce: each must fail at once with ncclRemoteError and a text that
// names the rank that left (a peer that ended is no error until an operation needs it).
//
// usage: exit_live [--procs P] [--ranks N] [--hosts H] [--iters K] [--bound-s S] [--seed X] [--leaver]
#include "common.cuh"

#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

enum Ending { kReturn, kExit, kMemFree, kBarrier, kEndings };
static const char* kEndingName[kEndings] = {"return", "exit", "memfree", "barrier"};

static double nowS() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct Shared {
  ncclUniqueId id;
  std::atomic<int> atBarrier;
};

static __global__ void fill(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static const size_t kCount = 1 << 16;
static bool gLeaver = false;

// The ranks' buffers: from ncclMemAlloc when the ending frees them, else cudaMalloc.
struct Bufs {
  float *in, *out;
};

static Bufs alloc(Ending e) {
  Bufs b;
  if (e == kMemFree) {
    NCCLCHECK(ncclMemAlloc((void**)&b.in, kCount * 4));
    NCCLCHECK(ncclMemAlloc((void**)&b.out, kCount * 4));
  } else {
    CUDACHECK(cudaMalloc(&b.in, kCount * 4));
    CUDACHECK(cudaMalloc(&b.out, kCount * 4));
  }
  return b;
}

// Elements of `out` that are not the sum 1+2+...+nranks.
static long wrong(const Bufs& b, int nranks, cudaStream_t s) {
  std::vector<float> h(kCount);
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h.data(), b.out, kCount * 4, cudaMemcpyDeviceToHost));
  const float want = nranks * (nranks + 1) / 2.0f;
  long bad = 0;
  for (float v : h) bad += v != want;
  return bad;
}

// One rank process: init, a checked all-reduce, then the ending. Returns main's exit code.
static int rankMain(Shared* sh, int rank, int nranks, Ending e, unsigned seed) {
  CUDACHECK(cudaSetDevice(0));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, sh->id, rank));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreate(&s));
  Bufs b = alloc(e);
  fill<<<64, 256, 0, s>>>(b.in, kCount, float(rank + 1));
  CUDACHECK(cudaMemsetAsync(b.out, 0xA5, kCount * 4, s));
  NCCLCHECK(ncclAllReduce(b.in, b.out, kCount, ncclFloat32, ncclSum, comm, s));
  long bad = wrong(b, nranks, s);
  if (bad) {
    printf("r%d FAIL: %ld wrong elements\n", rank, bad);
    return 1;
  }
  if (gLeaver) {
    if (rank == nranks - 1) return 0;
    usleep(300000);
    ncclResult_t r = ncclAllReduce(b.in, b.out, kCount, ncclFloat32, ncclSum, comm, s);
    const char* text = ncclGetLastError(comm);
    char want[32];
    snprintf(want, sizeof want, "rank %d ", nranks - 1);
    bool ok = r == ncclRemoteError && strstr(text, want) && strstr(text, "left this communicator");
    if (!ok) printf("r%d FAIL: all-reduce after rank %d left returned %d, \"%s\"\n", rank, nranks - 1, (int)r, text);
    // No survivor leaves before every survivor has tried: each must see only the leaver gone.
    sh->atBarrier.fetch_add(1);
    double dl = nowS() + 20;
    while (sh->atBarrier.load() < nranks - 1 && nowS() < dl) usleep(100);
    return ok ? 0 : 1;
  }
  usleep(rand_r(&seed) % 5000);
  switch (e) {
    case kExit:
      fflush(stdout);
      exit(0);
    case kMemFree:
      NCCLCHECK(ncclMemFree(b.in));
      NCCLCHECK(ncclMemFree(b.out));
      return 0;
    case kBarrier: {
      sh->atBarrier.fetch_add(1);
      double dl = nowS() + 20;
      while (sh->atBarrier.load() < nranks && nowS() < dl) usleep(100);
      return 0;
    }
    default:
      return 0;
  }
}

// One process driving every rank (ncclCommInitAll on GPU 0 repeated).
static int allMain(int nranks, Ending e, unsigned seed) {
  CUDACHECK(cudaSetDevice(0));
  std::vector<ncclComm_t> comms(nranks);
  std::vector<int> devs(nranks, 0);
  ncclResult_t r = ncclCommInitAll(comms.data(), nranks, devs.data());
  if (r != ncclSuccess) {
    printf("FAIL: ncclCommInitAll(%d ranks on GPU 0) = %d (%s), last error \"%s\"\n", nranks, (int)r,
           ncclGetErrorString(r), ncclGetLastError(nullptr));
    return 1;
  }
  std::vector<cudaStream_t> s(nranks);
  std::vector<Bufs> b(nranks);
  for (int i = 0; i < nranks; i++) {
    CUDACHECK(cudaStreamCreate(&s[i]));
    b[i] = alloc(e);
    fill<<<64, 256, 0, s[i]>>>(b[i].in, kCount, float(i + 1));
    CUDACHECK(cudaMemsetAsync(b[i].out, 0xA5, kCount * 4, s[i]));
  }
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < nranks; i++)
    NCCLCHECK(ncclAllReduce(b[i].in, b[i].out, kCount, ncclFloat32, ncclSum, comms[i], s[i]));
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < nranks; i++) {
    long bad = wrong(b[i], nranks, s[i]);
    if (bad) {
      printf("r%d FAIL: %ld wrong elements\n", i, bad);
      return 1;
    }
  }
  usleep(rand_r(&seed) % 5000);
  if (e == kExit) {
    fflush(stdout);
    exit(0);
  }
  if (e == kMemFree)
    for (auto& x : b) {
      NCCLCHECK(ncclMemFree(x.in));
      NCCLCHECK(ncclMemFree(x.out));
    }
  return 0;
}

int main(int argc, char** argv) {
  int procs = 2, ranks = 0, hosts = 0, iters = 50;
  double bound = 30;
  unsigned seed = (unsigned)time(nullptr);
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? argv[++i] : (fprintf(stderr, "%s needs a value\n", a.c_str()), exit(2), ""); };
    if (a == "--procs") procs = atoi(next());
    else if (a == "--ranks") ranks = atoi(next());
    else if (a == "--hosts") hosts = atoi(next());
    else if (a == "--iters") iters = atoi(next());
    else if (a == "--bound-s") bound = atof(next());
    else if (a == "--seed") seed = (unsigned)strtoul(next(), nullptr, 0);
    else if (a == "--leaver") gLeaver = true;
    else { fprintf(stderr, "usage: exit_live [--procs P] [--ranks N] [--hosts H] [--iters K] [--bound-s S] [--seed X] [--leaver]\n"); return 2; }
  }
  if (ranks == 0) ranks = procs;
  if (procs < 1 || (procs > 1 && ranks != procs) || (hosts > 0 && ranks % hosts) || (gLeaver && procs < 2)) {
    fprintf(stderr, "exit_live: --procs must be 1 (one process, --ranks ranks) or equal --ranks; --hosts must divide the ranks\n");
    return 2;
  }
  // Several ranks of one process on one GPU: their kernels wait for each other, which CUDA's lazy
  // module loading can deadlock, so the library warns unless loading is eager. This job runs as a
  // user told so would (docs/ARCHITECTURE.md, "Testing on GPUs"); a value set outside stays.
  if (procs == 1 && ranks > 1) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  printf("exit_live: %d iterations, %d process(es), %d ranks on GPU 0%s, seed %u\n", iters, procs, ranks,
         hosts ? " in hosts (NCCL_HOSTID)" : "", seed);
  fflush(stdout);
  auto* sh = (Shared*)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) { perror("mmap"); return 3; }
  int failed = 0;
  double worst = 0;
  for (int it = 0; it < iters; it++) {
    Ending e = Ending(it % kEndings);
    if (procs > 1) NCCLCHECK(ncclGetUniqueId(&sh->id));
    sh->atBarrier = 0;
    std::vector<pid_t> pids(procs);
    double t0 = nowS();
    for (int r = 0; r < procs; r++) {
      pids[r] = fork();
      if (pids[r] < 0) { perror("fork"); return 3; }
      if (pids[r] == 0) {
        if (hosts > 0) {
          char h[32];
          snprintf(h, sizeof h, "exit-live-host-%d", r / (ranks / hosts));
          setenv("NCCL_HOSTID", h, 1);
        }
        unsigned s = seed * 7919u + it * 131u + r;
        return procs > 1 ? rankMain(sh, r, ranks, e, s) : allMain(ranks, e, s);
      }
    }
    for (int r = 0; r < procs; r++) {
      int st = 0;
      pid_t got;
      double dl = t0 + bound;
      while ((got = waitpid(pids[r], &st, WNOHANG)) == 0 && nowS() < dl) usleep(2000);
      if (got == 0) {
        printf("iteration %d (%s): rank process %d still running after %.0f s: killed\n", it, kEndingName[e], r, bound);
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        failed++;
      } else if (WIFSIGNALED(st)) {
        printf("iteration %d (%s): rank process %d died of signal %d\n", it, kEndingName[e], r, WTERMSIG(st));
        failed++;
      } else if (WEXITSTATUS(st) != 0) {
        printf("iteration %d (%s): rank process %d exited %d\n", it, kEndingName[e], r, WEXITSTATUS(st));
        failed++;
      }
    }
    double dt = nowS() - t0;
    if (dt > worst) worst = dt;
    fflush(stdout);
  }
  printf("EXIT_LIVE: %s %d iterations x %d process(es), %d failure(s), slowest iteration %.2f s\n",
         failed ? "FAIL" : "PASS", iters, procs, failed, worst);
  return failed ? 1 : 0;
}
