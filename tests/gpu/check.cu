// ferronickel correctness checker.
//
// Host C++ built by nvcc on the GPU machine and linked -lnccl against whichever libnccl.so.2 is
// given (ours or NVIDIA's), so it uses only the public NCCL API and the CUDA runtime.
//
// Modes
//   --mode threads  one process, ncclCommInitAll over --devs (a GPU may repeat: 0,0,0,0 = 4
//                   ranks on GPU 0), one stream per rank, ncclGroupStart/End around every
//                   per-rank call.
//   --mode procs    one process per rank: the parent calls ncclGetUniqueId before any CUDA call,
//                   fork()s one child per entry of --devs; each child cudaSetDevice + InitRank.
//   --mode mpi      (only when built with -DCHECK_MPI, e.g. nvcc -ccbin mpicxx) rank/size from
//                   MPI, the id broadcast with MPI_Bcast.
// Tests (default: matrix)
//   matrix      every collective x dtype x op x in/out-of-place x root/peer x count, unaligned
//               buffers, one large (>= 256 MB) case per collective; output poisoned with 0xA5,
//               guard bytes around every output checked, host reference per element.
//   --graph     capture one AllReduce (--graph-coll: another collective; AllPairs sends to and
//               receives from every rank) per rank stream in a CUDA graph, replay N times with
//               fresh inputs written by a kernel on the same stream, verify every replay.
//   --leak      N x (init comms, small allreduce, destroy); cudaMemGetInfo before/after.
//   --watchdog  (meaningful for ferronickel) NCCL_WATCHDOG_TIMEOUT_MS=2000; rank 0 calls
//               AllReduce, the others never call (or call with another count); expects
//               ncclCommGetAsyncError != success within 20 s and ncclCommAbort to return fast.
// Exit code: 0 all passed, 1 wrong results / failed test, 3 fatal CUDA/NCCL error,
//            4 a collective hung (per-case timeout), 124 global timeout.
#include "common.cuh"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <strings.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifdef CHECK_MPI
#include <mpi.h>
#endif

// ---------------------------------------------------------------------------------------------
// Collectives in the matrix
// ---------------------------------------------------------------------------------------------
enum Coll {
  C_ALLREDUCE = 0, C_REDUCE, C_BROADCAST, C_BCAST, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL,
  C_GATHER, C_SCATTER, C_SENDRECV, C_ALLPAIRS, NCOLLS
};
static const char* kCollName[NCOLLS] = {"AllReduce", "Reduce",  "Broadcast", "Bcast",    "AllGather", "ReduceScatter",
                                        "AlltoAll",  "Gather",  "Scatter",   "SendRecv", "AllPairs"};
static bool collReduces(int c) { return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER; }
static bool collRooted(int c) {
  return c == C_REDUCE || c == C_BROADCAST || c == C_BCAST || c == C_GATHER || c == C_SCATTER;
}
// Out-of-place / in-place variants that exist for this collective.
static bool collHasOop(int c) { return c != C_BCAST; }
static bool collHasInplace(int c) { return c != C_ALLTOALL && c != C_SENDRECV && c != C_ALLPAIRS; }

static const size_t GUARD = 256;  // poisoned bytes before and after every output region
static const uint8_t POISON = 0xA5;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------
struct Opts {
  std::string mode = "threads";
  // threads mode: how one thread makes its ranks' communicators. "all": ncclCommInitAll;
  // "group": ncclCommInitRank per rank inside ncclGroupStart/End, as nccl-tests -g N does;
  // "group-split": then ncclCommSplit per rank inside another group, and the tests run on the
  // children.
  std::string init = "all";
  std::vector<int> devs;
  bool quick = false;
  uint64_t seed = 12345;
  std::vector<size_t> counts = {0, 1, 7, 1023, 1048579};
  size_t largeBytes = (size_t)256 << 20;
  bool largeSet = false;
  uint32_t collMask = (1u << NCOLLS) - 1;
  uint32_t dtMask = (1u << NDTYPES) - 1;
  bool dtSet = false;
  uint32_t opMask = (1u << NOPKINDS) - 1;
  bool opSet = false;
  int rootsAll = -1;  // -1: full matrix all, quick ends
  bool unaligned = true;
  bool verbose = true;  // per-case line for every case (false: failures only)
  bool tMatrix = false, tGraph = false, tLeak = false, tWatchdog = false;
  int graphIters = 100;
  size_t graphCount = 1048579;
  int graphColl = 0;  // C_ALLREDUCE
  int leakIters = 100;
  int wdTimeoutMs = 2000;
  std::string wdMode = "never";
  double wdPollS = 20, wdAbortS = 10;
  int timeoutS = 1200;
  double caseTimeoutS = 120;
  int maxPrint = 5;
  bool dryRun = false;
  int hosts = 0;  // procs mode: split the ranks into this many "hosts" (NCCL_HOSTID per child)
  bool uts = false;  // with --hosts: a host is a host name (a UTS namespace per child), no NCCL_HOSTID
};
static Opts g;

static void usage() {
  printf(
      "usage: check [--mode threads|procs|mpi] [--init all|group|group-split (threads)] [--devs 0,1,...] [--hosts H [--uts] (procs)] [--quick] [--seed N]\n"
      "             [--counts a,b,c] [--large-bytes N (0=off)] [--colls AllReduce,Reduce,...]\n"
      "             [--dtypes float32,int8,...] [--ops sum,prod,max,min,avg,pmsH,pmsD]\n"
      "             [--roots all|ends] [--no-unaligned] [--failures-only] [--dry-run (list case counts)]\n"
      "             [--matrix] [--graph [--graph-iters N --graph-count N --graph-coll NAME]]\n"
      "             [--leak [--leak-iters N]]\n"
      "             [--watchdog [--wd-timeout-ms N --wd-mode never|mismatch --wd-poll-s S]]\n"
      "             [--timeout S (global, default 1200)] [--case-timeout S (default 120)]\n");
}

static std::vector<std::string> splitList(const char* s) {
  std::vector<std::string> v;
  std::string cur;
  for (const char* p = s;; p++) {
    if (*p == ',' || *p == 0) {
      if (!cur.empty()) v.push_back(cur);
      cur.clear();
      if (!*p) break;
    } else cur += *p;
  }
  return v;
}

