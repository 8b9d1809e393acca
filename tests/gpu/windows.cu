// windows.cu: symmetric windows and device communicators, --procs processes on GPU 0.
//
// Host C++ and tiny kernels built by nvcc on the GPU machine against the public headers
// (nccl.h, nccl_device/core.h). The parent makes the unique id and forks one process per rank
// before any CUDA call; each rank:
//   1. registers three symmetric windows (NCCL_WIN_COLL_SYMMETRIC) over ncclMemAlloc memory: one
//      at the start of an allocation, one 1 MiB + 4 KiB into the same allocation, one over a
//      second allocation; in each a kernel writes the next LSA rank's window through the window's
//      lsaFlatBase arithmetic (peer p's byte o at lsaFlatBase + p * stride4G * 4 GiB + o), and
//      the owner checks every element of its own (poisoned first) buffer. With NCCL_P2P_DISABLE=1
//      every rank is an LSA team of its own and writes its own window the same way;
//   2. deregisters them all, registers again at another offset and checks again;
//   3. checks the refusals: a window over cudaMalloc memory and windows at different offsets on
//      different ranks (ncclInvalidArgument), and every GIN / multimem requirement of
//      ncclDevCommCreate (ncclInvalidUsage, the text naming it); GIN barriers (railGinBarrierCount,
//      barrierCount) are refused only where the LSA team is not the whole communicator, and
//      accepted otherwise (the rail is this rank alone);
//   4. creates a device communicator with two resource buffers and two LSA barriers: checks its
//      fields, then a kernel writes its rank into each peer's first resource buffer, signals each
//      peer's barrier inbox through the raw layout the device API indexes (word
//      3 * nBarriers + barrier * lsaSize + lsaRank of the peer's barrier buffer), waits for every
//      peer's signal in its own inboxes (bounded), and reads what the peers wrote; destroys it.
// With --undumpable each rank makes itself non-dumpable first (prctl PR_SET_DUMPABLE 0), so that
// without CAP_SYS_PTRACE peers cannot take its descriptors with pidfd_getfd and the library hands
// them over a Unix socket instead (as under Yama's ptrace_scope 1 between sibling processes).
// Prints "WINDOWS: PASS|FAIL ..." last; exits 0 only if every rank passed.
//
// usage: windows [--procs N] [--undumpable]
#include "common.cuh"
#include "expect.cuh"

#include <nccl_device/core.h>

#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

static const uint64_t kFourGiB = 1ull << 32;

// Rank `src` writes element i of LSA peer `peer`'s window as value(src, i).
__host__ __device__ static int value(int src, size_t i) { return (src + 1) * 1000000 + (int)(i % 999983); }

static __global__ void writePeer(ncclWindow_t w, int peer, int src, size_t n) {
  char* base = w->lsaFlatBase + (uint64_t)peer * w->stride4G * kFourGiB;
  int* p = (int*)base;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = value(src, i);
}

