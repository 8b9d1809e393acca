// Standalone GPU check of the ring kernels, without the Rust host: n ranks simulated on ONE GPU
// (each rank's launch on its own stream, all CTAs co-resident), FIFOs in device memory.
//   nvcc -O2 -std=c++17 -arch=sm_90 -I kernels kernels/tests/ring_test.cu -o ring_test && ./ring_test
// Values are small integers so every reduction order gives the exact same result.
#include "../collectives.cu"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <unistd.h>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(2); } } while (0)

typedef void (*Kern)(fnKernelArgs);
static int failures = 0, checks = 0;

struct World {
  int n, nCh, slot;
  std::vector<fnDevComm*> dcomm;
  std::vector<cudaStream_t> streams;
  uint32_t *abortH, *errorH;  // host-mapped, one per rank
  World(int n_, int nCh_, int slot_, uint64_t timeoutNs = 0) : n(n_), nCh(nCh_), slot(slot_) {
    CK(cudaHostAlloc(&abortH, 4 * n, cudaHostAllocMapped));
    CK(cudaHostAlloc(&errorH, 4 * n, cudaHostAllocMapped));
    memset(abortH, 0, 4 * n); memset(errorH, 0, 4 * n);
    // Ring order per channel: identity on even channels, reversed on odd ones (exercises userRanks).
    std::vector<int*> userRanks(nCh);
    std::vector<std::vector<int>> order(nCh, std::vector<int>(n));
    for (int c = 0; c < nCh; c++) {
      for (int p = 0; p < n; p++) order[c][p] = c % 2 ? n - 1 - p : p;
      CK(cudaMalloc(&userRanks[c], 4 * n));
      CK(cudaMemcpy(userRanks[c], order[c].data(), 4 * n, cudaMemcpyHostToDevice));
    }
    // A FIFO for every ordered pair and channel (ring and p2p share them, as on the host).
    std::vector<std::vector<fnConn>> conns(n, std::vector<fnConn>(n * FN_MAX_CHANNELS));
    for (int a = 0; a < n; a++) for (int b = 0; b < n; b++) for (int c = 0; c < nCh; c++) {
      if (a == b) continue;
      char* buff; uint64_t* ctr;
      CK(cudaMalloc(&buff, size_t(FN_NSTEPS) * slot));
      CK(cudaMalloc(&ctr, 16)); CK(cudaMemset(ctr, 0, 16));
      fnConnSend s{buff, ctr, ctr + 1, 0};           // a sends to b
      fnConnRecv r{buff, ctr, ctr + 1, 0};           // b receives from a
      conns[a][b * FN_MAX_CHANNELS + c].send = s;
      conns[b][a * FN_MAX_CHANNELS + c].recv = r;
    }
    for (int r = 0; r < n; r++) {
      fnDevComm h{};
      h.rank = r; h.nRanks = n; h.nChannels = nCh; h.slotBytes = slot;
      for (int c = 0; c < nCh; c++) {
        int pos = 0;
        while (order[c][pos] != r) pos++;
        h.rings[c] = fnRing{order[c][(pos + n - 1) % n], order[c][(pos + 1) % n], pos, 0, userRanks[c]};
      }
      CK(cudaMalloc(&h.conns, sizeof(fnConn) * n * FN_MAX_CHANNELS));
      CK(cudaMemcpy(h.conns, conns[r].data(), sizeof(fnConn) * n * FN_MAX_CHANNELS, cudaMemcpyHostToDevice));
      uint32_t *ad, *ed;
      CK(cudaHostGetDevicePointer((void**)&ad, abortH + r, 0));
      CK(cudaHostGetDevicePointer((void**)&ed, errorH + r, 0));
      h.abortFlag = ad; h.errorFlag = ed; h.timeoutNs = timeoutNs;
      fnDevComm* d; CK(cudaMalloc(&d, sizeof h)); CK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
      dcomm.push_back(d);
      cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); streams.push_back(st);
    }
  }
  // works[r] for rank r; grid = nCh for collectives, `grid` for p2p.
  void launch(Kern k, const std::vector<std::vector<fnWork>>& works, int grid, int skipRank = -1) {
    for (int r = 0; r < n; r++) {
      if (r == skipRank) continue;
      fnKernelArgs a{};
      a.comm = dcomm[r]; a.nWorks = int(works[r].size());
      for (size_t i = 0; i < works[r].size(); i++) a.works[i] = works[r][i];
      void* p[] = {&a};
      CK(cudaLaunchKernel((const void*)k, dim3(grid), dim3(FN_NTHREADS), p, 0, streams[r]));
    }
  }
  void sync() { for (auto s : streams) CK(cudaStreamSynchronize(s)); }
};