static size_t parseSize(const std::string& s) {
  char* end;
  double v = strtod(s.c_str(), &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return (size_t)v;
}

static void parseArgs(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto need = [&](void) -> const char* {
      if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); }
      return argv[++i];
    };
    if (a == "--mode") g.mode = need();
    else if (a == "--init") {
      g.init = need();
      if (g.init != "all" && g.init != "group" && g.init != "group-split") {
        fprintf(stderr, "--init %s: all, group or group-split\n", g.init.c_str());
        exit(2);
      }
    }
    else if (a == "--devs") { g.devs.clear(); for (auto& s : splitList(need())) g.devs.push_back(atoi(s.c_str())); }
    else if (a == "--quick") g.quick = true;
    else if (a == "--hosts") g.hosts = atoi(need());
    else if (a == "--uts") g.uts = true;
    else if (a == "--seed") g.seed = strtoull(need(), 0, 0);
    else if (a == "--counts") { g.counts.clear(); for (auto& s : splitList(need())) g.counts.push_back(parseSize(s)); }
    else if (a == "--large-bytes") { g.largeBytes = parseSize(need()); g.largeSet = true; }
    else if (a == "--colls") {
      g.collMask = 0;
      for (auto& s : splitList(need())) {
        int f = -1;
        for (int c = 0; c < NCOLLS; c++) if (!strcasecmp(s.c_str(), kCollName[c])) f = c;
        if (f < 0) { fprintf(stderr, "unknown collective %s\n", s.c_str()); exit(2); }
        g.collMask |= 1u << f;
      }
    } else if (a == "--dtypes") {
      g.dtMask = 0; g.dtSet = true;
      for (auto& s : splitList(need())) {
        int d = dtypeFromName(s.c_str());
        if (d < 0) { fprintf(stderr, "unknown dtype %s\n", s.c_str()); exit(2); }
        g.dtMask |= 1u << d;
      }
    } else if (a == "--ops") {
      g.opMask = 0; g.opSet = true;
      for (auto& s : splitList(need())) {
        int f = -1;
        for (int o = 0; o < NOPKINDS; o++) if (!strcasecmp(s.c_str(), kOpName[o])) f = o;
        if (s == "premulsum") { g.opMask |= (1u << OP_PMS_HOST) | (1u << OP_PMS_DEV); continue; }
        if (f < 0) { fprintf(stderr, "unknown op %s\n", s.c_str()); exit(2); }
        g.opMask |= 1u << f;
      }
    } else if (a == "--roots") g.rootsAll = !strcmp(need(), "all");
    else if (a == "--no-unaligned") g.unaligned = false;
    else if (a == "--failures-only") g.verbose = false;
    else if (a == "--dry-run") g.dryRun = true;
    else if (a == "--matrix") g.tMatrix = true;
    else if (a == "--graph") g.tGraph = true;
    else if (a == "--graph-iters") g.graphIters = atoi(need());
    else if (a == "--graph-count") g.graphCount = parseSize(need());
    else if (a == "--graph-coll") {
      const char* name = need();
      g.graphColl = -1;
      for (int c = 0; c < NCOLLS; c++) if (!strcasecmp(name, kCollName[c])) g.graphColl = c;
      if (g.graphColl < 0 || g.graphColl == C_BCAST) { fprintf(stderr, "--graph-coll %s: unknown\n", name); exit(2); }
    }
    else if (a == "--leak") g.tLeak = true;
    else if (a == "--leak-iters") g.leakIters = atoi(need());
    else if (a == "--watchdog") g.tWatchdog = true;
    else if (a == "--wd-timeout-ms") g.wdTimeoutMs = atoi(need());
    else if (a == "--wd-mode") g.wdMode = need();
    else if (a == "--wd-poll-s") g.wdPollS = atof(need());
    else if (a == "--timeout") g.timeoutS = atoi(need());
    else if (a == "--case-timeout") g.caseTimeoutS = atof(need());
    else if (a == "-h" || a == "--help") { usage(); exit(0); }
    else { fprintf(stderr, "unknown option %s\n", a.c_str()); usage(); exit(2); }
  }
  if (!g.tMatrix && !g.tGraph && !g.tLeak && !g.tWatchdog) g.tMatrix = true;
  if (g.rootsAll < 0) g.rootsAll = g.quick ? 0 : 1;
  if (g.quick) {
    // Reduced matrix: 8 dtypes (every size class, signed/unsigned, every float family).
    if (!g.dtSet)
      g.dtMask = (1u << ncclInt8) | (1u << ncclInt32) | (1u << ncclUint64) | (1u << ncclFloat16) |
                 (1u << ncclFloat32) | (1u << ncclFloat64) | (1u << ncclBfloat16) | (1u << ncclFloat8e4m3);
    if (!g.largeSet) g.largeBytes = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Global state
// ---------------------------------------------------------------------------------------------
struct Rank {
  int rank = 0, dev = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  char* sbuf = nullptr;
  char* rbuf = nullptr;
  size_t scap = 0, rcap = 0;
  void* dscalar = nullptr;
  std::vector<uint8_t> host;
};

struct Ctx {
  int nranks = 0;
  std::vector<int> devs;    // device of every rank
  std::vector<Rank> local;  // ranks driven by this process
  bool fp8 = false;
  std::string tag;          // "" in threads mode, "r<k> " otherwise
  std::vector<ncclUniqueId> ids;  // procs mode: pre-generated by the parent
  int mpiRank = -1;
};
static Ctx C;

// Progress counters (also read by the timeout handler).
struct Stats {
  long cases = 0, failed = 0, errors = 0;
  unsigned long long wrong = 0;
};
static Stats gStats;
static Stats gCollStats[NCOLLS];
static char gCurCase[256] = "(none)";

static void onAlarm(int) {
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "\n%sTIMEOUT: global timeout (%d s) hit during case: %s\n%sSUMMARY cases=%ld failed=%ld wrong=%llu "
                   "(incomplete)\n%sRESULT: FAIL (timeout)\n",
                   C.tag.c_str(), g.timeoutS, gCurCase, C.tag.c_str(), gStats.cases, gStats.failed, gStats.wrong,
                   C.tag.c_str());
  if (write(1, buf, n) < 0) {}
  _exit(124);
}

static double nowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wait for every local stream, polling so a hung collective cannot block us forever.
static bool syncAll(double timeoutS) {
  double t0 = nowS();
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    int spins = 0;
    while (true) {
      cudaError_t e = cudaStreamQuery(R.stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) CUDACHECK(e);
      if (nowS() - t0 > timeoutS) return false;
      if (++spins > 1000) usleep(100);
    }
  }
  return true;
}

static void printSummaryAndExit(int code);

static void hangExit() {
  printf("%sHANG: case did not complete within %.0f s: %s\n", C.tag.c_str(), g.caseTimeoutS, gCurCase);
  gStats.failed++;
  printSummaryAndExit(4);
}

static void libInfo() {
  int v = 0;
  NCCLCHECK(ncclGetVersion(&v));
  Dl_info info;
  const char* path = "?";
  if (dladdr((void*)&ncclGetVersion, &info) && info.dli_fname) path = info.dli_fname;
  printf("%s# NCCL version %d, library %s\n", C.tag.c_str(), v, path);
}

// ---------------------------------------------------------------------------------------------
// Communicators
// ---------------------------------------------------------------------------------------------
static ncclUniqueId getId(int k) {
  ncclUniqueId id;
  if (g.mode == "procs") return C.ids.at(k);
#ifdef CHECK_MPI
  if (g.mode == "mpi") {
    if (C.mpiRank == 0) NCCLCHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return id;
  }
#endif
  (void)k;
  NCCLCHECK(ncclGetUniqueId(&id));
  return id;
}

static double initComms(int idIndex) {
  double t0 = nowS();
  if (g.mode == "threads" && g.init != "all") {
    // Every rank's init returns at once inside the group; the group's end makes them all.
    ncclUniqueId id = getId(idIndex);
    NCCLCHECK(ncclGroupStart());
    for (int r = 0; r < C.nranks; r++) {
      CUDACHECK(cudaSetDevice(C.local[r].dev));
      NCCLCHECK(ncclCommInitRank(&C.local[r].comm, C.nranks, id, r));
    }
    NCCLCHECK(ncclGroupEnd());
    if (g.init == "group-split") {
      // The same for splits: every rank takes color 0 and keeps its rank (key = rank).
      std::vector<ncclComm_t> kids(C.nranks);
      NCCLCHECK(ncclGroupStart());
      for (int r = 0; r < C.nranks; r++) {
        CUDACHECK(cudaSetDevice(C.local[r].dev));
        NCCLCHECK(ncclCommSplit(C.local[r].comm, 0, r, &kids[r], nullptr));
      }
      NCCLCHECK(ncclGroupEnd());
      for (int r = 0; r < C.nranks; r++) {
        CUDACHECK(cudaSetDevice(C.local[r].dev));
        NCCLCHECK(ncclCommDestroy(C.local[r].comm));
        C.local[r].comm = kids[r];
      }
    }
  } else if (g.mode == "threads") {
    std::vector<ncclComm_t> comms(C.nranks);
    NCCLCHECK(ncclCommInitAll(comms.data(), C.nranks, C.devs.data()));
    for (int r = 0; r < C.nranks; r++) C.local[r].comm = comms[r];
  } else {
    Rank& R = C.local[0];
    ncclUniqueId id = getId(idIndex);
    CUDACHECK(cudaSetDevice(R.dev));
    NCCLCHECK(ncclCommInitRank(&R.comm, C.nranks, id, R.rank));
  }
  return nowS() - t0;
}

