/*
 * device_abi.h: the one definition of everything the host (Rust, through bindgen) and the CUDA
 * kernels share: launch arguments, per-communicator device state, connection FIFOs, and the
 * numbering of collectives, reduction ops and data types. Plain C with fixed-width types so both
 * compilers lay it out identically; change it only together with both sides.
 */
#ifndef FERRONICKEL_DEVICE_ABI_H
#define FERRONICKEL_DEVICE_ABI_H

#include <stdint.h>

/* Threads per CTA for every kernel. */
#define FN_NTHREADS 512
/* Most channels (rings, one CTA each) a communicator uses. */
#define FN_MAX_CHANNELS 64
/* FIFO slots per connection: a sender may run this many steps ahead of its receiver. */
#define FN_NSTEPS 8
/* Work items carried by value in one launch's parameters. */
#define FN_MAX_WORKS 32
/* Alignment (bytes) of FIFO slots, channel partitions and vector accesses. */
#define FN_ALIGN 16
/* The largest Simple step that crosses a net plugin's connection as one message after a Simple
   step (the NET proxy's Simple landing, src/transport/net/proxy/block.rs); a send or receive to a
   peer through a plugin steps at most this much where its part is small enough
   (src/plan/kernels.rs). */
#define FN_NET_ONE_MESSAGE_SIMPLE 65536
/* LL: 16-byte lines of 8 data bytes + 2 copies of a 4-byte flag; lines per FIFO slot (16 KiB of data). */
#define FN_LL_SLOT_LINES 2048
/* LL128: 128-byte lines of 120 data bytes + an 8-byte flag; lines per FIFO slot (60 KiB of data). */
#define FN_LL128_SLOT_LINES 512
#define FN_LL128_LINE_WORDS 15 /* 8-byte data words per LL128 line */

/* Protocols: how a step's data and its "ready" signal travel (kernels/README.md). Numbered as
 * NCCL's NCCL_PROTO_* so logs read the same. */
enum fnProto {
  FN_PROTO_LL = 0,     /* flag in every 8-byte word: no fence, half the bandwidth */
  FN_PROTO_LL128 = 1,  /* flag in every 128-byte line: relies on NVLink's 128-byte store atomicity */
  FN_PROTO_SIMPLE = 2, /* data, system fence, then a step counter */
  FN_NUM_PROTOS = 3,
};

/* Algorithms of a collective work. */
enum fnAlgo {
  FN_ALGO_RING = 0,
  FN_ALGO_ONESHOT = 1, /* AllReduce: every rank pushes its input to every peer, then reduces all
                          inputs locally; one hop. Two ranks: any protocol, any size; more: LL
                          only, one LL slot per channel */
  FN_ALGO_TREE = 2,    /* AllReduce: reduce up the channel's tree (fnDevComm.trees), then
                          broadcast down it; any protocol */
  FN_ALGO_SYMMETRIC = 3, /* AllReduce, AllGather, ReduceScatter on buffers in symmetric windows:
                            loads and stores peers' memory through the flat mapping, no FIFO;
                            sendbuff / recvbuff are LSA rank 0's flat addresses (kernels/README.md) */
  FN_ALGO_DIRECT = 4,    /* Reduce: every other rank sends its input straight to the root over their
                            own connection (conns[root], channel = CTA), which reduces them in rank
                            order; one hop. Broadcast: each rank receives from fnWork.chan and sends
                            on to the ranks fnWork.scalar lists (conns[peer]): the root to one rank
                            of every other host, then to the next of its own, and every rank to the
                            next of its host; across hosts of one rank, one hop. Across hosts over
                            NET (src/tuner.rs: reduce on hosts of up to two ranks) */
  FN_ALGO_RECDBL = 5,    /* AllReduce, AllGather, ReduceScatter: recursive doubling, log2(n)
                            exchanges, in exchange d rank r swaps with r ^ 2^d over their own
                            connection (conns[r ^ 2^d], channel = CTA); all-reduce sends all it has
                            reduced so far, all-gather the 2^d pieces it holds, reduce-scatter
                            all-reduces the whole input in fnDevComm.scratch and keeps its piece.
                            One channel; a power of two of ranks across hosts (src/tuner.rs) */
};

