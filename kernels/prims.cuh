// prims.cuh: one ring/p2p endpoint pair of a group and its FIFO steps in each protocol. The ring
// algorithms (collectives.cuh) are written once against send / recvReduceSend / ... and run over any
// protocol P. See kernels/README.md for the step rules.
#pragma once
#include "prims_ll.cuh"
#include "prims_simple.cuh"

// Payload bytes one FIFO step carries in protocol P (Simple: the communicator's slot).
template <int P>
__device__ __forceinline__ uint32_t slotPayload(const fnDevComm* comm) {
  if constexpr (P == FN_PROTO_LL) return FN_LL_SLOT_LINES * 8;
  else if constexpr (P == FN_PROTO_LL128) return FN_LL128_SLOT_LINES * FN_LL128_LINE_WORDS * 8;
  else return uint32_t(comm->slotBytes);
}
// Bytes between consecutive slots of protocol P's FIFO.
template <int P>
__device__ __forceinline__ uint32_t slotStride(const fnDevComm* comm) {
  if constexpr (P == FN_PROTO_LL) return FN_LL_SLOT_LINES * 16;
  else if constexpr (P == FN_PROTO_LL128) return FN_LL128_SLOT_LINES * 128;
  else return uint32_t(comm->slotBytes);
}

// Where thread 0 of a group hands the head it read to the rest (groupWaitSendSlot), by the
// group's barrier id: a CTA runs at most three groups, and each has at most one send half waiting
// at a time.
static __shared__ uint64_t fnSharedHead[3];

// The send half towards one peer and the receive half from another (either may be absent). Step
// counters live in registers (every thread keeps the same copy) for the duration of a work and
// are written back by save().
template <typename T, typename Op, int P>
struct Prims {
  const Group g;
  const fnDevComm* comm;
  const Op op;
  fnConnSend* sendConn;
  fnConnRecv* recvConn;
  char* sendBuff = nullptr;
  char* recvBuff = nullptr;
  uint64_t sendStep = 0, recvStep = 0;
  // What the transports behind the two connections ask for (whether P publishes and waits for
  // a tail, the proxy's size words): fixed for the communicator's life, so read once here
  // instead of every step.
  bool sendTailed = false, recvTailed = false;
  volatile uint32_t* sendSizes = nullptr;
  // The receiver's head as last read (fnConnSend.headSeen, kept across launches): slots up to
  // headSeen + FN_NSTEPS - 1 are known free, so a step reads head again (across PCIe when the
  // FIFO is in host memory) only when the FIFO looks full. Simple: thread 0's is the one that
  // counts; LL and LL128: the same in every thread of the group.
  uint64_t headSeen = 0;
  const uint32_t stride;
  // Elements one step carries.
  const uint64_t slotElems;

  __device__ Prims(const Group& g_, const fnDevComm* comm_, const Op& op_, fnConnSend* s, fnConnRecv* r)
      : g(g_), comm(comm_), op(op_), sendConn(s), recvConn(r), stride(slotStride<P>(comm_)),
        slotElems(slotPayload<P>(comm_) / sizeof(T)) {
    // The counters may have been advanced by this group's previous work: read them volatile.
    if (s) {
      sendBuff = s->buffs[P];
      sendStep = *reinterpret_cast<volatile uint64_t*>(&s->step);
      sendTailed = tailed(s->flags);
      sendSizes = s->sizes;
      headSeen = *reinterpret_cast<volatile uint64_t*>(&s->headSeen);
    }
    if (r) {
      recvBuff = r->buffs[P];
      recvStep = *reinterpret_cast<volatile uint64_t*>(&r->step);
      recvTailed = tailed(r->flags);
    }
  }

  // One FIFO step: wait for the slot(s), move n elements (n <= slotElems, may be 0), publish.
  // F_PRE / F_POST are dropped for operators whose pre / post is the identity, so movements that
  // differ only there share one mover body (fewer instantiations, faster nvcc).
  template <int F0>
  __device__ __forceinline__ bool step(const T* usrc, T* udst, size_t n) {
    constexpr int F = F0 & ~((Op::kPre ? 0 : F_PRE) | (Op::kPost ? 0 : F_POST));
    constexpr bool R = F & F_RECV, S = F & F_SEND;
    char* rslot = R ? recvBuff + (recvStep % FN_NSTEPS) * stride : nullptr;
    char* sslot = S ? sendBuff + (sendStep % FN_NSTEPS) * stride : nullptr;
    int stop = FN_DEV_OK;
    if constexpr (P == FN_PROTO_SIMPLE) {
      if (g.tid == 0) {
        if (R) stop = waitCounter(comm, recvConn->tail, 0, recvStep);
        if (S && stop == FN_DEV_OK) stop = waitSendSlot();
      }
      if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
      reduceCopy<T, Op, F>(g, op, reinterpret_cast<const T*>(rslot), usrc, udst, reinterpret_cast<T*>(sslot), n);
      groupBarrier(g);
      if (g.tid == 0 && S) publish(n * sizeof(T));
    } else {
      // The data carries its own flag (step + 1): no tail. The receiver frees the slot once the
      // whole group has read it. Over host memory LL128 adds Simple's tail in both directions
      // (fnConnFlags).
      if (R && recvTailed) {
        if (g.tid == 0) stop = waitCounter(comm, recvConn->tail, 0, recvStep);
        if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
      }
      if (S && !groupWaitSendSlot()) return false;
      const uint64_t words = divUp(n * sizeof(T), 8);
      const uint64_t bytes = P == FN_PROTO_LL ? words * 16 : divUp(words, FN_LL128_LINE_WORDS) * 128;
      // Untailed LL over NET: the size word alone, before the lines, so that the proxy already
      // checks their flags while they land.
      if (g.tid == 0 && S && !sendTailed && sendSizes) sendSizes[sendStep % FN_NSTEPS] = sizeWord(bytes);
      if constexpr (P == FN_PROTO_LL) {
        stop = llMove<T, Op, F>(g, comm, op, rslot, uint32_t(recvStep + 1), sslot, uint32_t(sendStep + 1), usrc, udst,
                                n);
      } else {
        stop = ll128Move<T, Op, F>(g, comm, op, rslot, recvStep + 1, sslot, sendStep + 1, usrc, udst, n);
      }
      if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
      if (g.tid == 0 && S && sendTailed) publish(bytes);
    }
    if (g.tid == 0 && R) *recvConn->head = recvStep + 1;
    if (S) sendStep++;
    if (R) recvStep++;
    return true;
  }