static void destroyComms() {
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    NCCLCHECK(ncclCommDestroy(R.comm));
    R.comm = nullptr;
  }
}

static void ensureCap(Rank& R, size_t sbytes, size_t rbytes) {
  CUDACHECK(cudaSetDevice(R.dev));
  if (sbytes > R.scap) {
    if (R.sbuf) CUDACHECK(cudaFree(R.sbuf));
    CUDACHECK(cudaMalloc(&R.sbuf, sbytes));
    R.scap = sbytes;
  }
  if (rbytes > R.rcap) {
    if (R.rbuf) CUDACHECK(cudaFree(R.rbuf));
    CUDACHECK(cudaMalloc(&R.rbuf, rbytes));
    R.rcap = rbytes;
  }
}

static void freeBufs() {
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    if (R.sbuf) CUDACHECK(cudaFree(R.sbuf));
    if (R.rbuf) CUDACHECK(cudaFree(R.rbuf));
    R.sbuf = R.rbuf = nullptr;
    R.scap = R.rcap = 0;
    std::vector<uint8_t>().swap(R.host);
  }
}

// ---------------------------------------------------------------------------------------------
// Parallel host loop (checking 256 MB outputs single-threaded would take seconds per case).
// ---------------------------------------------------------------------------------------------
template <class F>
static void parallelFor(size_t n, F f) {
  unsigned nt = std::thread::hardware_concurrency();
  if (nt > 16) nt = 16;
  if (nt < 1) nt = 1;
  if (n < (1u << 16) || nt == 1) { f(0, n, 0u); return; }
  std::vector<std::thread> th;
  size_t chunk = (n + nt - 1) / nt;
  for (unsigned t = 0; t < nt; t++) {
    size_t b = t * chunk, e = std::min(n, b + chunk);
    if (b >= e) break;
    th.emplace_back([=, &f] { f(b, e, t); });
  }
  for (auto& t : th) t.join();
}

// ---------------------------------------------------------------------------------------------
// One case
// ---------------------------------------------------------------------------------------------
struct Case {
  int coll, dt, opk, inplace, root, offS, offR;
  size_t count;
  uint64_t seed;
  const char* note;
};

struct Layout {
  size_t sendExt, recvExt, rExt;  // elements: input extent, output extent, extent of buffer R
};

static Layout layoutOf(const Case& c, int n) {
  size_t k = c.count, nk = (size_t)n * c.count;
  Layout L;
  switch (c.coll) {
    case C_ALLGATHER: L.sendExt = k; L.recvExt = nk; break;
    case C_REDUCESCATTER: L.sendExt = nk; L.recvExt = k; break;
    case C_ALLTOALL: case C_ALLPAIRS: L.sendExt = nk; L.recvExt = nk; break;
    case C_GATHER: L.sendExt = k; L.recvExt = nk; break;
    case C_SCATTER: L.sendExt = nk; L.recvExt = k; break;
    default: L.sendExt = k; L.recvExt = k; break;
  }
  L.rExt = c.inplace ? std::max(L.sendExt, L.recvExt) : L.recvExt;
  return L;
}

struct Ptrs {
  char* send;
  char* recv;
  char* R;  // start of the recv-side buffer (in-place: the one buffer)
};

static Ptrs ptrsOf(const Case& c, Rank& R) {
  int es = kDt[c.dt].size;
  Ptrs p;
  p.R = R.rbuf + GUARD + (size_t)c.offR * es;
  size_t blk = (size_t)R.rank * c.count * es;
  if (!c.inplace) {
    p.send = R.sbuf + GUARD + (size_t)c.offS * es;
    p.recv = p.R;
    return p;
  }
  switch (c.coll) {
    case C_ALLGATHER: case C_GATHER: p.recv = p.R; p.send = p.R + blk; break;
    case C_REDUCESCATTER: case C_SCATTER: p.send = p.R; p.recv = p.R + blk; break;
    default: p.send = p.recv = p.R; break;
  }
  return p;
}

// Does this rank generate input (only the root's matters for one-to-all collectives, and
// non-root in-place buffers are outputs that must stay poisoned until the collective writes).
static bool rankHasInput(const Case& c, int r) {
  if (c.coll == C_BROADCAST || c.coll == C_BCAST || c.coll == C_SCATTER) return r == c.root;
  return true;
}
// Is this rank's output defined?
static bool rankHasOutput(const Case& c, int r) {
  if (c.coll == C_REDUCE || c.coll == C_GATHER) return r == c.root;
  return true;
}

static void scalarBytes(int dt, int opk, int rank, uint8_t* out) {
  uint64_t iv = 0;
  double dv = 0;
  premulScalar(dt, opk, rank, &iv, &dv);
  memset(out, 0, 16);
  storeVal(out, 0, dt, iv, dv);
}

// Issue rank R's part of case c (inside the caller's group).  Returns the first error.
static ncclResult_t issue(const Case& c, Rank& R, const Ptrs& p, ncclRedOp_t op, std::string& what) {
  ncclDataType_t dt = (ncclDataType_t)c.dt;
  int n = C.nranks;
  ncclResult_t r = ncclSuccess;
  size_t es = kDt[c.dt].size;
  switch (c.coll) {
    case C_ALLREDUCE: what = "ncclAllReduce"; r = ncclAllReduce(p.send, p.recv, c.count, dt, op, R.comm, R.stream); break;
    case C_REDUCE: what = "ncclReduce"; r = ncclReduce(p.send, p.recv, c.count, dt, op, c.root, R.comm, R.stream); break;
    case C_BROADCAST: what = "ncclBroadcast"; r = ncclBroadcast(p.send, p.recv, c.count, dt, c.root, R.comm, R.stream); break;
    case C_BCAST: what = "ncclBcast"; r = ncclBcast(p.recv, c.count, dt, c.root, R.comm, R.stream); break;
    case C_ALLGATHER: what = "ncclAllGather"; r = ncclAllGather(p.send, p.recv, c.count, dt, R.comm, R.stream); break;
    case C_REDUCESCATTER: what = "ncclReduceScatter"; r = ncclReduceScatter(p.send, p.recv, c.count, dt, op, R.comm, R.stream); break;
    case C_ALLTOALL: what = "ncclAlltoAll"; r = ncclAlltoAll(p.send, p.recv, c.count, dt, R.comm, R.stream); break;
    case C_GATHER: what = "ncclGather"; r = ncclGather(p.send, p.recv, c.count, dt, c.root, R.comm, R.stream); break;
    case C_SCATTER: what = "ncclScatter"; r = ncclScatter(p.send, p.recv, c.count, dt, c.root, R.comm, R.stream); break;
    case C_SENDRECV: {
      int s = c.root;  // ring shift: send to r+s, receive from r-s
      what = "ncclSend";
      r = ncclSend(p.send, c.count, dt, (R.rank + s) % n, R.comm, R.stream);
      if (r == ncclSuccess) { what = "ncclRecv"; r = ncclRecv(p.recv, c.count, dt, (R.rank - s + n) % n, R.comm, R.stream); }
      break;
    }
    case C_ALLPAIRS:
      for (int q = 0; q < n && r == ncclSuccess; q++) {
        what = "ncclSend";
        r = ncclSend(p.send + (size_t)q * c.count * es, c.count, dt, q, R.comm, R.stream);
        if (r == ncclSuccess) { what = "ncclRecv"; r = ncclRecv(p.recv + (size_t)q * c.count * es, c.count, dt, q, R.comm, R.stream); }
      }
      break;
  }
  return r;
}