/* What one work item does. */
enum fnWorkType {
  FN_WORK_ALLREDUCE = 0,
  FN_WORK_REDUCE = 1,
  FN_WORK_BROADCAST = 2,
  FN_WORK_ALLGATHER = 3,
  FN_WORK_REDUCESCATTER = 4,
  FN_WORK_SEND = 5, /* p2p: bytes from sendbuff to `peer`, one CTA (`blk`) over channel `chan` */
  FN_WORK_RECV = 6, /* p2p: bytes from `peer` into recvbuff */
  FN_WORK_COPY = 7, /* a send to self matched with a receive from self: a local copy of `count` bytes */
};

/* Device reduction operators (the user's ncclRedOp_t maps onto these on the host). */
enum fnRedOp {
  FN_OP_SUM = 0,
  FN_OP_PROD = 1,
  FN_OP_MAX = 2,
  FN_OP_MIN = 3,
  FN_OP_PREMULSUM = 4,  /* sum of (scalar * input): each rank scales its own input as it is first read */
  FN_OP_SUMPOSTDIV = 5, /* integer ncclAvg: sum, then divide by nRanks where the final value is written */
  FN_NUM_OPS = 6,
};

/* Data types, numbered as ncclDataType_t. */
enum fnDataType {
  FN_INT8 = 0, FN_UINT8 = 1, FN_INT32 = 2, FN_UINT32 = 3, FN_INT64 = 4, FN_UINT64 = 5,
  FN_FLOAT16 = 6, FN_FLOAT32 = 7, FN_FLOAT64 = 8, FN_BFLOAT16 = 9, FN_FP8E4M3 = 10, FN_FP8E5M2 = 11,
  FN_NUM_TYPES = 12,
};

/* Codes the device writes to fnDevComm.errorFlag. */
enum fnDevError {
  FN_DEV_OK = 0,
  FN_DEV_TIMEOUT = 1, /* a wait on a peer exceeded timeoutNs: a rank never called, or counts disagree */
  FN_DEV_ABORTED = 2, /* the host set abortFlag */
};

/* fnConnSend.flags / fnConnRecv.flags: what the transport behind a connection needs from the
 * kernels beyond P2P's contract (docs/ARCHITECTURE.md, "Transports"). */
enum fnConnFlags {
  /* The FIFO is in host memory (SHM, NET), where a 128-byte store does not arrive whole and a proxy
   * may fill the slot: LL128 publishes each step's tail after a system fence, as Simple does, and
   * the receiver waits for the tail before it reads the slot (LL128 flags are still written and
   * checked). LL's 16-byte lines arrive whole, each 8-byte half with its own flag: a GPU's 16-byte
   * store over PCIe, and over NET the receiving proxy's, which lands a step away from the FIFO and
   * then stores the lines so that no store splits a half. So LL publishes no tail and its receiver
   * polls the lines, as over P2P (over NET the sending proxy checks the lines' flags instead). */
  FN_CONN_TAIL_LL128 = 2,
};

/* fnConnSend.sizes entries: low bits the step's bytes (a slot is always smaller), top two its protocol. */
#define FN_SIZE_PROTO_SHIFT 30
/* A sizes entry no step has filled since the proxy took the last one (no protocol has number 3). */
#define FN_SIZE_EMPTY 0xffffffffu

/* Sender half of a connection: we write into the receiver's FIFO and tail, it writes our head.
 * Under NET, "the receiver's FIFO" is a host-memory staging FIFO a proxy drains (buffs, tail and
 * sizes are then ours, and the proxy writes head when a slot is free again). */
