// nccl-tests-compatible benchmark (one process, one thread, ncclCommInitAll over the GPUs).
//
// The same binary runs against NVIDIA's libnccl.so.2 and ours (LD_LIBRARY_PATH / LD_PRELOAD), so
// it uses only the public NCCL API.  Output rows have nccl-tests' columns:
//   size count type redop root | out-of-place time algbw busbw #wrong | in-place time algbw busbw #wrong
// busbw factors as nccl-tests: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n
// (size = total bytes); broadcast, reduce, sendrecv 1.
//
// Timing: cudaEvents recorded on every rank's stream around `iters` launches (graph mode: around
// the replays of one graph holding `iters` captured calls); the slowest rank's time / iters.
// Checking (-c 1, default): after timing, one more call with fresh inputs, compared on the device
// with the same generator/tolerance as tests/gpu/check.cu.
#include "../tests/gpu/common.cuh"
#include "size_arg.h"

#include <dlfcn.h>
#include <signal.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

enum BColl { B_ALLREDUCE = 0, B_ALLGATHER, B_REDUCESCATTER, B_BROADCAST, B_REDUCE, B_SENDRECV, B_ALLTOALL, NBCOLLS };
static const char* kBName[NBCOLLS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv", "alltoall"};

struct BOpts {
  size_t minBytes = 8, maxBytes = 128 << 20;
  double factor = 2;
  size_t stepBytes = 0;
  int iters = 20, warmup = 5;
  int dt = ncclFloat32;
  int opk = OP_SUM;
  int root = 0;
  int graphReplays = 0;
  int check = 1;
  int ngpus = -1;
  std::vector<int> devs;
  int coll = B_ALLREDUCE;
  int timeoutS = 600;
};
static BOpts o;

static void usage() {
  printf(
      "usage: nccl_bench [--coll all_reduce|all_gather|reduce_scatter|broadcast|reduce|sendrecv|alltoall]\n"
      "                  [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes] [-n iters] [-w warmup]\n"
      "                  [-d dtype] [-o sum|prod|max|min|avg|premulsum] [-r root] [-G [replays]]\n"
      "                  [-c 0|1] [-g ngpus] [--devs 0,1,..] [--timeout S]\n");
}

static void parse(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto need = [&]() -> const char* {
      if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); }
      return argv[++i];
    };
    if (a == "-b" || a == "--minbytes") o.minBytes = parseSize(need());
    else if (a == "-e" || a == "--maxbytes") o.maxBytes = parseSize(need());
    else if (a == "-f" || a == "--stepfactor") o.factor = atof(need());
    else if (a == "-i" || a == "--stepbytes") o.stepBytes = parseSize(need());
    else if (a == "-n" || a == "--iters") o.iters = atoi(need());
    else if (a == "-w" || a == "--warmup_iters") o.warmup = atoi(need());
    else if (a == "-d" || a == "--datatype") {
      o.dt = dtypeFromName(need());
      if (o.dt < 0) { fprintf(stderr, "unknown dtype\n"); exit(2); }
    } else if (a == "-o" || a == "--op") {
      std::string s = need();
      if (s == "sum") o.opk = OP_SUM;
      else if (s == "prod") o.opk = OP_PROD;
      else if (s == "max") o.opk = OP_MAX;
      else if (s == "min") o.opk = OP_MIN;
      else if (s == "avg") o.opk = OP_AVG;
      else if (s == "premulsum" || s == "mulsum") o.opk = OP_PMS_HOST;
      else { fprintf(stderr, "unknown op %s\n", s.c_str()); exit(2); }
    } else if (a == "-r" || a == "--root") o.root = atoi(need());
    else if (a == "-G" || a == "--cudagraph") {
      // "-G" alone = 1 replay-loop; "-G N" (nccl-tests style) = N graph launches
      o.graphReplays = 1;
      if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') o.graphReplays = atoi(argv[++i]);
    } else if (a == "-c" || a == "--check") o.check = atoi(need());
    else if (a == "-g" || a == "--ngpus") o.ngpus = atoi(need());
    else if (a == "--devs") {
      o.devs.clear();
      std::string s = need();
      size_t p = 0;
      while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        if (q > p) o.devs.push_back(atoi(s.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else if (a == "--coll") {
      std::string s = need();
      o.coll = -1;
      for (int c = 0; c < NBCOLLS; c++) if (s == kBName[c]) o.coll = c;
      if (o.coll < 0) { fprintf(stderr, "unknown collective %s\n", s.c_str()); exit(2); }
    } else if (a == "--timeout") o.timeoutS = atoi(need());
    else if (a == "-t" || a == "-p" || a == "-a" || a == "-m" || a == "-z") need();  // nccl-tests options we ignore
    else if (a == "-h" || a == "--help") { usage(); exit(0); }
    else { fprintf(stderr, "unknown option %s\n", a.c_str()); usage(); exit(2); }
  }
  if (o.graphReplays > 0 && o.graphReplays < 1) o.graphReplays = 1;
}

static void onAlarm(int) {
  const char m[] = "\n# TIMEOUT: nccl_bench exceeded --timeout\n";
  if (write(1, m, sizeof m - 1) < 0) {}
  _exit(124);
}

static double nowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
struct BRank {
  int dev;
  ncclComm_t comm;
  cudaStream_t stream;
  char *sbuf, *rbuf;
  cudaEvent_t ev0, ev1;
  unsigned long long* dWrong;
  ncclRedOp_t op;
};
static std::vector<BRank> R;
static int N;

struct Sizes {
  size_t count;      // the count argument of the call
  size_t sendElems;  // per-rank send buffer
  size_t recvElems;  // per-rank recv buffer
  size_t printBytes;
};

static Sizes sizesFor(size_t bytes) {
  size_t es = kDt[o.dt].size;
  size_t e = bytes / es;
  Sizes s;
  switch (o.coll) {
    case B_ALLGATHER: s.count = e / N; s.sendElems = s.count; s.recvElems = s.count * N; break;
    case B_REDUCESCATTER: s.count = e / N; s.sendElems = s.count * N; s.recvElems = s.count; break;
    case B_ALLTOALL: s.count = e / N; s.sendElems = s.recvElems = s.count * N; break;
    default: s.count = e; s.sendElems = s.recvElems = e; break;
  }
  s.printBytes = std::max(s.sendElems, s.recvElems) * es;
  return s;
}

static bool hasInplace() { return o.coll != B_SENDRECV && o.coll != B_ALLTOALL; }

static void ptrs(int r, const Sizes& s, int inplace, char** sp, char** rp) {
  size_t es = kDt[o.dt].size;
  if (!inplace) { *sp = R[r].sbuf; *rp = R[r].rbuf; return; }
  *rp = R[r].rbuf;
  *sp = R[r].rbuf;
  if (o.coll == B_ALLGATHER) *sp = R[r].rbuf + (size_t)r * s.count * es;
  if (o.coll == B_REDUCESCATTER) *rp = R[r].rbuf + (size_t)r * s.count * es;
}

static void issueAll(const Sizes& s, int inplace) {
  ncclDataType_t dt = (ncclDataType_t)o.dt;
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    char *sp, *rp;
    ptrs(r, s, inplace, &sp, &rp);
    BRank& b = R[r];
    switch (o.coll) {
      case B_ALLREDUCE: NCCLCHECK(ncclAllReduce(sp, rp, s.count, dt, b.op, b.comm, b.stream)); break;
      case B_ALLGATHER: NCCLCHECK(ncclAllGather(sp, rp, s.count, dt, b.comm, b.stream)); break;
      case B_REDUCESCATTER: NCCLCHECK(ncclReduceScatter(sp, rp, s.count, dt, b.op, b.comm, b.stream)); break;
      case B_BROADCAST: NCCLCHECK(ncclBroadcast(sp, rp, s.count, dt, o.root, b.comm, b.stream)); break;
      case B_REDUCE: NCCLCHECK(ncclReduce(sp, rp, s.count, dt, b.op, o.root, b.comm, b.stream)); break;
      case B_SENDRECV:
        NCCLCHECK(ncclSend(sp, s.count, dt, (r + 1) % N, b.comm, b.stream));
        NCCLCHECK(ncclRecv(rp, s.count, dt, (r - 1 + N) % N, b.comm, b.stream));
        break;
      case B_ALLTOALL: NCCLCHECK(ncclAlltoAll(sp, rp, s.count, dt, b.comm, b.stream)); break;
    }
  }
  NCCLCHECK(ncclGroupEnd());
}

