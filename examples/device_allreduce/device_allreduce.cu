// An all-reduce written with NCCL's device API: each rank's input lives in a symmetric window,
// and one kernel per rank reads every LSA peer's input straight from its memory
// (ncclGetLsaPointer), sums, and writes its own output. An LSA barrier before the reads makes
// sure every peer's input is in place; one after makes sure no peer still reads this rank's input
// when the host overwrites it for the next iteration.
//
// The host side is MPI-free: --procs N forks N rank processes (after ncclGetUniqueId, before any
// CUDA call, so each child inherits the id), --threads N runs N ranks as threads of this process.
// Every rank checks every element of every iteration against the sum computed on the host (the
// inputs are small integers, so float sums are exact) and the output is poisoned first.
//
// Built against ferronickel's include/ or NVIDIA's 2.28.9 headers alike (scripts/build_device_example.sh):
//   nvcc -std=c++17 -arch=sm_90 -I<include> device_allreduce.cu -L<lib> -lnccl -o device_allreduce
// usage: device_allreduce [--procs N | --threads N] [--dev D | --spread] [--count C] [--iters I] [--blocks B]
//   --dev D: every rank on GPU D (default 0); --spread: rank r on GPU r % (number of GPUs)
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#define CUDACHECK(cmd)                                                                               \
  do {                                                                                               \
    cudaError_t e_ = (cmd);                                                                          \
    if (e_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "rank %d: %s:%d CUDA error %s in %s\n", rank, __FILE__, __LINE__,              \
              cudaGetErrorString(e_), #cmd);                                                         \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)
#define NCCLCHECK(cmd)                                                                               \
  do {                                                                                               \
    ncclResult_t r_ = (cmd);                                                                         \
    if (r_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "rank %d: %s:%d NCCL error %s in %s: %s\n", rank, __FILE__, __LINE__,          \
              ncclGetErrorString(r_), #cmd, ncclGetLastError(NULL));                                 \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

// out[i] = sum over the LSA team of input[i], where input is byte `offset` of window `win`.
__global__ void lsaAllReduce(ncclWindow_t win, size_t offset, float* out, size_t count, ncclDevComm comm) {
  // Barrier blockIdx.x of the communicator's LSA barrier: block b of every rank meets block b.
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    float sum = 0;
    for (int peer = 0; peer < comm.lsaSize; peer++) sum += ((float const*)ncclGetLsaPointer(win, offset, peer))[i];
    out[i] = sum;
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

// Rank r's input element i in iteration it: a small integer, so sums of up to 64 ranks are exact.
static float inputOf(int r, size_t i, int it) { return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)it * 5) % 61) - 30); }

struct Job {
  int nranks, dev, iters, blocks;
  bool spread;
  size_t count;
  ncclUniqueId id;
};

static int runRank(Job const& job, int rank) {
  int dev = job.dev;
  if (job.spread) {
    int ngpus = 0;
    CUDACHECK(cudaGetDeviceCount(&ngpus));
    dev = rank % ngpus;
  }
  CUDACHECK(cudaSetDevice(dev));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, job.nranks, job.id, rank));
  size_t bytes = job.count * sizeof(float);
  // Everything this rank allocates comes before the collective calls below. Ranks that are
  // threads of one process share the GPU's context, where an allocation serialises the kernels
  // issued before and after it: a rank allocating while a peer's kernel already waits at the
  // barrier for it would never get its own kernel there.
  float* out;
  CUDACHECK(cudaMalloc(&out, bytes));
  // A stream of this rank's own: ranks that are threads of one process must not share the legacy
  // default stream, where one rank's kernel, waiting at the barrier for the others, would hold
  // back theirs for ever.
  cudaStream_t stream;
  CUDACHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Pinned, so that the copies are queued on the stream and only cudaStreamSynchronize waits: a
  // copy from pageable memory waits inside the driver for the kernel before it, which waits at the
  // barrier for peers that may still have to launch theirs.
  float* host = nullptr;
  CUDACHECK(cudaMallocHost(&host, bytes));
  void* in = nullptr;
  NCCLCHECK(ncclMemAlloc(&in, bytes));
  ncclWindow_t win;
  NCCLCHECK(ncclCommWindowRegister(comm, in, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof(reqs));
  reqs.lsaBarrierCount = job.blocks;
  ncclDevComm devComm;
  NCCLCHECK(ncclDevCommCreate(comm, &reqs, &devComm));
  if (devComm.lsaSize != job.nranks) {
    fprintf(stderr, "rank %d: the LSA team has %d ranks, not all %d: this kernel needs every rank load/store reachable\n",
            rank, devComm.lsaSize, job.nranks);
    return 1;
  }
  std::vector<float> want(job.count);
  size_t wrong = 0;
  for (int it = 0; it < job.iters && wrong == 0; it++) {
    for (size_t i = 0; i < job.count; i++) {
      host[i] = inputOf(rank, i, it);
      want[i] = 0;
      for (int r = 0; r < job.nranks; r++) want[i] += inputOf(r, i, it);
    }
    CUDACHECK(cudaMemcpyAsync(in, host, bytes, cudaMemcpyHostToDevice, stream));
    CUDACHECK(cudaMemsetAsync(out, 0xff, bytes, stream));  // NaN everywhere: an element left unwritten fails
    lsaAllReduce<<<job.blocks, 256, 0, stream>>>(win, 0, out, job.count, devComm);
    CUDACHECK(cudaGetLastError());
    CUDACHECK(cudaMemcpyAsync(host, out, bytes, cudaMemcpyDeviceToHost, stream));
    CUDACHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < job.count; i++) {
      if (host[i] != want[i]) {
        if (wrong < 5) fprintf(stderr, "rank %d iteration %d: out[%zu] = %g, want %g\n", rank, it, i, host[i], want[i]);
        wrong++;
      }
    }
  }
  NCCLCHECK(ncclDevCommDestroy(comm, &devComm));
  NCCLCHECK(ncclCommWindowDeregister(comm, win));
  NCCLCHECK(ncclMemFree(in));
  CUDACHECK(cudaFree(out));
  CUDACHECK(cudaFreeHost(host));
  CUDACHECK(cudaStreamDestroy(stream));
  NCCLCHECK(ncclCommDestroy(comm));
  if (wrong) fprintf(stderr, "rank %d: %zu wrong elements\n", rank, wrong);
  return wrong ? 1 : 0;
}