typedef struct fnConnSend {
  char* buffs[FN_NUM_PROTOS]; /* receiver's FIFO per protocol, FN_NSTEPS slots each (peer memory) */
  volatile uint64_t* tail;   /* receiver's count of posted steps (peer memory; we store step+1) */
  volatile uint64_t* head;   /* our memory: receiver's count of consumed steps */
  volatile uint32_t* sizes;  /* NULL, or FN_NSTEPS entries: for the step at that slot, the bytes of
                                its FIFO slot it filled (LL / LL128: whole lines) | its fnProto <<
                                FN_SIZE_PROTO_SHIFT, stored before the tail (Simple, LL128) or before
                                the step's lines (LL, untailed: the proxy checks their flags). The
                                proxy empties an entry (FN_SIZE_EMPTY) before it frees the slot */
  uint32_t flags;            /* fnConnFlags */
  uint32_t pad;
  uint64_t step;             /* steps we have posted; persists across launches */
  uint64_t headSeen;         /* *head as this connection's sender last read it (head only grows):
                                persists across launches, so a launch reads head (across PCIe when
                                it is in host memory) only once the FIFO looks full */
} fnConnSend;

/* Receiver half: the sender fills our FIFO and tail; we report consumption in its head. */
typedef struct fnConnRecv {
  char* buffs[FN_NUM_PROTOS]; /* our FIFO per protocol */
  volatile uint64_t* tail;   /* our memory: sender's count of posted steps */
  volatile uint64_t* head;   /* sender's memory: we store step+1 after consuming a slot */
  uint32_t flags;            /* fnConnFlags */
  uint32_t pad;
  uint64_t step;             /* steps we have consumed; persists across launches */
} fnConnRecv;

/* Both directions between us and one peer on one channel. buffs[0] == NULL: not connected. Every
 * protocol shares the step counters: a step's slot is step % FN_NSTEPS in that protocol's FIFO,
 * LL flags are step + 1, and the counters only grow, so a stale line never looks fresh. */
typedef struct fnConn {
  fnConnSend send;
  fnConnRecv recv;
} fnConn;

/* One ring (one channel). */
typedef struct fnRing {
  int32_t prev, next; /* ranks */
  int32_t index;      /* our position in userRanks */
  int32_t pad;
  int32_t* userRanks; /* device array: rank at each ring position, nRanks entries */
} fnRing;

/* Most children of a rank in one tree: the next rank of its host's chain, and two hosts below it
 * in the tree between hosts (docs/ARCHITECTURE.md, "Tree"). */
#define FN_TREE_ARITY 3

/* One rank's place in one channel's tree. */
typedef struct fnTree {
  int32_t up;                  /* parent rank; -1 at the root */
  int32_t down[FN_TREE_ARITY]; /* child ranks, the used ones first, then -1 */
} fnTree;

/* Symmetric kernels' barrier memory: one region of FN_SYM_SYNC_WORDS(nRanks) 64-bit words per rank,
 * in a symmetric window of the communicator's own. Word c is this rank's count of barriers passed
 * on channel c; word FN_MAX_CHANNELS + c holds the bits of this rank's PreMulSum scalar for channel
 * c's current collective (peers apply it to this rank's input); word 2 * FN_MAX_CHANNELS +
 * c * nRanks + q is rank q's count of arrivals at channel c's barriers, which rank q stores there.
 * Counts only grow, so consecutive collectives need no reset. */
#define FN_SYM_SYNC_WORDS(nRanks) (FN_MAX_CHANNELS * (2 + (nRanks)))

/* Bytes of fnDevComm.scratch: the most input a recursive-doubling reduce-scatter takes. */
#define FN_RECDBL_SCRATCH (128 * 1024)