static void syncAll() {
  for (auto& b : R) {
    CUDACHECK(cudaSetDevice(b.dev));
    CUDACHECK(cudaStreamSynchronize(b.stream));
  }
}

// Device-side check: expected value of output element k on rank `rank`.
__global__ void checkKernel(const void* out, size_t n, int coll, int dt, int opk, int nranks, uint64_t seed, int rank,
                            size_t count, int root, unsigned long long* wrong) {
  int cls = (coll == B_ALLREDUCE || coll == B_REDUCESCATTER || coll == B_REDUCE) ? valClassFor(opk) : VC_SUM;
  int exact = !(coll == B_ALLREDUCE || coll == B_REDUCESCATTER || coll == B_REDUCE) || opk == OP_MAX || opk == OP_MIN;
  unsigned long long w = 0;
  for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
    RefVal ref;
    ref.iv = 0; ref.dv = 0; ref.mag = 0;
    switch (coll) {
      case B_ALLREDUCE: case B_REDUCE: ref = reduceRef(dt, opk, nranks, seed, k); break;
      case B_REDUCESCATTER: ref = reduceRef(dt, opk, nranks, seed, (uint64_t)rank * count + k); break;
      case B_BROADCAST: genVal(dt, cls, seed, root, k, &ref.iv, &ref.dv); break;
      case B_ALLGATHER: genVal(dt, cls, seed, (int)(k / count), k % count, &ref.iv, &ref.dv); break;
      case B_ALLTOALL: genVal(dt, cls, seed, (int)(k / count), (uint64_t)rank * count + k % count, &ref.iv, &ref.dv); break;
      case B_SENDRECV: genVal(dt, cls, seed, (rank - 1 + nranks) % nranks, k, &ref.iv, &ref.dv); break;
    }
    uint64_t giv = 0;
    double gdv = 0;
    loadVal(out, k, dt, &giv, &gdv);
    if (!valueMatches(dt, exact, nranks, ref, giv, gdv)) w++;
  }
  if (w) atomicAdd(wrong, w);
}