struct ThreadArg {
  Job const* job;
  int rank, rc;
};
static void* rankThread(void* p) {
  ThreadArg* a = (ThreadArg*)p;
  a->rc = runRank(*a->job, a->rank);
  return nullptr;
}

static double nowS() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  Job job = {2, 0, 5, 4, false, (1u << 20) + 3, {}};
  bool threads = false;
  for (int i = 1; i < argc; i++) {
    char const* a = argv[i];
    if (!strcmp(a, "--spread")) { job.spread = true; continue; }
    char const* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) { fprintf(stderr, "device_allreduce: %s needs a value\n", a); return 2; }
    if (!strcmp(a, "--procs")) job.nranks = atoi(v), threads = false;
    else if (!strcmp(a, "--threads")) job.nranks = atoi(v), threads = true;
    else if (!strcmp(a, "--dev")) job.dev = atoi(v);
    else if (!strcmp(a, "--count")) job.count = strtoull(v, nullptr, 10);
    else if (!strcmp(a, "--iters")) job.iters = atoi(v);
    else if (!strcmp(a, "--blocks")) job.blocks = atoi(v);
    else { fprintf(stderr, "device_allreduce: unknown option %s\n", a); return 2; }
    i++;
  }
  if (job.nranks < 1 || job.nranks > 64 || job.count == 0 || job.iters < 1 || job.blocks < 1) {
    fprintf(stderr, "device_allreduce: need 1..64 ranks, count > 0, iters >= 1, blocks >= 1\n");
    return 2;
  }
  // Ranks as threads share the GPU's context, and their kernels wait for each other at the
  // barrier. With CUDA's lazy module loading, a rank's first copy, memset or launch may load code,
  // and a load can wait for the device to go idle, which a peer's kernel waiting for this rank
  // never lets it do: one first iteration in 15 to 25 hung that way on one H200. Eager loading,
  // set before the first CUDA call, leaves nothing to load later (a value the user set stays).
  if (threads) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  int rank = -1;  // for NCCLCHECK's message
  NCCLCHECK(ncclGetUniqueId(&job.id));
  int failed = 0;
  if (threads) {
    std::vector<ThreadArg> args(job.nranks);
    std::vector<pthread_t> tids(job.nranks);
    for (int r = 0; r < job.nranks; r++) {
      args[r] = {&job, r, 1};
      pthread_create(&tids[r], nullptr, rankThread, &args[r]);
    }
    for (int r = 0; r < job.nranks; r++) {
      pthread_join(tids[r], nullptr);
      failed += args[r].rc != 0;
    }
  } else {
    std::vector<pid_t> pids(job.nranks);
    for (int r = 0; r < job.nranks; r++) {
      pids[r] = fork();
      if (pids[r] < 0) { perror("fork"); return 3; }
      if (pids[r] == 0) _exit(runRank(job, r));
    }
    double deadline = nowS() + 240;  // the kernel's own barrier deadline is 120 s
    for (int r = 0; r < job.nranks; r++) {
      int st = 0;
      pid_t got;
      while ((got = waitpid(pids[r], &st, WNOHANG)) == 0 && nowS() < deadline) usleep(10000);
      if (got == 0) {
        fprintf(stderr, "device_allreduce: rank %d (pid %d) still running after 240 s; killing it\n", r, (int)pids[r]);
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        failed++;
      } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "device_allreduce: rank %d failed (status 0x%x)\n", r, st);
        failed++;
      }
    }
  }
  char where[32];
  if (job.spread) snprintf(where, sizeof where, "spread over the GPUs");
  else snprintf(where, sizeof where, "on GPU %d", job.dev);
  printf("device_allreduce: %s (%d ranks as %s %s, %zu floats, %d iterations, %d blocks)\n", failed ? "FAIL" : "PASS",
         job.nranks, threads ? "threads" : "processes", where, job.count, job.iters, job.blocks);
  return failed ? 1 : 0;
}
