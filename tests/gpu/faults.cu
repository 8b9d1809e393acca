// faults.cu: a rank killed in the middle of a collective.
//
// Host C++ built by nvcc on the GPU machine against the public NCCL API only. One process per rank
// (fork after ncclGetUniqueId, before any CUDA call), all on the GPUs of --devs. Every rank checks a
// first all-reduce element by element; then every rank but the victim (the last) starts a large
// all-reduce that can never finish, and the parent SIGKILLs the victim. Each survivor must:
//   1. see ncclCommGetAsyncError return ncclRemoteError within --bound-s of the kill, with an
//      ncclGetLastError text that names the lost rank;
//   2. shrink the communicator without the victim (ncclCommShrink, NCCL_SHRINK_ABORT) and all-reduce
//      on the new one, checked element by element;
//   3. ncclCommAbort the old communicator within 1 s, and destroy the new one.
// With --revoke nobody is killed: the last rank never joins the all-reduce, and every rank calls
// ncclCommRevoke instead (it must return within 1 s and stop the stuck all-reduce; the revoked comm
// must refuse new work with ncclInvalidUsage and report no async error); then the others shrink
// without the last rank and all-reduce, as above, and the last rank destroys its communicator.
// With NCCL_P2P_DISABLE=1 in the environment ranks of one host connect over shared memory (SHM).
// Prints "r<R> FAULT: PASS|FAIL ..." per survivor and "FAULTS: PASS|FAIL" last. Exit 0 on PASS.
//
// With --hosts H the ranks are split into H contiguous "hosts" (NCCL_HOSTID per child), so peers
// on another host are reached over the NET transport.
//
// usage: faults [--devs 0,0,0,0] [--bound-s 2] [--revoke] [--hosts H]
#include "common.cuh"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

static double nowS() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the machine
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Shared between the parent and the ranks (MAP_SHARED before fork).
struct Shared {
  std::atomic<int> ready;      // ranks that passed the first all-reduce and started the second
  std::atomic<double> killAt;  // when the parent killed the victim, or told every rank to revoke (0 before)
};

static bool gRevoke = false;