// Expected value of output element k on rank r.
static inline RefVal expectedAt(const Case& c, int r, size_t k, int cls) {
  int n = C.nranks;
  RefVal v;
  v.iv = 0; v.dv = 0; v.mag = 0;
  auto gen = [&](int q, uint64_t idx) { genVal(c.dt, cls, c.seed, q, idx, &v.iv, &v.dv); };
  switch (c.coll) {
    case C_ALLREDUCE: case C_REDUCE: return reduceRef(c.dt, c.opk, n, c.seed, k);
    case C_REDUCESCATTER: return reduceRef(c.dt, c.opk, n, c.seed, (uint64_t)r * c.count + k);
    case C_BROADCAST: case C_BCAST: gen(c.root, k); break;
    case C_ALLGATHER: case C_GATHER: gen((int)(k / c.count), k % c.count); break;
    case C_ALLTOALL: case C_ALLPAIRS: gen((int)(k / c.count), (uint64_t)r * c.count + k % c.count); break;
    case C_SCATTER: gen(c.root, (uint64_t)r * c.count + k); break;
    case C_SENDRECV: gen((r - c.root + n) % n, k); break;
  }
  return v;
}
static bool refRankIndependent(int coll) {
  return coll == C_ALLREDUCE || coll == C_REDUCE || coll == C_BROADCAST || coll == C_BCAST || coll == C_ALLGATHER ||
         coll == C_GATHER;
}

struct Mismatch {
  int rank;
  size_t idx;
  std::string text;
};

static std::string fmtVal(int dt, uint64_t iv, double dv) {
  char b[64];
  if (dtIsInt(dt)) {
    if (dtIsSignedInt(dt)) snprintf(b, sizeof b, "%lld", (long long)iv);
    else snprintf(b, sizeof b, "%llu", (unsigned long long)iv);
  } else snprintf(b, sizeof b, "%.9g", dv);
  return b;
}

// Check every local rank's recv-side buffer: guards, untouched regions, outputs.
static unsigned long long checkCase(const Case& c, std::vector<Mismatch>& mm) {
  const int es = kDt[c.dt].size;
  const int n = C.nranks;
  Layout L = layoutOf(c, n);
  const int cls = collReduces(c.coll) ? valClassFor(c.opk) : VC_SUM;
  const int exact = !collReduces(c.coll) || c.opk == OP_MAX || c.opk == OP_MIN;
  const size_t front = GUARD + (size_t)c.offR * es;  // bytes before R
  const size_t total = front + L.rExt * es + GUARD;
  unsigned long long wrong = 0;
  std::mutex mu;
  auto addMM = [&](int rank, size_t idx, std::string t) {
    std::lock_guard<std::mutex> lk(mu);
    mm.push_back({rank, idx, t});
  };

  struct Chk {
    Rank* R;
    const uint8_t* out;  // output region on host
    bool defined;
  };
  std::vector<Chk> chk;
  for (auto& R : C.local) {
    if (R.host.size() < total) R.host.resize(total);
    CUDACHECK(cudaMemcpy(R.host.data(), R.rbuf, total, cudaMemcpyDeviceToHost));
    // Guards: bytes in front of R and after R's extent must still be poison.
    const uint8_t* h = R.host.data();
    for (size_t b = 0; b < total; b++) {
      if (b == front) b = front + L.rExt * es;
      if (b >= total) break;
      if (h[b] != POISON) {
        wrong++;
        if (mm.size() < 64) {
          char t[160];
          snprintf(t, sizeof t, "guard byte %s R%+lld overwritten (0x%02x)", b < front ? "before" : "after",
                   b < front ? -(long long)(front - b) : (long long)(b - front - L.rExt * es), h[b]);
          addMM(R.rank, b, t);
        }
      }
    }
    Ptrs p = ptrsOf(c, R);
    const uint8_t* out = h + front + (p.recv - p.R);
    bool def = rankHasOutput(c, R.rank);
    if (!def && c.inplace) continue;  // non-root in-place buffer: content unspecified
    chk.push_back({&R, out, def});
  }

  std::vector<unsigned long long> wr(16, 0);
  const bool indep = refRankIndependent(c.coll);
  const int maxP = g.maxPrint;
  parallelFor(L.recvExt, [&](size_t b, size_t e, unsigned t) {
    unsigned long long w = 0;
    int printed = 0;
    for (size_t k = b; k < e; k++) {
      RefVal ref;
      bool have = false;
      for (auto& ck : chk) {
        uint64_t giv = 0;
        double gdv = 0;
        if (!ck.defined) {
          // recvbuff of a non-root rank may be NULL for NCCL: the library must not write it.
          bool bad = false;
          for (int x = 0; x < es; x++) bad |= ck.out[k * es + x] != POISON;
          if (bad) {
            w++;
            if (printed++ < maxP) addMM(ck.R->rank, k, "non-root recvbuff written");
          }
          continue;
        }
        if (!have || !indep) { ref = expectedAt(c, ck.R->rank, k, cls); have = true; }
        loadVal(ck.out, k, c.dt, &giv, &gdv);
        if (!valueMatches(c.dt, exact, n, ref, giv, gdv)) {
          w++;
          if (printed++ < maxP) {
            std::string s = "got " + fmtVal(c.dt, giv, gdv) + " expected " + fmtVal(c.dt, ref.iv, ref.dv);
            bool poisoned = true;
            for (int x = 0; x < es; x++) poisoned &= ck.out[k * es + x] == POISON;
            if (poisoned) s += " (still poison: not written)";
            addMM(ck.R->rank, k, s);
          }
        }
      }
    }
    wr[t] += w;
  });
  for (auto w : wr) wrong += w;
  std::sort(mm.begin(), mm.end(), [](const Mismatch& a, const Mismatch& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.idx < b.idx;
  });
  return wrong;
}

static std::string caseDesc(const Case& c) {
  char b[256];
  snprintf(b, sizeof b, "%-13s %-8s %-4s ip=%d root=%-2d count=%-9zu off=%d/%d%s%s", kCollName[c.coll], dtName(c.dt),
           collReduces(c.coll) ? kOpName[c.opk] : "-", c.inplace, c.root, c.count, c.inplace ? c.offR : c.offS, c.offR,
           c.note ? " " : "", c.note ? c.note : "");
  return b;
}