// Host view of a device type: exact conversions for the small integers we use.
template <typename T> double toD(T x) { return double(x); }
template <> double toD(__half x) { return __half2float(x); }
template <> double toD(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> double toD(__nv_fp8_e4m3 x) { return float(x); }
template <> double toD(__nv_fp8_e5m2 x) { return float(x); }
template <typename T> T fromD(double x) { return T(x); }
template <> __half fromD(double x) { return __float2half(float(x)); }
template <> __nv_bfloat16 fromD(double x) { return __float2bfloat16(float(x)); }
template <> __nv_fp8_e4m3 fromD(double x) { return __nv_fp8_e4m3(float(x)); }
template <> __nv_fp8_e5m2 fromD(double x) { return __nv_fp8_e5m2(float(x)); }

// Input of rank r at element i: small values (signed types may be negative; prod stays tiny).
template <typename T> T inputVal(int r, size_t i, int op) {
  const bool sgn = !std::is_integral_v<T> || std::is_signed_v<T>;
  if (op == FN_OP_PROD) return fromD<T>(((r + i) % 3 == 0) ? (sgn ? -1 : 1) : ((r + i) % 3 == 1 ? 1 : 2));
  int v = int((r * 7 + i * 3) % 5);
  return fromD<T>(sgn ? v - 2 : v);
}
template <typename T> T applyOp(T a, T b, int op) {
  if constexpr (std::is_integral_v<T>) {
    switch (op) { case FN_OP_PROD: return T(a * b); case FN_OP_MAX: return a < b ? b : a;
                  case FN_OP_MIN: return b < a ? b : a; default: return T(a + b); }
  } else {
    double x = toD(a), y = toD(b);
    switch (op) { case FN_OP_PROD: return fromD<T>(x * y); case FN_OP_MAX: return fromD<T>(x < y ? y : x);
                  case FN_OP_MIN: return fromD<T>(y < x ? y : x); default: return fromD<T>(x + y); }
  }
}
const double kScalar = 2.0;
template <typename T> T expected(int n, size_t i, int op, int inRank0 = 0) {
  // element i of the reduction over ranks; inRank0 shifts the input index (ReduceScatter blocks).
  auto in = [&](int r) { T v = inputVal<T>(r, i + inRank0, op); return op == FN_OP_PREMULSUM ? applyOp(v, fromD<T>(kScalar), FN_OP_PROD) : v; };
  T acc = in(0);
  for (int r = 1; r < n; r++) acc = applyOp(acc, in(r), op);
  if (op == FN_OP_SUMPOSTDIV) { if constexpr (std::is_integral_v<T>) acc = T(acc / n); }
  return acc;
}
template <typename T> uint64_t scalarBits() { T s = fromD<T>(kScalar); uint64_t b = 0; memcpy(&b, &s, sizeof(T)); return b; }

template <typename T> bool same(T a, T b) { return memcmp(&a, &b, sizeof(T)) == 0 || toD(a) == toD(b); }

template <typename T>
void report(const char* what, int n, size_t count, int op, int extra, size_t bad, size_t firstBad) {
  checks++;
  if (bad) { failures++; printf("FAIL %s sizeof=%zu n=%d count=%zu op=%d extra=%d: %zu wrong (first %zu)\n",
                                what, sizeof(T), n, count, op, extra, bad, firstBad); }
}

// AllReduce / Reduce / ReduceScatter for one (T, op) kernel; off = element offset of user buffers.
template <typename T>
void testReductions(World& w, Kern k, int op, size_t count, int off, bool inPlace) {
  const int n = w.n;
  const size_t rsCount = count;                      // ReduceScatter per-rank count
  const size_t elems = std::max(count, rsCount * n) + off + 16;
  std::vector<T*> sb(n), rb(n);
  for (int r = 0; r < n; r++) { CK(cudaMalloc(&sb[r], elems * sizeof(T))); CK(cudaMalloc(&rb[r], elems * sizeof(T))); }
  auto fill = [&](size_t cnt) {
    for (int r = 0; r < n; r++) {
      std::vector<T> h(elems);
      for (size_t i = 0; i < cnt; i++) h[off + i] = inputVal<T>(r, i, op);
      CK(cudaMemcpy(sb[r], h.data(), elems * sizeof(T), cudaMemcpyHostToDevice));
      CK(cudaMemset(rb[r], 0x7f, elems * sizeof(T)));
    }
  };
  auto work = [&](int type, int r, size_t cnt, int root) {
    fnWork x{}; x.sendbuff = sb[r] + off; x.recvbuff = (inPlace ? sb[r] : rb[r]) + off; x.count = cnt;
    x.type = type; x.root = root; x.op = uint8_t(op); x.scalar = scalarBits<T>(); return x;
  };
  auto out = [&](int r) { std::vector<T> h(elems); CK(cudaMemcpy(h.data(), inPlace ? sb[r] : rb[r], elems * sizeof(T), cudaMemcpyDeviceToHost)); return h; };
  std::vector<std::vector<fnWork>> ws(n);
  // AllReduce
  fill(count);
  for (int r = 0; r < n; r++) ws[r] = {work(FN_WORK_ALLREDUCE, r, count, 0)};
  w.launch(k, ws, w.nCh); w.sync();
  for (int r = 0; r < n; r++) {
    auto h = out(r); size_t bad = 0, fb = 0;
    for (size_t i = 0; i < count; i++) if (!same(h[off + i], expected<T>(n, i, op))) { if (!bad++) fb = i; }
    report<T>(inPlace ? "allreduce-inplace" : "allreduce", n, count, op, off, bad, fb);
  }
  // Reduce to root n-1
  fill(count);
  for (int r = 0; r < n; r++) ws[r] = {work(FN_WORK_REDUCE, r, count, n - 1)};
  w.launch(k, ws, w.nCh); w.sync();
  { auto h = out(n - 1); size_t bad = 0, fb = 0;
    for (size_t i = 0; i < count; i++) if (!same(h[off + i], expected<T>(n, i, op))) { if (!bad++) fb = i; }
    report<T>("reduce", n, count, op, off, bad, fb); }
  // ReduceScatter: input n blocks of rsCount (input index = global index), output my block.
  fill(rsCount * n);
  for (int r = 0; r < n; r++) { ws[r] = {work(FN_WORK_REDUCESCATTER, r, rsCount, 0)};
    if (inPlace) ws[r][0].recvbuff = sb[r] + off + r * rsCount; }
  w.launch(k, ws, w.nCh); w.sync();
  for (int r = 0; r < n; r++) {
    std::vector<T> h(elems); CK(cudaMemcpy(h.data(), inPlace ? sb[r] : rb[r], elems * sizeof(T), cudaMemcpyDeviceToHost));
    size_t base = off + (inPlace ? r * rsCount : 0), bad = 0, fb = 0;
    for (size_t i = 0; i < rsCount; i++) if (!same(h[base + i], expected<T>(n, i, op, int(r * rsCount)))) { if (!bad++) fb = i; }
    report<T>("reducescatter", n, rsCount, op, off, bad, fb);
  }
  for (int r = 0; r < n; r++) { CK(cudaFree(sb[r])); CK(cudaFree(rb[r])); }
}

// Broadcast / AllGather in bytes through fnCopy (as the host does), and Send/Recv/Copy.
void testMovement(World& w, size_t bytes, int off, bool inPlace) {
  const int n = w.n;
  const size_t elems = bytes * n + off + 64;
  std::vector<uint8_t*> sb(n), rb(n);
  for (int r = 0; r < n; r++) { CK(cudaMalloc(&sb[r], elems)); CK(cudaMalloc(&rb[r], elems)); }
  auto val = [](int r, size_t i) { return uint8_t(r * 31 + i * 7 + 1); };
  auto fill = [&]() { for (int r = 0; r < n; r++) { std::vector<uint8_t> h(elems, 0xee);
    for (size_t i = 0; i < bytes; i++) h[off + i] = val(r, i);
    if (inPlace) for (size_t i = 0; i < bytes; i++) h[off + r * bytes + i] = val(r, i);
    CK(cudaMemcpy(sb[r], h.data(), elems, cudaMemcpyHostToDevice)); CK(cudaMemset(rb[r], 0xee, elems)); } };
  auto get = [&](uint8_t* p) { std::vector<uint8_t> h(elems); CK(cudaMemcpy(h.data(), p, elems, cudaMemcpyDeviceToHost)); return h; };
  std::vector<std::vector<fnWork>> ws(n);
  // Broadcast from root 1 % n
  fill();
  const int root = 1 % n;
  for (int r = 0; r < n; r++) { fnWork x{}; x.sendbuff = sb[r] + off; x.recvbuff = (inPlace ? sb[r] : rb[r]) + off;
    x.count = bytes; x.type = FN_WORK_BROADCAST; x.root = root; ws[r] = {x}; }
  w.launch(fnCopy, ws, w.nCh); w.sync();
  for (int r = 0; r < n; r++) { auto h = get(inPlace ? sb[r] : rb[r]); size_t bad = 0, fb = 0;
    for (size_t i = 0; i < bytes; i++) if (h[off + i] != val(root, i)) { if (!bad++) fb = i; }
    report<uint8_t>("broadcast", n, bytes, -1, off, bad, fb); }
  // AllGather (in place: my input already sits in my block)
  fill();
  for (int r = 0; r < n; r++) { fnWork x{}; x.sendbuff = (inPlace ? sb[r] + r * bytes : sb[r]) + off;
    x.recvbuff = (inPlace ? sb[r] : rb[r]) + off; x.count = bytes; x.type = FN_WORK_ALLGATHER; ws[r] = {x}; }
  w.launch(fnCopy, ws, w.nCh); w.sync();
  for (int r = 0; r < n; r++) { auto h = get(inPlace ? sb[r] : rb[r]); size_t bad = 0, fb = 0;
    for (int q = 0; q < n; q++) for (size_t i = 0; i < bytes; i++) if (h[off + q * bytes + i] != val(q, i)) { if (!bad++) fb = q * bytes + i; }
    report<uint8_t>("allgather", n, bytes, -1, off, bad, fb); }
  // Send to r+1 and receive from r-1 in the same CTA (split halves), plus a self copy on CTA 1.
  if (n > 1) {
    fill();
    for (int r = 0; r < n; r++) {
      fnWork s{}, v{}, c{};
      s.sendbuff = sb[r] + off; s.count = bytes; s.type = FN_WORK_SEND; s.root = (r + 1) % n; s.blk = 0; s.chan = 0;
      v.recvbuff = rb[r] + off; v.count = bytes; v.type = FN_WORK_RECV; v.root = (r + n - 1) % n; v.blk = 0; v.chan = 0;
      c.sendbuff = sb[r] + off; c.recvbuff = rb[r] + bytes + off + 1; c.count = bytes; c.type = FN_WORK_COPY; c.blk = 1;
      ws[r] = {r % 2 ? v : s, r % 2 ? s : v, c};
    }
    w.launch(fnCopy, ws, 2); w.sync();
    for (int r = 0; r < n; r++) { auto h = get(rb[r]); size_t bad = 0, fb = 0; int from = (r + n - 1) % n;
      for (size_t i = 0; i < bytes; i++) { if (h[off + i] != val(from, i)) { if (!bad++) fb = i; }
        if (h[bytes + off + 1 + i] != val(r, i)) { if (!bad++) fb = i; } }
      report<uint8_t>("sendrecv+copy", n, bytes, -1, off, bad, fb); }
  }
  for (int r = 0; r < n; r++) { CK(cudaFree(sb[r])); CK(cudaFree(rb[r])); }
}

template <typename T>
void sweep(World& w, Kern k, int op, const std::vector<size_t>& counts) {
  for (size_t c : counts) for (int off : {0, 1}) testReductions<T>(w, k, op, c, off, off == 1 && c % 2);
}

// A missing rank: abort (host flag) and timeout must both end every other rank's kernel.
void testStops() {
  for (int mode = 0; mode < 2; mode++) {
    World w(3, 2, 4096, mode ? 50000000ull : 0);
    float* b; CK(cudaMalloc(&b, 1 << 20));
    std::vector<std::vector<fnWork>> ws(3);
    for (int r = 0; r < 3; r++) { fnWork x{}; x.sendbuff = b; x.recvbuff = b; x.count = 1 << 16; x.type = FN_WORK_ALLREDUCE; ws[r] = {x}; }
    w.launch(fnColl_f32_sum, ws, w.nCh, /*skipRank=*/2);
    if (!mode) { usleep(100000); for (int r = 0; r < 3; r++) ((volatile uint32_t*)w.abortH)[r] = 1; }
    w.sync();
    const uint32_t want = mode ? FN_DEV_TIMEOUT : FN_DEV_ABORTED;
    checks++;
    if (w.errorH[0] != want || w.errorH[1] != want) { failures++; printf("FAIL %s: errorFlag %u %u\n", mode ? "timeout" : "abort", w.errorH[0], w.errorH[1]); }
  }
}

int main() {
  const std::vector<size_t> counts = {1, 7, 1023, (1u << 20) + 3};
  for (int n : {1, 2, 3, 4, 8}) {
    // Small slots: many steps, FIFO wrap-around, and several pieces per channel.
    World w(n, n == 8 ? 4 : 3, 4096);
    for (int rep = 0; rep < 2; rep++) {  // a second pass reuses the persisted step counters
      sweep<float>(w, fnColl_f32_sum, FN_OP_SUM, counts);
      sweep<float>(w, fnColl_f32_premulsum, FN_OP_PREMULSUM, counts);
    }
    sweep<float>(w, fnColl_f32_prod, FN_OP_PROD, {7, 1023});
    sweep<float>(w, fnColl_f32_max, FN_OP_MAX, {7, 1023});
    sweep<int32_t>(w, fnColl_i32_min, FN_OP_MIN, {7, 1023});
    sweep<int32_t>(w, fnColl_i32_sumpostdiv, FN_OP_SUMPOSTDIV, counts);
    sweep<int8_t>(w, fnColl_i8_sum, FN_OP_SUM, counts);
    sweep<uint8_t>(w, fnColl_u8_sumpostdiv, FN_OP_SUMPOSTDIV, counts);
    sweep<int8_t>(w, fnColl_i8_prod, FN_OP_PROD, {1023});
    sweep<uint64_t>(w, fnColl_u64_max, FN_OP_MAX, {7, 1023});
    sweep<int64_t>(w, fnColl_i64_premulsum, FN_OP_PREMULSUM, {1023});
    sweep<double>(w, fnColl_f64_sum, FN_OP_SUM, {7, 1023, (1u << 20) + 3});
    sweep<__half>(w, fnColl_f16_sum, FN_OP_SUM, counts);
    sweep<__half>(w, fnColl_f16_premulsum, FN_OP_PREMULSUM, {1023});
    sweep<__nv_bfloat16>(w, fnColl_bf16_sum, FN_OP_SUM, counts);
    sweep<__nv_fp8_e4m3>(w, fnColl_e4m3_sum, FN_OP_SUM, counts);
    sweep<__nv_fp8_e5m2>(w, fnColl_e5m2_max, FN_OP_MAX, {7, 1023});
    for (size_t b : {size_t(1), size_t(7), size_t(1023), size_t(4 << 20) + 3})
      for (int off : {0, 1}) testMovement(w, b, off, off == 1);
    printf("n=%d done: %d checks, %d failures so far\n", n, checks, failures);
  }
  { World big(2, 2, 512 << 10); sweep<float>(big, fnColl_f32_sum, FN_OP_SUM, {(16u << 20) + 3}); testMovement(big, 64 << 20, 0, false); }
  testStops();
  printf("%s: %d checks, %d failures\n", failures ? "FAILED" : "PASSED", checks, failures);
  return failures ? 1 : 0;
}
