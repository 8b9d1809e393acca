/* A timing profiler plugin (ABI v5) for looking at how a NET proxy schedules its steps, under
 * NVIDIA's NCCL and under ferronickel alike (docs/NET.md, "A proxy's timeline"). It asks for
 * collective, proxy op, proxy step and net-plugin events, stamps CLOCK_MONOTONIC (shared by the
 * processes of one machine) at every start, state change and stop, and at finalize writes the
 * process's events to $PROXY_TIMELINE_DIR/tl.<pid>.txt (default: the working directory), one line
 * each:
 *   L <path of the libnccl this process loaded>
 *   C <id> <t0> <rank> <seq> <func> <count> <nChannels> <algo> <proto>
 *   O <id> <parent> <t0> <t1> <rank> <channel> <peer> <isSend> <nSteps> <chunkSize>
 *   S <id> <parent> <t0> <t1> <rank> <step> [<state> <t> <bytes>]...
 *   N <id> <parent step> <t0> <t1> <rank> <thread id> <thread name> <plugin event id, hex> [<fd> <op> <length>]
 * Times in ns; t1 is 0 for an event never stopped; parent is -1 for none. N is an event a net
 * starts under a step (a net plugin through the library's profiler callback, or the built-in
 * Socket net), with the thread that started it and, for NCCL's socket events, the socket, send 0 /
 * receive 1 and bytes.
 * scripts/proxy_timeline.py reads them. Build:
 *   gcc -shared -fPIC -O2 -Isrc/plugin -o libproxy_timeline.so benches/proxy_timeline.c
 * and run with NCCL_PROFILER_PLUGIN=<that file>. Not for production: it keeps every event. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include "plugin_abi.h"

/* NCCL's socket events (its net_socket_v1.h): type and version in the plugin event id. */
#define NET_TYPE_SOCK_V1 ((2u << 16) | 1)
typedef struct {
  uint8_t type;
  struct {
    int fd;
    int op;
    size_t length;
  } sock;
} sock_descr_v1_t;

#define MAX_EVENTS (1 << 19)
#define MAX_STATES 4

typedef struct {
  char kind; /* 'C', 'O', 'S', 'N'; 0 unused */
  int rank, nstates;
  long parent;
  unsigned long long t0, t1;
  /* C: seq, count, nch; O: channel, peer, isSend, nSteps, chunk; S: step; N: thread, plugin
   * event id, then fd, op, length (NCCL's socket events) */
  long long a[5];
  const char *func, *algo, *proto;
  char thread[16]; /* N: the starting thread's name */
  int state[MAX_STATES];
  unsigned long long st[MAX_STATES];
  size_t bytes[MAX_STATES];
} ev_t;

static ev_t* events;
static long nevents;
static int ctx_token;

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static long id_of(void* h) { return h ? (long)((ev_t*)h - events) : -1; }

static ncclResult_t init(void** ctx, uint64_t id, int* mask, const char* name, int nnodes, int nranks, int rank,
                         ncclDebugLogger_t log) {
  (void)id; (void)name; (void)nnodes; (void)nranks; (void)rank; (void)log;
  if (!events) {
    events = calloc(MAX_EVENTS, sizeof(ev_t));
    if (!events) return ncclSystemError;
  }
  *mask = ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin;
  *ctx = &ctx_token;
  return ncclSuccess;
}