static void runCase(const Case& c) {
  const int es = kDt[c.dt].size;
  const int n = C.nranks;
  Layout L = layoutOf(c, n);
  std::string desc = caseDesc(c);
  snprintf(gCurCase, sizeof gCurCase, "%s", desc.c_str());
  const int cls = collReduces(c.coll) ? valClassFor(c.opk) : VC_SUM;
  const size_t front = GUARD + (size_t)c.offR * es;
  const size_t rTotal = front + L.rExt * es + GUARD;
  const size_t sTotal = GUARD + ((size_t)c.offS + L.sendExt) * es + GUARD;

  // 1. Buffers, poison, fresh inputs, PreMulSum ops.
  std::vector<ncclRedOp_t> ops(C.local.size(), (ncclRedOp_t)c.opk);
  std::string err;
  for (size_t i = 0; i < C.local.size(); i++) {
    Rank& R = C.local[i];
    ensureCap(R, sTotal, rTotal);
    CUDACHECK(cudaMemsetAsync(R.rbuf, POISON, rTotal, R.stream));
    Ptrs p = ptrsOf(c, R);
    if (rankHasInput(c, R.rank)) launchGen(p.send, L.sendExt, c.dt, cls, c.seed, R.rank, 0, R.stream);
    if (collReduces(c.coll) && (c.opk == OP_PMS_HOST || c.opk == OP_PMS_DEV)) {
      uint8_t sb[16];
      scalarBytes(c.dt, c.opk, R.rank, sb);
      ncclResult_t r;
      if (c.opk == OP_PMS_HOST) {
        r = ncclRedOpCreatePreMulSum(&ops[i], sb, (ncclDataType_t)c.dt, ncclScalarHostImmediate, R.comm);
      } else {
        if (!R.dscalar) CUDACHECK(cudaMalloc(&R.dscalar, 16));
        CUDACHECK(cudaMemcpyAsync(R.dscalar, sb, 16, cudaMemcpyHostToDevice, R.stream));
        CUDACHECK(cudaStreamSynchronize(R.stream));  // sb is a stack buffer
        r = ncclRedOpCreatePreMulSum(&ops[i], R.dscalar, (ncclDataType_t)c.dt, ncclScalarDevice, R.comm);
      }
      if (r != ncclSuccess && err.empty())
        err = std::string("ncclRedOpCreatePreMulSum: ") + ncclGetErrorString(r) + " / " + ncclGetLastError(R.comm);
    }
  }

  // 2. The collective: every local rank inside one group.
  if (err.empty()) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) err = std::string("ncclGroupStart: ") + ncclGetErrorString(r);
    for (size_t i = 0; i < C.local.size() && err.empty(); i++) {
      Rank& R = C.local[i];
      std::string what;
      ncclResult_t e = issue(c, R, ptrsOf(c, R), ops[i], what);
      if (e != ncclSuccess) {
        char b[512];
        snprintf(b, sizeof b, "%s (rank %d): %s / %s", what.c_str(), R.rank, ncclGetErrorString(e), ncclGetLastError(R.comm));
        err = b;
      }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && err.empty()) err = std::string("ncclGroupEnd: ") + ncclGetErrorString(r) + " / " + ncclGetLastError(NULL);
  }
  if (!syncAll(g.caseTimeoutS)) hangExit();
  for (size_t i = 0; i < C.local.size(); i++)
    if ((int)ops[i] >= (int)ncclNumOps) {
      ncclResult_t r = ncclRedOpDestroy(ops[i], C.local[i].comm);
      if (r != ncclSuccess && err.empty()) err = std::string("ncclRedOpDestroy: ") + ncclGetErrorString(r);
    }

  // 3. Verify.
  std::vector<Mismatch> mm;
  unsigned long long wrong = 0;
  if (err.empty()) wrong = checkCase(c, mm);
  bool fail = wrong > 0 || !err.empty();
  gStats.cases++;
  gCollStats[c.coll].cases++;
  if (fail) { gStats.failed++; gCollStats[c.coll].failed++; }
  if (!err.empty()) { gStats.errors++; gCollStats[c.coll].errors++; }
  gStats.wrong += wrong;
  gCollStats[c.coll].wrong += wrong;
  if (fail || g.verbose) {
    printf("%s%s wrong=%llu %s\n", C.tag.c_str(), desc.c_str(), wrong, !err.empty() ? "ERROR" : fail ? "FAIL" : "ok");
    if (!err.empty()) printf("%s    error: %s\n", C.tag.c_str(), err.c_str());
    for (size_t i = 0; i < mm.size() && (int)i < g.maxPrint; i++)
      printf("%s    rank %d [%zu]: %s\n", C.tag.c_str(), mm[i].rank, mm[i].idx, mm[i].text.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// The matrix (identical order in every process, so multi-process runs stay in lockstep)
// ---------------------------------------------------------------------------------------------
static std::vector<Case> buildMatrix() {
  std::vector<Case> v;
  const int n = C.nranks;
  uint64_t idx = 0;
  auto push = [&](int coll, int dt, int opk, int ip, int root, size_t count, int offS, int offR, const char* note) {
    Case c{coll, dt, opk, ip, root, offS, offR, count, mix64(g.seed * 1000003ULL + idx++), note};
    v.push_back(c);
  };
  auto roots = [&](int coll) {
    std::vector<int> r;
    if (coll == C_SENDRECV) {
      if (n == 1) r.push_back(0);
      for (int s = 1; s < n; s++)
        if (g.rootsAll || s == 1 || s == n - 1) r.push_back(s);
    } else if (collRooted(coll)) {
      for (int q = 0; q < n; q++)
        if (g.rootsAll || q == 0 || q == n - 1) r.push_back(q);
    } else r.push_back(-1);
    return r;
  };
  auto dtOk = [&](int dt) { return (g.dtMask >> dt & 1) && (dt < ncclFloat8e4m3 || C.fp8); };
  auto bigOk = [&](int dt) {  // quick: 1M+3 only for a few dtypes
    return !g.quick || dt == ncclFloat32 || dt == ncclBfloat16 || dt == ncclInt8;
  };
  for (int coll = 0; coll < NCOLLS; coll++) {
    if (!(g.collMask >> coll & 1)) continue;
    for (int dt = 0; dt < NDTYPES; dt++) {
      if (!dtOk(dt)) continue;
      std::vector<int> ops;
      if (collReduces(coll)) {
        for (int o = 0; o < NOPKINDS; o++) {
          if (!(g.opMask >> o & 1)) continue;
          // quick: all 7 ops for AllReduce, a representative 5 for Reduce / ReduceScatter
          if (g.quick && !g.opSet && coll != C_ALLREDUCE && (o == OP_MIN || o == OP_PMS_HOST)) continue;
          ops.push_back(o);
        }
      } else ops.push_back(OP_SUM);
      for (int o : ops)
        for (int ip = 0; ip < 2; ip++) {
          if (ip ? !collHasInplace(coll) : !collHasOop(coll)) continue;
          for (int root : roots(coll))
            for (size_t cnt : g.counts) {
              if (cnt >= (1u << 20) && !bigOk(dt)) continue;
              push(coll, dt, o, ip, root, cnt, 0, 0, nullptr);
            }
        }
    }
    // Unaligned: buffers offset by one element (out-of-place: send +1, recv +2 so the two are
    // also misaligned relative to each other; in-place: the one buffer +1).
    if (g.unaligned)
      for (int dt = 0; dt < NDTYPES; dt++) {
        if (!dtOk(dt)) continue;
        int root = coll == C_SENDRECV ? (n > 1 ? 1 : 0) : collRooted(coll) ? n - 1 : -1;
        for (int ip = 0; ip < 2; ip++) {
          if (ip ? !collHasInplace(coll) : !collHasOop(coll)) continue;
          for (size_t cnt : {(size_t)1023, (size_t)1048579}) {
            if (cnt >= (1u << 20) && !bigOk(dt)) continue;
            push(coll, dt, OP_SUM, ip, root, cnt, ip ? 1 : 1, ip ? 1 : 2, "unaligned");
          }
        }
      }
    // One large case (float sum, out-of-place): "size" as nccl-tests counts it, i.e. the
    // larger of the per-rank send and recv buffers, is >= largeBytes.
    if (g.largeBytes > 0 && (g.dtMask >> ncclFloat32 & 1)) {
      size_t elems = (g.largeBytes + 3) / 4;
      size_t cnt = elems;
      if (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL || coll == C_GATHER ||
          coll == C_SCATTER || coll == C_ALLPAIRS)
        cnt = (elems + n - 1) / n;
      cnt += 3;
      int root = coll == C_SENDRECV ? (n > 1 ? 1 : 0) : collRooted(coll) ? 0 : -1;
      push(coll, ncclFloat32, OP_SUM, coll == C_BCAST ? 1 : 0, root, cnt, 0, 0, "large");
    }
  }
  return v;
}

static void printTolerances() {
  const char* T = C.tag.c_str();
  printf("%s# tolerance (floats): |got-ref| <= (nranks+2)*eps*mag + 1e-12, mag = sum|x_i*s_i| (sum, avg, premulsum),\n"
         "%s#   |ref| (prod); eps: float64 2^-52, float32 2^-23, float16 2^-10, bfloat16 2^-7, fp8e4m3 2^-3, fp8e5m2 2^-2.\n"
         "%s#   max/min and data movement: exact.  integers: exact (wrapping; avg = wrapped sum / n, C truncation).\n",
         T, T, T);
}

static void testMatrix() {
  std::vector<Case> cases = buildMatrix();
  printf("%s# matrix: %zu cases, nranks=%d, quick=%d, fp8=%d, large=%zu B\n", C.tag.c_str(), cases.size(), C.nranks,
         (int)g.quick, (int)C.fp8, g.largeBytes);
  printTolerances();
  fflush(stdout);
  int lastColl = -1;
  double t0 = nowS();
  for (auto& c : cases) {
    if (c.coll != lastColl) {
      if (lastColl >= 0)
        printf("%s# %s done: %ld cases, %ld failed (%.1f s)\n", C.tag.c_str(), kCollName[lastColl], gCollStats[lastColl].cases,
               gCollStats[lastColl].failed, nowS() - t0);
      lastColl = c.coll;
      t0 = nowS();
    }
    runCase(c);
    fflush(stdout);
  }
  if (lastColl >= 0)
    printf("%s# %s done: %ld cases, %ld failed (%.1f s)\n", C.tag.c_str(), kCollName[lastColl], gCollStats[lastColl].cases,
           gCollStats[lastColl].failed, nowS() - t0);
  // Large buffers are not needed by the other tests.
  freeBufs();
}

// ---------------------------------------------------------------------------------------------
// CUDA graph: capture one AllReduce per rank stream, replay with fresh inputs.
// ---------------------------------------------------------------------------------------------
static bool testGraph() {
  const int n = C.nranks;
  // Collectives whose buffers hold a block per rank take count / n per block. SendRecv shifts by
  // n / 2, so with 4 ranks or more it reaches a rank that is not a ring neighbour.
  Layout L1 = layoutOf(Case{g.graphColl, ncclFloat32, OP_SUM, 0, 0, 0, 0, 1, 0, ""}, n);
  const size_t cnt = std::max<size_t>(1, (L1.sendExt > 1 || L1.recvExt > 1) ? g.graphCount / n : g.graphCount);
  const int root = g.graphColl == C_SENDRECV ? std::max(1, n / 2) : collRooted(g.graphColl) ? n - 1 : -1;
  Case c{g.graphColl, ncclFloat32, OP_SUM, 0, root, 0, 0, cnt, 0, "graph"};
  Layout L = layoutOf(c, n);
  size_t rTotal = 2 * GUARD + L.rExt * 4, sTotal = 2 * GUARD + L.sendExt * 4;
  for (auto& R : C.local) ensureCap(R, sTotal, rTotal);
  printf("%s# graph: %s float sum count=%zu, %d replays\n", C.tag.c_str(), kCollName[c.coll], cnt, g.graphIters);
  std::vector<cudaGraph_t> graphs(C.local.size());
  std::vector<cudaGraphExec_t> execs(C.local.size());
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    CUDACHECK(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  }
  std::string err;
  NCCLCHECK(ncclGroupStart());
  for (auto& R : C.local) {
    std::string what;
    ncclResult_t r = issue(c, R, ptrsOf(c, R), ncclSum, what);
    if (r != ncclSuccess && err.empty()) err = what + " during capture: " + ncclGetErrorString(r) + " / " + ncclGetLastError(R.comm);
  }
  ncclResult_t ge = ncclGroupEnd();
  if (ge != ncclSuccess && err.empty()) err = std::string("ncclGroupEnd during capture: ") + ncclGetErrorString(ge);
  // End every capture before instantiating any graph: instantiation is not allowed while another
  // stream is still capturing in global mode.
  std::vector<bool> captured(C.local.size(), false);
  for (size_t i = 0; i < C.local.size(); i++) {
    Rank& R = C.local[i];
    CUDACHECK(cudaSetDevice(R.dev));
    cudaError_t e = cudaStreamEndCapture(R.stream, &graphs[i]);
    if (e != cudaSuccess) { if (err.empty()) err = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e); continue; }
    captured[i] = true;
  }
  for (size_t i = 0; i < C.local.size(); i++) {
    if (!captured[i]) continue;
    CUDACHECK(cudaSetDevice(C.local[i].dev));
    cudaError_t e = cudaGraphInstantiate(&execs[i], graphs[i], 0);
    if (e != cudaSuccess && err.empty()) err = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
  }
  if (!err.empty()) {
    printf("%sgraph: ERROR %s\n%sGRAPH: FAIL\n", C.tag.c_str(), err.c_str(), C.tag.c_str());
    return false;
  }
  unsigned long long totalWrong = 0;
  int badReplays = 0;
  for (int it = 0; it < g.graphIters; it++) {
    c.seed = mix64(g.seed * 7919ULL + 1000 + it);
    snprintf(gCurCase, sizeof gCurCase, "graph replay %d", it);
    for (size_t i = 0; i < C.local.size(); i++) {
      Rank& R = C.local[i];
      CUDACHECK(cudaSetDevice(R.dev));
      CUDACHECK(cudaMemsetAsync(R.rbuf, POISON, rTotal, R.stream));
      Ptrs p = ptrsOf(c, R);
      // Same stream: ordered before the replay.
      if (rankHasInput(c, R.rank)) launchGen(p.send, L.sendExt, ncclFloat32, VC_SUM, c.seed, R.rank, 0, R.stream);
      CUDACHECK(cudaGraphLaunch(execs[i], R.stream));
    }
    if (!syncAll(g.caseTimeoutS)) hangExit();
    std::vector<Mismatch> mm;
    unsigned long long w = checkCase(c, mm);
    totalWrong += w;
    if (w) {
      badReplays++;
      printf("%sgraph replay %d: wrong=%llu FAIL\n", C.tag.c_str(), it, w);
      for (size_t k = 0; k < mm.size() && (int)k < g.maxPrint; k++)
        printf("%s    rank %d [%zu]: %s\n", C.tag.c_str(), mm[k].rank, mm[k].idx, mm[k].text.c_str());
    }
  }
  for (size_t i = 0; i < C.local.size(); i++) {
    CUDACHECK(cudaSetDevice(C.local[i].dev));
    CUDACHECK(cudaGraphExecDestroy(execs[i]));
    CUDACHECK(cudaGraphDestroy(graphs[i]));
  }
  freeBufs();
  bool ok = badReplays == 0;
  printf("%sGRAPH: %s (%d replays, %d bad, %llu wrong elements)\n", C.tag.c_str(), ok ? "PASS" : "FAIL", g.graphIters,
         badReplays, totalWrong);
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Leak: repeated init / allreduce / destroy must not lose device memory.
// ---------------------------------------------------------------------------------------------
static bool testLeak() {
  std::vector<int> udev;
  for (auto& R : C.local)
    if (std::find(udev.begin(), udev.end(), R.dev) == udev.end()) udev.push_back(R.dev);
  auto freeMem = [&](std::vector<size_t>& f, std::vector<size_t>* tot) {
    f.resize(udev.size());
    if (tot) tot->resize(udev.size());
    for (size_t i = 0; i < udev.size(); i++) {
      CUDACHECK(cudaSetDevice(udev[i]));
      CUDACHECK(cudaDeviceSynchronize());
      size_t fr, to;
      CUDACHECK(cudaMemGetInfo(&fr, &to));
      f[i] = fr;
      if (tot) (*tot)[i] = to;
    }
  };
  Case c{C_ALLREDUCE, ncclFloat32, OP_SUM, 0, -1, 0, 0, 4099, 0, "leak"};
  size_t total = 2 * GUARD + c.count * 4;
  for (auto& R : C.local) ensureCap(R, total, total);
  std::vector<size_t> before, after1, afterN, tot;
  freeMem(before, &tot);
  printf("%s# leak: %d x (init, allreduce, destroy)\n", C.tag.c_str(), g.leakIters);
  unsigned long long wrong = 0;
  double tInit = 0;
  for (int it = 0; it < g.leakIters; it++) {
    snprintf(gCurCase, sizeof gCurCase, "leak iteration %d", it);
    tInit += initComms(1 + it);
    c.seed = mix64(g.seed * 31ULL + it);
    for (auto& R : C.local) {
      CUDACHECK(cudaSetDevice(R.dev));
      CUDACHECK(cudaMemsetAsync(R.rbuf, POISON, total, R.stream));
      launchGen(ptrsOf(c, R).send, c.count, ncclFloat32, VC_SUM, c.seed, R.rank, 0, R.stream);
    }
    NCCLCHECK(ncclGroupStart());
    for (auto& R : C.local) {
      Ptrs p = ptrsOf(c, R);
      NCCLCHECK(ncclAllReduce(p.send, p.recv, c.count, ncclFloat32, ncclSum, R.comm, R.stream));
    }
    NCCLCHECK(ncclGroupEnd());
    if (!syncAll(g.caseTimeoutS)) hangExit();
    std::vector<Mismatch> mm;
    wrong += checkCase(c, mm);
    destroyComms();
    if (it == 0) freeMem(after1, nullptr);
  }
  freeMem(afterN, nullptr);
  bool ok = wrong == 0;
  for (size_t i = 0; i < udev.size(); i++) {
    // Allowed: 1% of the device or 64 MB overall (one-time module loads), and at most 32 MB of
    // growth between the first and the last iteration (a per-iteration leak).
    long long thr = std::max((long long)(tot[i] / 100), 64LL << 20);
    long long lost = (long long)before[i] - (long long)afterN[i];
    long long growth = (long long)after1[i] - (long long)afterN[i];
    bool dok = lost <= thr && growth <= (32LL << 20);
    ok &= dok;
    printf("%sleak dev %d: free before %.1f MB, after 1 iter %.1f MB, after %d iters %.1f MB: lost %.1f MB (limit %.1f), "
           "growth since iter 1 %.1f MB (limit 32) %s\n",
           C.tag.c_str(), udev[i], before[i] / 1048576.0, after1[i] / 1048576.0, g.leakIters, afterN[i] / 1048576.0,
           lost / 1048576.0, thr / 1048576.0, growth / 1048576.0, dok ? "ok" : "FAIL");
  }
  printf("%s# leak: mean init time %.3f s\n", C.tag.c_str(), tInit / std::max(1, g.leakIters));
  printf("%sLEAK: %s (%llu wrong elements)\n", C.tag.c_str(), ok ? "PASS" : "FAIL", wrong);
  freeBufs();
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Watchdog: a collective that can never complete must surface as an async error, and abort
// must return promptly.
// ---------------------------------------------------------------------------------------------
static bool testWatchdog() {
  const char* T = C.tag.c_str();
  const size_t cnt0 = 1024, cntOther = 2048;
  const bool never = g.wdMode != "mismatch";
  printf("%s# watchdog: NCCL_WATCHDOG_TIMEOUT_MS=%s, rank 0 AllReduce count %zu, others %s\n", T,
         getenv("NCCL_WATCHDOG_TIMEOUT_MS") ? getenv("NCCL_WATCHDOG_TIMEOUT_MS") : "(unset)", cnt0,
         never ? "never call" : "count 2048");
  size_t total = 2 * GUARD + cntOther * 4;
  for (auto& R : C.local) ensureCap(R, total, total);
  bool hasVictim = false;
  std::string callErr;
  NCCLCHECK(ncclGroupStart());
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    ncclResult_t r = ncclSuccess;
    if (R.rank == 0) { hasVictim = true; r = ncclAllReduce(R.sbuf, R.rbuf, cnt0, ncclFloat32, ncclSum, R.comm, R.stream); }
    else if (!never) r = ncclAllReduce(R.sbuf, R.rbuf, cntOther, ncclFloat32, ncclSum, R.comm, R.stream);
    if (r != ncclSuccess) callErr = ncclGetErrorString(r);
  }
  ncclResult_t ge = ncclGroupEnd();
  if (ge != ncclSuccess) callErr += std::string(" groupEnd: ") + ncclGetErrorString(ge);
  if (!callErr.empty()) printf("%swatchdog: the call itself returned an error: %s\n", T, callErr.c_str());

  bool detected = false;
  double t0 = nowS(), tDet = -1;
  ncclResult_t seen = ncclSuccess;
  if (hasVictim || !never) {
    while (nowS() - t0 < g.wdPollS && !detected) {
      for (auto& R : C.local) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(R.comm, &st);
        if (r != ncclSuccess) { seen = r; detected = true; break; }
        if (st != ncclSuccess && st != ncclInProgress) { seen = st; detected = true; break; }
      }
      if (!detected) usleep(10000);
    }
    if (detected) tDet = nowS() - t0;
  } else {
    // A bystander process (procs/mpi mode): stay alive while rank 0 waits for its timeout.
    double wait = std::min(g.wdPollS, 3.0 * g.wdTimeoutMs / 1000.0 + 5.0);
    usleep((useconds_t)(wait * 1e6));
  }
  printf("%swatchdog: async error %s after %.2f s (%s)\n", T, detected ? "seen" : "NOT seen", detected ? tDet : nowS() - t0,
         detected ? ncclGetErrorString(seen) : "-");
  fflush(stdout);
  // ferronickel pools a hang report round the ring when its watchdog fires (a WARN line naming the
  // rank that never entered the collective): give it a moment before the abort stops the watchers.
  if (detected) usleep(500000);

  // Abort in a helper thread so a hanging abort cannot hang the checker.
  std::atomic<int> done{0};
  std::atomic<int> abortRes{0};
  double ta = nowS();
  std::thread th([&] {
    for (auto& R : C.local) {
      cudaSetDevice(R.dev);
      ncclResult_t r = ncclCommAbort(R.comm);
      if (r != ncclSuccess) abortRes = (int)r;
    }
    done = 1;
  });
  while (!done && nowS() - ta < g.wdAbortS) usleep(10000);
  if (!done) {
    printf("%swatchdog: ncclCommAbort did not return within %.0f s\n%sWATCHDOG: FAIL\n", T, g.wdAbortS, T);
    fflush(stdout);
    _exit(1);  // the abort thread is stuck; do not wait for it
  }
  th.join();
  double tAbort = nowS() - ta;
  for (auto& R : C.local) R.comm = nullptr;
  bool ok = (detected || (!hasVictim && never)) && abortRes == 0 && tAbort <= 5.0;
  printf("%swatchdog: ncclCommAbort returned %s in %.2f s\n", T, ncclGetErrorString((ncclResult_t)abortRes.load()), tAbort);
  printf("%sWATCHDOG: %s\n", T, ok ? "PASS" : "FAIL");
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------
static void printSummaryAndExit(int code) {
  const char* T = C.tag.c_str();
  printf("%s\n%s==================== SUMMARY ====================\n", T, T);
  printf("%s%-14s %8s %8s %8s %14s\n", T, "collective", "cases", "failed", "errors", "wrong elems");
  for (int c = 0; c < NCOLLS; c++)
    if (gCollStats[c].cases)
      printf("%s%-14s %8ld %8ld %8ld %14llu\n", T, kCollName[c], gCollStats[c].cases, gCollStats[c].failed,
             gCollStats[c].errors, gCollStats[c].wrong);
  printf("%s%-14s %8ld %8ld %8ld %14llu\n", T, "TOTAL", gStats.cases, gStats.failed, gStats.errors, gStats.wrong);
  printf("%sSUMMARY cases=%ld failed=%ld errors=%ld wrong=%llu\n", T, gStats.cases, gStats.failed, gStats.errors, gStats.wrong);
  if (code == 0 && (gStats.failed || gStats.wrong)) code = 1;
  printf("%sRESULT: %s\n", T, code == 0 ? "PASS" : "FAIL");
  fflush(stdout);
  fflush(stderr);
  _exit(code);  // _exit: no static destructors racing library threads
}

// Runs the selected tests for the ranks in C.local; returns the exit code.
static int runTests() {
  signal(SIGALRM, onAlarm);
  alarm(g.timeoutS);
  libInfo();
  // fp8 needs compute capability >= 9.0 on every device used.
  int minCC = 1000;
  for (int d : C.devs) {
    int ma = 0, mi = 0;
    CUDACHECK(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, d));
    CUDACHECK(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, d));
    minCC = std::min(minCC, ma * 10 + mi);
  }
#ifdef CHECK_MPI
  if (g.mode == "mpi") MPI_Allreduce(MPI_IN_PLACE, &minCC, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#endif
  C.fp8 = minCC >= 90;
  for (auto& R : C.local) {
    CUDACHECK(cudaSetDevice(R.dev));
    CUDACHECK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  }
  bool ok = true;
  if (g.tLeak) ok &= testLeak();  // first: it owns the communicators' whole lifetime
  if (g.tMatrix || g.tGraph || g.tWatchdog) {
    snprintf(gCurCase, sizeof gCurCase, "communicator init");
    double t = initComms(0);
    printf("%s# communicator init: %.3f s (%d ranks, devices", C.tag.c_str(), t, C.nranks);
    for (int d : C.devs) printf(" %d", d);
    printf(")\n");
    fflush(stdout);
    if (g.tMatrix) testMatrix();
    if (g.tGraph) ok &= testGraph();
    if (g.tWatchdog) ok &= testWatchdog();  // last: it aborts the communicators
    else destroyComms();
  }
  return ok ? 0 : 1;
}

static int finish(int code) {
#ifdef CHECK_MPI
  if (g.mode == "mpi") {
    long v[3] = {gStats.cases, gStats.failed, (long)gStats.wrong};
    long s[3];
    int c = code, cmax = 0;
    MPI_Allreduce(v, s, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&c, &cmax, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (C.mpiRank == 0)
      printf("OVERALL (all %d ranks): cases=%ld failed=%ld wrong=%ld RESULT: %s\n", C.nranks, s[0], s[1], s[2],
             (cmax == 0 && s[1] == 0 && s[2] == 0) ? "PASS" : "FAIL");
    fflush(stdout);
    MPI_Finalize();
  }
#endif
  printSummaryAndExit(code);
  return code;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  parseArgs(argc, argv);
  // Only the watchdog test shortens the device-side wait (before any NCCL call, so forked
  // children and cached parameters see it).
  if (g.tWatchdog) {
    char b[32];
    snprintf(b, sizeof b, "%d", g.wdTimeoutMs);
    setenv("NCCL_WATCHDOG_TIMEOUT_MS", b, 0);
  }

  if (g.dryRun) {  // case counts per collective, no CUDA (plan a run's length)
    if (g.devs.empty()) { fprintf(stderr, "--dry-run needs --devs\n"); return 2; }
    C.nranks = (int)g.devs.size();
    C.fp8 = true;
    std::vector<Case> v = buildMatrix();
    long per[NCOLLS] = {0}, big = 0;
    for (auto& c : v) { per[c.coll]++; big += c.count >= (1u << 20); }
    for (int c = 0; c < NCOLLS; c++) if (per[c]) printf("%-14s %6ld cases\n", kCollName[c], per[c]);
    printf("total %zu cases (%ld with count >= 1M), nranks %d\n", v.size(), big, C.nranks);
    return 0;
  }
  if (g.mode == "threads") {
    if (g.devs.empty()) {
      int nd = 0;
      CUDACHECK(cudaGetDeviceCount(&nd));
      for (int d = 0; d < nd; d++) g.devs.push_back(d);
    }
    C.nranks = (int)g.devs.size();
    C.devs = g.devs;
    C.local.resize(C.nranks);
    for (int r = 0; r < C.nranks; r++) { C.local[r].rank = r; C.local[r].dev = g.devs[r]; }
    printf("# check: mode threads, %d ranks\n", C.nranks);
    return finish(runTests());
  }

  if (g.mode == "procs") {
    if (g.devs.empty()) { fprintf(stderr, "--mode procs needs --devs (no CUDA call is allowed before fork)\n"); return 2; }
    if (g.hosts < 0 || g.hosts > (int)g.devs.size()) { fprintf(stderr, "--hosts %d: 1 to %d\n", g.hosts, (int)g.devs.size()); return 2; }
    if (g.hosts > 0 && getenv("NCCL_HOSTID")) { fprintf(stderr, "--hosts sets NCCL_HOSTID per child: unset it\n"); return 2; }
    if (g.uts && g.hosts <= 0) { fprintf(stderr, "--uts needs --hosts\n"); return 2; }
    C.nranks = (int)g.devs.size();
    C.devs = g.devs;
    // Unique ids first, before any CUDA call: id 0 for the main communicator, 1..N for --leak.
    int nids = 1 + (g.tLeak ? g.leakIters : 0);
    C.ids.resize(nids);
    for (int i = 0; i < nids; i++) NCCLCHECK(ncclGetUniqueId(&C.ids[i]));
    printf("# check: mode procs, %d ranks (one process each)%s\n", C.nranks,
           g.hosts > 0 ? (g.uts ? ", split into hosts by host name (a UTS namespace each)" : ", split into hosts by NCCL_HOSTID") : "");
    fflush(stdout);
    fflush(stderr);
    std::vector<pid_t> pids(C.nranks, -1);
    for (int r = 0; r < C.nranks; r++) {
      pid_t p = fork();
      if (p < 0) { perror("fork"); return 3; }
      if (p == 0) {
        char t[16];
        snprintf(t, sizeof t, "r%d ", r);
        C.tag = t;
        C.local.resize(1);
        C.local[0].rank = r;
        C.local[0].dev = g.devs[r];
        if (g.hosts > 0) {
          // Contiguous ranks share a host. Set before the child's first NCCL call that reads it
          // (the library reads NCCL_HOSTID once per process, at its first communicator's init;
          // the parent only made unique ids).
          char h[32];
          snprintf(h, sizeof h, "fnhost%d", r * g.hosts / C.nranks);
          if (!g.uts) {
            setenv("NCCL_HOSTID", h, 1);
          } else if (unshare(CLONE_NEWUTS) != 0 || sethostname(h, strlen(h)) != 0) {
            // As production tells hosts apart: host name and boot id (needs CAP_SYS_ADMIN).
            fprintf(stderr, "r%d: cannot take host name %s in a UTS namespace of its own: %s\n", r, h, strerror(errno));
            _exit(3);
          }
        }
        return finish(runTests());
      }
      pids[r] = p;
    }
    // Parent: wait for every child, with a deadline; kill (by pid) whatever is left.
    std::vector<int> codes(C.nranks, -1);
    int left = C.nranks;
    double t0 = nowS();
    while (left > 0) {
      int st;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p > 0) {
        for (int r = 0; r < C.nranks; r++)
          if (pids[r] == p) {
            codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            pids[r] = -1;
            left--;
          }
        continue;
      }
      if (nowS() - t0 > g.timeoutS + 30) {
        for (int r = 0; r < C.nranks; r++)
          if (pids[r] > 0) { printf("# killing rank %d (pid %d): past the deadline\n", r, (int)pids[r]); kill(pids[r], SIGKILL); }
        t0 = nowS() - g.timeoutS;  // then reap them
        continue;
      }
      usleep(20000);
    }
    int worst = 0;
    for (int r = 0; r < C.nranks; r++) {
      printf("# rank %d exit code %d\n", r, codes[r]);
      if (codes[r] != 0 && worst == 0) worst = codes[r];
    }
    printf("OVERALL (procs, %d ranks): RESULT: %s\n", C.nranks, worst == 0 ? "PASS" : "FAIL");
    return worst == 0 ? 0 : (worst == 124 || worst == 4 ? worst : 1);
  }

#ifdef CHECK_MPI
  if (g.mode == "mpi") {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    C.mpiRank = rank;
    C.nranks = size;
    int nd = 0;
    CUDACHECK(cudaGetDeviceCount(&nd));
    const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    int local = lr ? atoi(lr) : rank;
    C.devs.resize(size);
    for (int r = 0; r < size; r++) C.devs[r] = g.devs.empty() ? (r % nd) : g.devs[r % g.devs.size()];
    char t[16];
    snprintf(t, sizeof t, "r%d ", rank);
    C.tag = t;
    C.local.resize(1);
    C.local[0].rank = rank;
    C.local[0].dev = g.devs.empty() ? local % nd : g.devs[rank % g.devs.size()];
    C.devs[rank] = C.local[0].dev;
    return finish(runTests());
  }
#endif
  fprintf(stderr, "unknown or unavailable --mode %s (mpi needs a -DCHECK_MPI build)\n", g.mode.c_str());
  return 2;
}