static unsigned long long checkOnce(const Sizes& s, int inplace, uint64_t seed) {
  size_t es = kDt[o.dt].size;
  bool red = o.coll == B_ALLREDUCE || o.coll == B_REDUCESCATTER || o.coll == B_REDUCE;
  int cls = red ? valClassFor(o.opk) : VC_SUM;
  for (int r = 0; r < N; r++) {
    BRank& b = R[r];
    CUDACHECK(cudaSetDevice(b.dev));
    char *sp, *rp;
    ptrs(r, s, inplace, &sp, &rp);
    size_t rext = inplace ? std::max(s.sendElems, s.recvElems) : s.recvElems;
    CUDACHECK(cudaMemsetAsync(R[r].rbuf, 0xA5, rext * es, b.stream));
    bool input = !(o.coll == B_BROADCAST && r != o.root);
    if (input) launchGen(sp, s.sendElems, o.dt, cls, seed, r, 0, b.stream);
    CUDACHECK(cudaMemsetAsync(b.dWrong, 0, sizeof(unsigned long long), b.stream));
  }
  issueAll(s, inplace);
  unsigned long long total = 0;
  for (int r = 0; r < N; r++) {
    BRank& b = R[r];
    CUDACHECK(cudaSetDevice(b.dev));
    if (o.coll == B_REDUCE && r != o.root) continue;
    char *sp, *rp;
    ptrs(r, s, inplace, &sp, &rp);
    if (s.recvElems) {
      size_t blocks = std::min<size_t>((s.recvElems + 255) / 256, 1024);
      checkKernel<<<(unsigned)blocks, 256, 0, b.stream>>>(rp, s.recvElems, o.coll, o.dt, o.opk, N, seed, r, s.count,
                                                          o.root, b.dWrong);
      CUDACHECK(cudaGetLastError());
    }
  }
  for (int r = 0; r < N; r++) {
    BRank& b = R[r];
    CUDACHECK(cudaSetDevice(b.dev));
    unsigned long long w = 0;
    CUDACHECK(cudaMemcpyAsync(&w, b.dWrong, sizeof w, cudaMemcpyDeviceToHost, b.stream));
    CUDACHECK(cudaStreamSynchronize(b.stream));
    total += w;
  }
  return total;
}