static __global__ void fill(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

// All-reduce of rank+1 (as new ranks of `comm`) into a poisoned output; returns the wrong count.
static long checkedAllReduce(ncclComm_t comm, int rank, int nranks, size_t n, cudaStream_t s) {
  float *in, *out;
  CUDACHECK(cudaMalloc(&in, n * 4));
  CUDACHECK(cudaMalloc(&out, n * 4));
  fill<<<64, 256, 0, s>>>(in, n, float(rank + 1));
  CUDACHECK(cudaMemsetAsync(out, 0xA5, n * 4, s));
  NCCLCHECK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  std::vector<float> h(n);
  CUDACHECK(cudaMemcpy(h.data(), out, n * 4, cudaMemcpyDeviceToHost));
  const float want = float(nranks * (nranks + 1) / 2);
  long wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += h[i] != want;
  CUDACHECK(cudaFree(in));
  CUDACHECK(cudaFree(out));
  return wrong;
}

static int shrinkAndFinish(ncclComm_t comm, int rank, int nranks, cudaStream_t s, bool ok, double after);

static int rankMain(int rank, int nranks, int dev, ncclUniqueId id, Shared* sh, double bound) {
  const int victim = nranks - 1;
  CUDACHECK(cudaSetDevice(dev));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  long wrong = checkedAllReduce(comm, rank, nranks, 1 << 20, s);
  if (wrong) printf("r%d first all-reduce: %ld wrong elements\n", rank, wrong);

  // The collective that cannot finish: the victim is killed before (or while) it joins.
  const size_t big = 64 << 20;
  float *in, *out;
  CUDACHECK(cudaMalloc(&in, big * 4));
  CUDACHECK(cudaMalloc(&out, big * 4));
  if (rank != victim) NCCLCHECK(ncclAllReduce(in, out, big, ncclFloat32, ncclSum, comm, s));
  sh->ready.fetch_add(1);
  if (rank == victim && !gRevoke) {
    for (;;) pause();  // until killed
  }
  if (gRevoke) {
    while (sh->killAt.load() == 0) usleep(1000);
    const double t0 = nowS();
    ncclResult_t rr = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    const double tRevoke = nowS() - t0;
    ncclResult_t again = ncclAllReduce(in, out, 16, ncclFloat32, ncclSum, comm, s);
    ncclResult_t st = ncclInternalError;
    NCCLCHECK(ncclCommGetAsyncError(comm, &st));
    bool ok = rr == ncclSuccess && tRevoke <= 1.0 && again == ncclInvalidUsage && st == ncclSuccess;
    printf("r%d ncclCommRevoke: %s in %.3f s; then ncclAllReduce: %s; async error: %s\n", rank, ncclGetErrorString(rr),
           tRevoke, ncclGetErrorString(again), ncclGetErrorString(st));
    if (rank == victim) {
      NCCLCHECK(ncclCommDestroy(comm));
      printf("r%d FAULT: %s (revoked, destroyed)\n", rank, ok ? "PASS" : "FAIL");
      return ok ? 0 : 1;
    }
    if (!ok) printf("r%d revoke: FAIL\n", rank);
    return shrinkAndFinish(comm, rank, nranks, s, ok && wrong == 0, 0);
  }

  // 1. The loss is reported, by name, soon after the kill.
  ncclResult_t st = ncclSuccess;
  double seenAt = 0;
  while (nowS() - (sh->killAt.load() ? sh->killAt.load() : nowS()) < bound + 5) {
    NCCLCHECK(ncclCommGetAsyncError(comm, &st));
    if (st != ncclSuccess && st != ncclInProgress && sh->killAt.load() != 0) {
      seenAt = nowS();
      break;
    }
    usleep(2000);
  }
  std::string text = ncclGetLastError(comm) ? ncclGetLastError(comm) : "";
  const double after = seenAt ? seenAt - sh->killAt.load() : -1;
  const std::string victimName = "rank " + std::to_string(victim);
  bool ok = wrong == 0 && st == ncclRemoteError && after >= 0 && after <= bound && text.find(victimName) != std::string::npos;
  printf("r%d async error %s %.3f s after the kill; last error: %s\n", rank, ncclGetErrorString(st), after,
         text.c_str());
  return shrinkAndFinish(comm, rank, nranks, s, ok, after);
}

// Steps 2 and 3 for a survivor: shrink without the last rank, all-reduce, abort the old comm.
static int shrinkAndFinish(ncclComm_t comm, int rank, int nranks, cudaStream_t s, bool ok, double after) {
  const int victim = nranks - 1;
  // 2. The survivors go on without the victim.
  ncclComm_t small = nullptr;
  int excluded[1] = {victim};
  ncclResult_t sr = ncclCommShrink(comm, excluded, 1, &small, nullptr, NCCL_SHRINK_ABORT);
  long wrong2 = -1;
  if (sr == ncclSuccess) {
    int nr = 0, me = 0;
    NCCLCHECK(ncclCommCount(small, &nr));
    NCCLCHECK(ncclCommUserRank(small, &me));
    wrong2 = checkedAllReduce(small, me, nr, 1 << 20, s);
  }
  printf("r%d shrink: %s, all-reduce among %d survivors: %ld wrong\n", rank, ncclGetErrorString(sr), nranks - 1, wrong2);
  ok &= sr == ncclSuccess && wrong2 == 0;

  // 3. Abort returns promptly.
  double t0 = nowS();
  ncclResult_t ar = ncclCommAbort(comm);
  double tAbort = nowS() - t0;
  printf("r%d ncclCommAbort: %s in %.3f s\n", rank, ncclGetErrorString(ar), tAbort);
  ok &= ar == ncclSuccess && tAbort <= 1.0;
  if (small) NCCLCHECK(ncclCommDestroy(small));
  if (gRevoke) printf("r%d FAULT: %s (revoked, shrunk)\n", rank, ok ? "PASS" : "FAIL");
  else printf("r%d FAULT: %s (detected %.3f s after the kill)\n", rank, ok ? "PASS" : "FAIL", after);
  fflush(stdout);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<int> devs = {0, 0};
  double bound = 2.0;
  int hosts = 0;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--devs" && i + 1 < argc) {
      devs.clear();
      for (char* t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) devs.push_back(atoi(t));
    } else if (a == "--bound-s" && i + 1 < argc) {
      bound = atof(argv[++i]);
    } else if (a == "--hosts" && i + 1 < argc) {
      hosts = atoi(argv[++i]);
    } else if (a == "--revoke") {
      gRevoke = true;
    } else {
      fprintf(stderr, "usage: faults [--devs 0,0,0,0] [--bound-s 2] [--revoke] [--hosts H]\n");
      return 2;
    }
  }
  const int n = (int)devs.size();
  if (n < 2) { fprintf(stderr, "faults needs at least 2 ranks\n"); return 2; }
  if (hosts < 0 || hosts > n) { fprintf(stderr, "--hosts %d: 1 to %d\n", hosts, n); return 2; }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  void* m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 3; }
  Shared* sh = new (m) Shared();
  printf("# faults: %d ranks on devices", n);
  for (int d : devs) printf(" %d", d);
  if (hosts > 0) printf(" in %d hosts (NCCL_HOSTID)", hosts);
  if (gRevoke) printf("; rank %d never joins an all-reduce, every rank revokes\n", n - 1);
  else printf("; rank %d is killed during an all-reduce; bound %.1f s\n", n - 1, bound);
  fflush(stdout);
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      if (hosts > 0) {  // read by the library at the child's first init, not cached by the parent
        char h[32];
        snprintf(h, sizeof h, "fnhost%d", r * hosts / n);
        setenv("NCCL_HOSTID", h, 1);
      }
      _exit(rankMain(r, n, devs[r], id, sh, bound));
    }
  }
  const double t0 = nowS();
  while (sh->ready.load() < n && nowS() - t0 < 60) usleep(1000);
  if (sh->ready.load() < n) {
    printf("FAULTS: FAIL (only %d of %d ranks got to the second all-reduce)\n", sh->ready.load(), n);
    for (pid_t p : pids) kill(p, SIGKILL);
    return 1;
  }
  usleep(200000);  // let the survivors' kernels start waiting on the victim
  sh->killAt = nowS();
  if (!gRevoke) kill(pids[n - 1], SIGKILL);
  int worst = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    // Survivors get 30 s to finish; then they count as hung.
    double dl = nowS() + 30;
    pid_t got = 0;
    while ((got = waitpid(pids[r], &st, WNOHANG)) == 0 && nowS() < dl) usleep(10000);
    if (got == 0) {
      printf("# rank %d hung; killing it\n", r);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &st, 0);
      worst = 4;
      continue;
    }
    if (r == n - 1 && !gRevoke) continue;  // the victim
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code && !worst) worst = code;
  }
  printf("FAULTS: %s (%d ranks, %s rank %d)\n", worst == 0 ? "PASS" : "FAIL", n, gRevoke ? "revoke, left out" : "killed", n - 1);
  return worst == 0 ? 0 : 1;
}