  // Whether protocol P publishes and waits for a tail on a connection with these fnConnFlags
  // (Simple always does).
  __device__ static bool tailed(uint32_t flags) { return P == FN_PROTO_LL128 && (flags & FN_CONN_TAIL_LL128); }

  // Thread 0 (Simple): waits until the receiver has freed the slot of sendStep (see headSeen).
  __device__ __forceinline__ int waitSendSlot() {
    if (headSeen + FN_NSTEPS > sendStep) return FN_DEV_OK;
    return waitCounter(comm, sendConn->head, FN_NSTEPS, sendStep, &headSeen);
  }

  // The whole group (LL, LL128): as waitSendSlot, thread 0 polling while the others wait at a
  // barrier, then the head it read shared through shared memory. One poller matters: when 512
  // threads each poll a head in host memory with system-scope acquires, a small NET step took
  // 16 us longer (docs/NET.md, "Small steps"). False when the group must stop.
  __device__ __forceinline__ bool groupWaitSendSlot() {
    if (headSeen + FN_NSTEPS > sendStep) return true;  // the same in every thread
    int stop = FN_DEV_OK;
    if (g.tid == 0) {
      stop = waitSendSlot();
      fnSharedHead[g.barId] = headSeen;
    }
    if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
    headSeen = fnSharedHead[g.barId];
    return true;
  }

  __device__ static uint32_t sizeWord(uint64_t bytes) { return uint32_t(bytes) | uint32_t(P) << FN_SIZE_PROTO_SHIFT; }

  // Thread 0, after the group's slot stores (ordered by a barrier): the step's size and protocol for a proxy,
  // then a system fence, then the tail.
  __device__ __forceinline__ void publish(uint64_t bytes) {
    if (sendSizes) sendSizes[sendStep % FN_NSTEPS] = sizeWord(bytes);
    __threadfence_system();
    *sendConn->tail = sendStep + 1;
  }

  // The ring primitives (PRE/POST are identities except for PreMulSum / SumPostDiv).
  __device__ bool send(const T* src, size_t n) { return step<F_SEND | F_USRC | F_PRE>(src, nullptr, n); }
  __device__ bool recvReduceSend(const T* src, size_t n) {
    return step<F_RECV | F_SEND | F_USRC | F_PRE>(src, nullptr, n);
  }
  __device__ bool recvReduceCopySend(const T* src, T* dst, size_t n) {
    return step<F_RECV | F_SEND | F_USRC | F_UDST | F_PRE | F_POST>(src, dst, n);
  }
  __device__ bool recvReduceCopy(const T* src, T* dst, size_t n) {
    return step<F_RECV | F_USRC | F_UDST | F_PRE | F_POST>(src, dst, n);
  }
  __device__ bool recvCopySend(T* dst, size_t n) { return step<F_RECV | F_SEND | F_UDST>(nullptr, dst, n); }
  __device__ bool recv(T* dst, size_t n) { return step<F_RECV | F_UDST>(nullptr, dst, n); }
  // Data movement without reduction: forward src (and copy it to dst unless it is already there).
  __device__ bool copySend(const T* src, T* dst, size_t n) {
    return src == dst ? step<F_SEND | F_USRC>(src, nullptr, n) : step<F_SEND | F_USRC | F_UDST>(src, dst, n);
  }

  // Persist the counters for the next work / launch, then let the group re-read them.
  __device__ void save() {
    if (g.tid == 0) {
      if (sendConn) {
        *reinterpret_cast<volatile uint64_t*>(&sendConn->step) = sendStep;
        *reinterpret_cast<volatile uint64_t*>(&sendConn->headSeen) = headSeen;
      }
      if (recvConn) *reinterpret_cast<volatile uint64_t*>(&recvConn->step) = recvStep;
    }
    groupBarrier(g);
  }
};