// Average time per call in microseconds.
static double timeColl(const Sizes& s, int inplace) {
  for (int i = 0; i < o.warmup; i++) issueAll(s, inplace);
  syncAll();
  std::vector<cudaGraphExec_t> execs;
  if (o.graphReplays > 0) {
    std::vector<cudaGraph_t> graphs(N);
    execs.resize(N);
    for (auto& b : R) {
      CUDACHECK(cudaSetDevice(b.dev));
      CUDACHECK(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeGlobal));
    }
    for (int i = 0; i < o.iters; i++) issueAll(s, inplace);
    // End every capture before instantiating: instantiation is refused while another stream of
    // the process is still capturing in global mode.
    for (int r = 0; r < N; r++) {
      CUDACHECK(cudaSetDevice(R[r].dev));
      CUDACHECK(cudaStreamEndCapture(R[r].stream, &graphs[r]));
    }
    for (int r = 0; r < N; r++) {
      CUDACHECK(cudaSetDevice(R[r].dev));
      CUDACHECK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
      CUDACHECK(cudaGraphDestroy(graphs[r]));
    }
    for (int r = 0; r < N; r++) {  // one warm replay (uploads the graph)
      CUDACHECK(cudaSetDevice(R[r].dev));
      CUDACHECK(cudaGraphLaunch(execs[r], R[r].stream));
    }
    syncAll();
  }
  for (auto& b : R) {
    CUDACHECK(cudaSetDevice(b.dev));
    CUDACHECK(cudaEventRecord(b.ev0, b.stream));
  }
  long calls;
  if (o.graphReplays > 0) {
    for (int k = 0; k < o.graphReplays; k++)
      for (int r = 0; r < N; r++) {
        CUDACHECK(cudaSetDevice(R[r].dev));
        CUDACHECK(cudaGraphLaunch(execs[r], R[r].stream));
      }
    calls = (long)o.graphReplays * o.iters;
  } else {
    for (int i = 0; i < o.iters; i++) issueAll(s, inplace);
    calls = o.iters;
  }
  for (auto& b : R) {
    CUDACHECK(cudaSetDevice(b.dev));
    CUDACHECK(cudaEventRecord(b.ev1, b.stream));
  }
  syncAll();
  float worst = 0;
  for (auto& b : R) {
    float ms = 0;
    CUDACHECK(cudaEventElapsedTime(&ms, b.ev0, b.ev1));
    worst = std::max(worst, ms);
  }
  for (size_t r = 0; r < execs.size(); r++) {
    CUDACHECK(cudaSetDevice(R[r].dev));
    CUDACHECK(cudaGraphExecDestroy(execs[r]));
  }
  return worst * 1000.0 / std::max(1L, calls);
}

static double busFactor() {
  switch (o.coll) {
    case B_ALLREDUCE: return 2.0 * (N - 1) / N;
    case B_ALLGATHER: case B_REDUCESCATTER: case B_ALLTOALL: return (double)(N - 1) / N;
    default: return 1.0;
  }
}