// Every rank has finished its writes: an all-reduce after each rank's kernels have completed.
static void barrier(ncclComm_t comm, cudaStream_t s, int* scratch) {
  CUDACHECK(cudaStreamSynchronize(s));
  NCCLCHECK(ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
}

struct Win {
  char* buf;
  size_t bytes;
  ncclWindow_t w;
};

// Each window's owner checks its buffer after the previous rank of its LSA team wrote it.
static void writeAndCheck(ncclComm_t comm, cudaStream_t s, int* scratch, std::vector<Win>& wins, ncclTeam_t lsa,
                          const char* what) {
  int rank = gRank, m = lsa.nRanks;
  for (auto& w : wins) CUDACHECK(cudaMemsetAsync(w.buf, 0xff, w.bytes, s));
  barrier(comm, s, scratch);
  for (auto& w : wins) writePeer<<<64, 256, 0, s>>>(w.w, (lsa.rank + 1) % m, rank, w.bytes / 4);
  CUDACHECK(cudaGetLastError());
  barrier(comm, s, scratch);
  int src = rank - lsa.rank + (lsa.rank + m - 1) % m;
  for (size_t k = 0; k < wins.size(); k++) {
    std::vector<int> h(wins[k].bytes / 4);
    CUDACHECK(cudaMemcpy(h.data(), wins[k].buf, wins[k].bytes, cudaMemcpyDeviceToHost));
    long bad = 0, first = -1;
    for (size_t i = 0; i < h.size(); i++)
      if (h[i] != value(src, i)) {
        if (first < 0) first = (long)i;
        bad++;
      }
    EXPECT(bad == 0, "%s window %zu: %ld of %zu elements wrong (first at %ld: %d, want %d)", what, k, bad, h.size(),
           first, first >= 0 ? h[first] : 0, first >= 0 ? value(src, first) : 0);
  }
}

static void expectRefused(ncclResult_t got, ncclResult_t want, const char* text, const char* what) {
  const char* last = ncclGetLastError(nullptr);
  EXPECT(got == want, "%s: got %s, want %s (%s)", what, ncclGetErrorString(got), ncclGetErrorString(want), last);
  EXPECT(last && strstr(last, text), "%s: last error \"%s\" lacks \"%s\"", what, last ? last : "", text);
}

// The resource-buffer and barrier kernel of step 4 (one thread: the device API's barrier in raw
// form). out[0] = peers whose signal arrived, out[1 + q] = what peer q wrote in our buffer 0.
static __global__ void signalPeers(ncclDevComm dc, ncclDevResourceHandle buf0, int* out, long long spinLimit) {
  const ncclWindow_vidmem& rw = dc.resourceWindow_inlined;
  auto at = [&](int peer, ncclDevResourceHandle h) {
    return rw.lsaFlatBase + (uint64_t)peer * rw.stride4G * kFourGiB + (size_t)h * 128;
  };
  int me = dc.lsaRank, n = dc.lsaSize, nb = dc.lsaBarrier.nBarriers;
  for (int q = 0; q < n; q++) ((volatile int*)at(q, buf0))[me] = 100 + dc.rank;
  __threadfence_system();
  for (int q = 0; q < n; q++) {
    uint32_t* inbox = (uint32_t*)at(q, dc.lsaBarrier.bufHandle) + 3 * nb + 0 * n + me;
    atomicExch(inbox, 1u);
  }
  uint32_t* mine = (uint32_t*)at(me, dc.lsaBarrier.bufHandle) + 3 * nb;
  int arrived = 0;
  long long t0 = clock64();
  while (clock64() - t0 < spinLimit) {
    arrived = 0;
    for (int q = 0; q < n; q++) arrived += ((volatile uint32_t*)mine)[q] == 1u;
    if (arrived == n) break;
  }
  __threadfence_system();
  out[0] = arrived;
  for (int q = 0; q < n; q++) out[1 + q] = ((volatile int*)at(me, buf0))[q];
}

static int runRank(const ncclUniqueId& id, int rank, int n) {
  gRank = rank;
  CUDACHECK(cudaSetDevice(0));
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* scratch;
  CUDACHECK(cudaMalloc(&scratch, 4));

  // One GPU: one LSA team of every rank, unless P2P is disabled (then a team of one each).
  ncclTeam_t lsa = ncclTeamLsa(comm);
  const char* p2pOff = getenv("NCCL_P2P_DISABLE");
  int wantLsa = (p2pOff && atoi(p2pOff) == 1) ? 1 : n;
  EXPECT(lsa.nRanks == wantLsa && lsa.rank == rank % wantLsa && lsa.stride == 1, "ncclTeamLsa {%d,%d,%d}",
         lsa.nRanks, lsa.rank, lsa.stride);

  // 1. Three windows: at the start of an allocation, inside it, and over a second allocation.
  const size_t kAlloc = 4 << 20, kSmall = 64 << 10;
  char *a, *b;
  NCCLCHECK(ncclMemAlloc((void**)&a, kAlloc));
  NCCLCHECK(ncclMemAlloc((void**)&b, kSmall));
  std::vector<Win> wins = {{a, 1 << 20, nullptr}, {a + (1 << 20) + 4096, kSmall, nullptr}, {b, kSmall, nullptr}};
  for (auto& w : wins) NCCLCHECK(ncclCommWindowRegister(comm, w.buf, w.bytes, &w.w, NCCL_WIN_COLL_SYMMETRIC));
  writeAndCheck(comm, s, scratch, wins, lsa, "first");

  // 2. Deregister all, register again elsewhere in the allocation.
  for (auto& w : wins) NCCLCHECK(ncclCommWindowDeregister(comm, w.w));
  std::vector<Win> again = {{a + 8192, 2 << 20, nullptr}};
  NCCLCHECK(ncclCommWindowRegister(comm, again[0].buf, again[0].bytes, &again[0].w, NCCL_WIN_COLL_SYMMETRIC));
  writeAndCheck(comm, s, scratch, again, lsa, "re-registered");
  NCCLCHECK(ncclCommWindowDeregister(comm, again[0].w));

  // 3. Refusals: memory that is not VMM memory, offsets that differ, GIN and multimem.
  char* plain;
  CUDACHECK(cudaMalloc(&plain, kSmall));
  ncclWindow_t w;
  expectRefused(ncclCommWindowRegister(comm, plain, kSmall, &w, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidArgument,
                "not memory from ncclMemAlloc", "cudaMalloc window");
  if (lsa.nRanks > 1)
    expectRefused(ncclCommWindowRegister(comm, a + 4096 * rank, kSmall, &w, NCCL_WIN_COLL_SYMMETRIC),
                  ncclInvalidArgument, "same offset", "windows at different offsets");
  struct Refusal {
    const char* text;
    void (*set)(ncclDevCommRequirements&);
  } refusals[] = {
      {"ginForceEnable", [](ncclDevCommRequirements& r) { r.ginForceEnable = true; }},
      {"ginSignalCount", [](ncclDevCommRequirements& r) { r.ginSignalCount = 1; }},
      {"ginCounterCount", [](ncclDevCommRequirements& r) { r.ginCounterCount = 1; }},
      {"lsaMultimem", [](ncclDevCommRequirements& r) { r.lsaMultimem = true; }},
  };
  for (auto& rf : refusals) {
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs));
    rf.set(reqs);
    ncclDevComm dc;
    expectRefused(ncclDevCommCreate(comm, &reqs, &dc), ncclInvalidUsage, rf.text, rf.text);
  }
  // GIN barriers: refused across LSA teams, accepted (handles zero) within one.
  for (int k = 0; k < 2; k++) {
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs));
    const char* name = k == 0 ? "railGinBarrierCount" : "barrierCount";
    if (k == 0) reqs.railGinBarrierCount = 4;
    else reqs.barrierCount = 2;
    ncclDevComm dc;
    ncclResult_t got = ncclDevCommCreate(comm, &reqs, &dc);
    if (lsa.nRanks < n) {
      expectRefused(got, ncclInvalidUsage, name, name);
    } else {
      EXPECT(got == ncclSuccess, "%s within one LSA team: %s (%s)", name, ncclGetErrorString(got),
             ncclGetLastError(nullptr));
      if (got == ncclSuccess) {
        EXPECT(dc.railGinBarrier.bufHandle == 0 && dc.railGinBarrier.signal0 == 0, "%s: railGinBarrier set", name);
        EXPECT(dc.lsaBarrier.nBarriers == (k == 0 ? 0 : 2), "%s: lsaBarrier.nBarriers %d", name,
               dc.lsaBarrier.nBarriers);
        NCCLCHECK(ncclDevCommDestroy(comm, &dc));
      }
    }
  }
  {
    ncclTeamRequirements team;
    memset(&team, 0, sizeof(team));
    team.team = lsa;
    team.multimem = true;
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs));
    reqs.teamRequirementsList = &team;
    ncclDevComm dc;
    expectRefused(ncclDevCommCreate(comm, &reqs, &dc), ncclInvalidUsage, "multimem", "team multimem");
  }

  // 4. A device communicator: two resource buffers and two LSA barriers.
  ncclDevResourceHandle h0 = 0xdead, h1 = 0xdead;
  ncclDevResourceRequirements r0, r1;
  memset(&r0, 0, sizeof(r0));
  memset(&r1, 0, sizeof(r1));
  r0.bufferSize = 1000;
  r0.outBufferHandle = &h0;
  r0.next = &r1;
  r1.bufferSize = 4096;
  r1.bufferAlign = 512;
  r1.outBufferHandle = &h1;
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof(reqs));
  reqs.resourceRequirementsList = &r0;
  reqs.lsaBarrierCount = 2;
  ncclDevComm dc;
  memset(&dc, 0xab, sizeof(dc));
  NCCLCHECK(ncclDevCommCreate(comm, &reqs, &dc));
  EXPECT(dc.rank == rank && dc.nRanks == n && dc.lsaRank == lsa.rank && dc.lsaSize == lsa.nRanks, "ranks %d/%d lsa %d/%d",
         dc.rank, dc.nRanks, dc.lsaRank, dc.lsaSize);
  EXPECT(h0 == 0 && h1 == 1024 / 128, "handles %u %u", h0, h1);
  EXPECT(dc.lsaBarrier.nBarriers == 2 && dc.lsaBarrier.bufHandle >= (1024 + 4096) / 128, "barrier {%u, %d}",
         dc.lsaBarrier.bufHandle, dc.lsaBarrier.nBarriers);
  EXPECT(dc.resourceWindow != nullptr && dc.windowTable != nullptr && dc.ginContextCount == 0 &&
             dc.lsaMultimem.mcBasePtr == nullptr && dc.ginSignalCount == 0 && dc.ginCounterCount == 0,
         "resource window / table / GIN / multimem fields");
  ncclWindow_vidmem fromDevice;
  CUDACHECK(cudaMemcpy(&fromDevice, dc.resourceWindow, sizeof(fromDevice), cudaMemcpyDeviceToHost));
  EXPECT(fromDevice.lsaFlatBase == dc.resourceWindow_inlined.lsaFlatBase &&
             fromDevice.stride4G == dc.resourceWindow_inlined.stride4G && fromDevice.lsaRank == lsa.rank,
         "resourceWindow and its inlined copy differ");
  int* out;
  int m = lsa.nRanks;
  CUDACHECK(cudaMalloc(&out, (1 + m) * sizeof(int)));
  CUDACHECK(cudaMemset(out, 0xff, (1 + m) * sizeof(int)));
  barrier(comm, s, scratch);
  signalPeers<<<1, 1, 0, s>>>(dc, h0, out, 20ll * 1000 * 1000 * 1000);  // ~10 s at 2 GHz
  CUDACHECK(cudaGetLastError());
  CUDACHECK(cudaStreamSynchronize(s));
  std::vector<int> h(1 + m);
  CUDACHECK(cudaMemcpy(h.data(), out, h.size() * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(h[0] == m, "%d of %d peers' barrier signals arrived", h[0], m);
  for (int q = 0; q < m; q++) {
    int want = 100 + rank - lsa.rank + q;
    EXPECT(h[1 + q] == want, "resource buffer slot %d holds %d, want %d", q, h[1 + q], want);
  }
  barrier(comm, s, scratch);
  NCCLCHECK(ncclDevCommDestroy(comm, &dc));

  NCCLCHECK(ncclMemFree(a));
  NCCLCHECK(ncclMemFree(b));
  CUDACHECK(cudaFree(plain));
  CUDACHECK(cudaFree(out));
  NCCLCHECK(ncclCommDestroy(comm));
  printf("rank %d: %s (%d failures)\n", rank, gFailures ? "FAIL" : "PASS", gFailures);
  return gFailures ? 1 : 0;
}

int main(int argc, char** argv) {
  int procs = 2;
  bool undumpable = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--undumpable")) undumpable = true;
    else {
      fprintf(stderr, "usage: windows [--procs N] [--undumpable]\n");
      return 2;
    }
  }
  if (procs < 1 || procs > 16) {
    fprintf(stderr, "--procs %d: 1 to 16\n", procs);
    return 2;
  }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  int failed = runRankProcesses(procs, [&](int r) {
    if (undumpable && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
      perror("prctl");
      return 3;
    }
    return runRank(id, r, procs);
  });
  printf("WINDOWS: %s (%d processes on GPU 0, %d failed)\n", failed ? "FAIL" : "PASS", procs, failed);
  return failed ? 1 : 0;
}