static ncclResult_t start(void* ctx, void** h, ncclProfilerEventDescr_v5_t* d) {
  *h = NULL;
  if (ctx != &ctx_token) return ncclInternalError;
  int type = (int)d->type;
  if (type != ncclProfileColl && type != ncclProfileProxyOp && type != ncclProfileProxyStep &&
      type != ncclProfileNetPlugin)
    return ncclSuccess;
  long i = __atomic_fetch_add(&nevents, 1, __ATOMIC_RELAXED);
  if (i >= MAX_EVENTS) return ncclSuccess;
  ev_t* e = &events[i];
  e->t0 = now_ns();
  e->rank = d->rank;
  e->parent = id_of(d->parentObj);
  if (type == ncclProfileColl) {
    e->kind = 'C';
    e->a[0] = (long long)d->coll.seqNumber;
    e->a[1] = (long long)d->coll.count;
    e->a[2] = d->coll.nChannels;
    e->func = d->coll.func;
    e->algo = d->coll.algo;
    e->proto = d->coll.proto;
  } else if (type == ncclProfileProxyOp) {
    e->kind = 'O';
    e->a[0] = d->proxyOp.channelId;
    e->a[1] = d->proxyOp.peer;
    e->a[2] = d->proxyOp.isSend;
    e->a[3] = d->proxyOp.nSteps;
    e->a[4] = d->proxyOp.chunkSize;
  } else if (type == ncclProfileProxyStep) {
    e->kind = 'S';
    e->a[0] = d->proxyStep.step;
  } else {
    e->kind = 'N';
    e->a[0] = (long long)syscall(SYS_gettid);
    if (prctl(PR_GET_NAME, e->thread) != 0 || !e->thread[0]) strcpy(e->thread, "-");
    for (char* c = e->thread; *c; c++)
      if (*c == ' ') *c = '_';
    e->a[1] = d->netPlugin.id;
    e->a[2] = -1;
    if (d->netPlugin.id == NET_TYPE_SOCK_V1 && d->netPlugin.data) {
      const sock_descr_v1_t* sd = d->netPlugin.data;
      e->a[2] = sd->sock.fd;
      e->a[3] = sd->sock.op;
      e->a[4] = (long long)sd->sock.length;
    }
  }
  *h = e;
  return ncclSuccess;
}

static ncclResult_t stop(void* h) {
  if (h) ((ev_t*)h)->t1 = now_ns();
  return ncclSuccess;
}

static ncclResult_t record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v5_t* a) {
  ev_t* e = h;
  if (!e || e->kind != 'S' || e->nstates >= MAX_STATES) return ncclSuccess;
  e->state[e->nstates] = (int)s;
  e->st[e->nstates] = now_ns();
  e->bytes[e->nstates] = a ? a->proxyStep.transSize : 0;
  e->nstates++;
  return ncclSuccess;
}

#define S(x) ((x) ? (x) : "-")

static ncclResult_t fini(void* ctx) {
  if (ctx != &ctx_token) return ncclInternalError;
  const char* dir = getenv("PROXY_TIMELINE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/tl.%d.txt", dir ? dir : ".", (int)getpid());
  FILE* f = fopen(path, "a");
  if (!f) return ncclSuccess;
  char line[4096];
  FILE* maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps)) {
    char* p = strstr(line, "libnccl");
    if (p && strchr(line, '/')) {
      fprintf(f, "L %s", strchr(line, '/'));
      break;
    }
  }
  if (maps) fclose(maps);
  long n = nevents < MAX_EVENTS ? nevents : MAX_EVENTS;
  for (long i = 0; i < n; i++) {
    ev_t* e = &events[i];
    if (e->kind == 'C') {
      fprintf(f, "C %ld %llu %d %lld %s %lld %lld %s %s\n", i, e->t0, e->rank, e->a[0], S(e->func), e->a[1], e->a[2],
              S(e->algo), S(e->proto));
    } else if (e->kind == 'O') {
      fprintf(f, "O %ld %ld %llu %llu %d %lld %lld %lld %lld %lld\n", i, e->parent, e->t0, e->t1, e->rank, e->a[0],
              e->a[1], e->a[2], e->a[3], e->a[4]);
    } else if (e->kind == 'S') {
      fprintf(f, "S %ld %ld %llu %llu %d %lld", i, e->parent, e->t0, e->t1, e->rank, e->a[0]);
      for (int k = 0; k < e->nstates; k++) fprintf(f, " %d %llu %zu", e->state[k], e->st[k], e->bytes[k]);
      fputc('\n', f);
    } else if (e->kind == 'N') {
      fprintf(f, "N %ld %ld %llu %llu %d %lld %s %#llx", i, e->parent, e->t0, e->t1, e->rank, e->a[0], e->thread,
              (unsigned long long)e->a[1]);
      if (e->a[2] >= 0) fprintf(f, " %lld %lld %lld", e->a[2], e->a[3], e->a[4]);
      fputc('\n', f);
    }
  }
  if (nevents > MAX_EVENTS) fprintf(stderr, "proxy_timeline: %ld events, the first %d kept\n", nevents, MAX_EVENTS);
  fclose(f);
  memset(events, 0, sizeof(ev_t) * (size_t)n);
  nevents = 0;
  return ncclSuccess;
}

const ncclProfiler_v5_t ncclProfiler_v5 = {"proxy_timeline", init, start, stop, record, fini};