static void fmtTime(char* b, double us) {
  if (us >= 10000.0) sprintf(b, "%7.0f", us);
  else if (us >= 100.0) sprintf(b, "%7.1f", us);
  else sprintf(b, "%7.2f", us);
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  parse(argc, argv);
  signal(SIGALRM, onAlarm);
  alarm(o.timeoutS);
  if (o.devs.empty()) {
    int nd = 0;
    CUDACHECK(cudaGetDeviceCount(&nd));
    int g = o.ngpus > 0 ? o.ngpus : nd;
    for (int d = 0; d < g; d++) o.devs.push_back(d % nd);
  }
  N = (int)o.devs.size();
  if (o.root >= N) o.root = 0;
  int ver = 0;
  NCCLCHECK(ncclGetVersion(&ver));
  Dl_info info;
  const char* path = "?";
  if (dladdr((void*)&ncclGetVersion, &info) && info.dli_fname) path = info.dli_fname;
  printf("# nccl_bench: coll %s, nranks %d, devices", kBName[o.coll], N);
  for (int d : o.devs) printf(" %d", d);
  printf(", dtype %s, op %s, iters %d, warmup %d, graph %d, check %d\n", kDt[o.dt].ntName, kOpName[o.opk], o.iters,
         o.warmup, o.graphReplays, o.check);
  printf("# NCCL version %d, library %s\n", ver, path);
  for (int d : o.devs) {
    cudaDeviceProp p;
    CUDACHECK(cudaGetDeviceProperties(&p, d));
    printf("#  device %d: %s\n", d, p.name);
  }
  // Touch every device first so the init time below is NCCL's, not CUDA context creation.
  for (int d : o.devs) { CUDACHECK(cudaSetDevice(d)); CUDACHECK(cudaFree(0)); }

  R.resize(N);
  std::vector<ncclComm_t> comms(N);
  double t0 = nowS();
  NCCLCHECK(ncclCommInitAll(comms.data(), N, o.devs.data()));
  double tInit = nowS() - t0;
  printf("# ncclCommInitAll: %.3f s\n", tInit);

  size_t es = kDt[o.dt].size;
  Sizes smax = sizesFor(o.maxBytes);
  size_t sb = std::max<size_t>(smax.sendElems * es, 64), rb = std::max<size_t>(std::max(smax.recvElems, smax.sendElems) * es, 64);
  for (int r = 0; r < N; r++) {
    BRank& b = R[r];
    b.dev = o.devs[r];
    b.comm = comms[r];
    CUDACHECK(cudaSetDevice(b.dev));
    CUDACHECK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    CUDACHECK(cudaMalloc(&b.sbuf, sb));
    CUDACHECK(cudaMalloc(&b.rbuf, rb));
    CUDACHECK(cudaMemset(b.sbuf, 0, sb));
    CUDACHECK(cudaMemset(b.rbuf, 0, rb));
    CUDACHECK(cudaEventCreate(&b.ev0));
    CUDACHECK(cudaEventCreate(&b.ev1));
    CUDACHECK(cudaMalloc(&b.dWrong, sizeof(unsigned long long)));
    b.op = (ncclRedOp_t)(o.opk == OP_PMS_HOST ? 0 : o.opk);
    if (o.opk == OP_PMS_HOST) {
      uint64_t iv = 0;
      double dv = 0;
      uint8_t bytes[16] = {0};
      premulScalar(o.dt, OP_PMS_HOST, r, &iv, &dv);
      storeVal(bytes, 0, o.dt, iv, dv);
      NCCLCHECK(ncclRedOpCreatePreMulSum(&b.op, bytes, (ncclDataType_t)o.dt, ncclScalarHostImmediate, b.comm));
    }
  }
  bool red = o.coll == B_ALLREDUCE || o.coll == B_REDUCESCATTER || o.coll == B_REDUCE;
  bool rooted = o.coll == B_BROADCAST || o.coll == B_REDUCE;
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s  %30s  %30s\n", "", "", "", "", "", "out-of-place", "in-place");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  unsigned long long totalWrong = 0;
  double bwSum = 0;
  int bwN = 0;
  uint64_t seed = 1;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
    Sizes s = sizesFor(bytes);
    printf("%12zu  %12zu  %8s  %6s  %6d", s.printBytes, s.printBytes / es, kDt[o.dt].ntName, red ? kOpName[o.opk] : "none",
           rooted ? o.root : -1);
    for (int ip = 0; ip < 2; ip++) {
      if (ip && !hasInplace()) {
        printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      double us = timeColl(s, ip);
      double algbw = us > 0 ? s.printBytes / (us * 1e3) : 0;  // GB/s = bytes / ns
      double busbw = algbw * busFactor();
      char wrong[32] = "N/A";
      if (o.check) {
        unsigned long long w = checkOnce(s, ip, mix64(seed++));
        totalWrong += w;
        snprintf(wrong, sizeof wrong, "%llu", w);
      }
      char ts[32];
      fmtTime(ts, us);
      printf("  %7s  %6.2f  %6.2f  %6s", ts, algbw, busbw, wrong);
      if (!ip) { bwSum += busbw; bwN++; }
    }
    printf("\n");
    size_t next = o.stepBytes ? bytes + o.stepBytes : (size_t)(bytes * o.factor);
    if (next <= bytes) break;
    bytes = next;
  }
  printf("# Out of bounds values : %llu %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g\n", bwN ? bwSum / bwN : 0.0);
  printf("#\n");
  for (auto& b : R) {
    CUDACHECK(cudaSetDevice(b.dev));
    if (o.opk == OP_PMS_HOST) NCCLCHECK(ncclRedOpDestroy(b.op, b.comm));
    CUDACHECK(cudaStreamSynchronize(b.stream));
  }
  for (auto& b : R) NCCLCHECK(ncclCommDestroy(b.comm));
  for (auto& b : R) {
    CUDACHECK(cudaSetDevice(b.dev));
    CUDACHECK(cudaFree(b.sbuf));
    CUDACHECK(cudaFree(b.rbuf));
    CUDACHECK(cudaFree(b.dWrong));
    CUDACHECK(cudaEventDestroy(b.ev0));
    CUDACHECK(cudaEventDestroy(b.ev1));
    CUDACHECK(cudaStreamDestroy(b.stream));
  }
  fflush(stdout);
  return totalWrong ? 1 : 0;
}