/* Per-communicator device state, in device memory, written by the host at init. */
typedef struct fnDevComm {
  int32_t rank, nRanks, nChannels;
  int32_t slotBytes;                 /* bytes per Simple FIFO slot, a multiple of FN_ALIGN */
  fnRing rings[FN_MAX_CHANNELS];
  fnTree trees[FN_MAX_CHANNELS];     /* channel c runs tree c % 2 of the double binary tree */
  fnConn* conns;                     /* conns[peer * FN_MAX_CHANNELS + channel] */
  volatile uint32_t* abortFlag;      /* host-mapped: nonzero asks every kernel of this comm to stop */
  volatile uint32_t* errorFlag;      /* host-mapped: the device reports an fnDevError here */
  uint64_t timeoutNs;                /* a wait longer than this fails with FN_DEV_TIMEOUT; 0 = never */
  uint64_t* symSync;                 /* rank 0's barrier region in the flat mapping (FN_SYM_SYNC_WORDS);
                                        rank q's is symStride4G * 4 GiB further per rank. Written when
                                        the first symmetric window is registered; NULL before */
  uint32_t symStride4G;
  uint32_t chunkSlots;               /* Simple slots a ring collective sends per hop before it waits on
                                        its receive (NCCL's chunk steps): FN_NSTEPS / 2 when some pair
                                        is on NET, 1 otherwise; 0 counts as 1. Alike on every rank */
  void* scratch;                     /* FN_RECDBL_SCRATCH bytes of device memory where recursive
                                        doubling can run (FN_ALGO_RECDBL), NULL elsewhere */
} fnDevComm;

/* One operation. Element counts are in elements of `dtype`, except p2p/copy which are bytes. */
typedef struct fnWork {
  const void* sendbuff;
  void* recvbuff;
  uint64_t count;      /* AllReduce/Reduce/Broadcast: elements; AllGather: per-rank input elements;
                          ReduceScatter: per-rank output elements; Send/Recv/Copy: bytes */
  uint64_t scalar;     /* PreMulSum: the scalar's bits in dtype (host immediate), or a device
                          pointer to it when scalarIsPtr; Broadcast by FN_ALGO_DIRECT: the ranks
                          this rank sends to in order, rank + 1 in each 4 bits from the lowest,
                          0 after the last; Send/Recv: bytes per step, alike at both ends (0: a
                          slot's) */
  int32_t type;        /* fnWorkType */
  int32_t root;        /* Reduce/Broadcast: root rank; Send/Recv: peer rank */
  int32_t blk;         /* Send/Recv/Copy: the first CTA that runs it; collectives use every CTA */
  int32_t chan;        /* Send/Recv: the channel (connection) of its first part; Broadcast by
                          FN_ALGO_DIRECT: the rank this rank receives from, -1 on the root */
  uint8_t op;          /* fnRedOp */
  uint8_t dtype;       /* fnDataType */
  uint8_t scalarIsPtr;
  uint8_t nParts;      /* Send/Recv/Copy: split into this many contiguous FN_ALIGN-aligned byte
                          ranges; part j runs on CTA blk + j over channel chan + j (0 means 1) */
  uint8_t proto;       /* fnProto; Send/Recv: LL or Simple, alike at both ends (src/plan/kernels.rs) */
  uint8_t algo;        /* collectives: fnAlgo */
  uint16_t nChannels;  /* collectives: channels (CTAs 0..nChannels-1) it is spread over */
  uint32_t sendStride4G; /* FN_ALGO_SYMMETRIC: rank q's send / recv buffer is q * stride * 4 GiB */
  uint32_t recvStride4G; /* past sendbuff / recvbuff (the windows' flat mappings) */
} fnWork;

/* The kernel parameter, passed by value: the comm and the works to run in order. */
typedef struct fnKernelArgs {
  fnDevComm* comm;
  int32_t nWorks;
  int32_t pad;
  fnWork works[FN_MAX_WORKS];
} fnKernelArgs;

#endif /* FERRONICKEL_DEVICE_ABI_H */
