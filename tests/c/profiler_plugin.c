/* A profiler plugin for tests/plugins.rs and scripts/gpu_check.sh, built against
 * src/plugin/plugin_abi.h once per ABI version (-DPROFILER_VERSION=1..5). It asks for the events
 * NCCL_PROFILE_EVENT_MASK names (as NCCL's example profiler does; default: all) and, at finalize,
 * appends one line per event to $TEST_PROFILER_OUT (default stderr):
 *   <id> <parent id or -> <type> <fields...> <stopped: 1|0> <states>
 * so a test can check that every started event stopped and its fields. -DFAIL_INIT fails init.
 * Net-plugin events (v3 and later) show the test net plugin's descriptor (fntcp_event.h) or the
 * Socket net's (NCCL's socket events, with helper=1 where one of ferronickel's helper threads,
 * fn-net-help*, started it: a chunk, not an inline message). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include "plugin_abi.h"
#include "fntcp_event.h"

#define MAX_EVENTS 65536
typedef struct {
  int used, stopped, nstates, fntcp;
  long parent;
  char text[256];
  size_t last_bytes;
} ev_t;
static ev_t events[MAX_EVENTS];
static int nevents;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ctx_token;

static long id_of(void* h) { return h ? (long)((ev_t*)h - events) : -1; }

static ncclResult_t init_common(void** ctx, int* mask) {
#ifdef FAIL_INIT
  (void)ctx; (void)mask;
  return ncclSystemError;
#else
  const char* m = getenv("NCCL_PROFILE_EVENT_MASK");
  *mask = m ? (int)strtol(m, NULL, 0) : 0xfff;
  *ctx = &ctx_token;
  return ncclSuccess;
#endif
}

static void add(void** h, void* parent, const char* text, int fntcp) {
  pthread_mutex_lock(&lock);
  *h = NULL;
  if (nevents < MAX_EVENTS) {
    ev_t* e = &events[nevents++];
    e->used = 1;
    e->fntcp = fntcp;
    e->parent = id_of(parent);
    snprintf(e->text, sizeof e->text, "%s", text);
    *h = e;
  }
  pthread_mutex_unlock(&lock);
}

#define S(x) ((x) ? (x) : "(null)")

#if PROFILER_VERSION == 5
typedef ncclProfilerEventDescr_v5_t descr_t;
typedef ncclProfilerEventStateArgs_v5_t args_t;
#elif PROFILER_VERSION == 4
typedef ncclProfilerEventDescr_v4_t descr_t;
typedef ncclProfilerEventStateArgs_v4_t args_t;
#elif PROFILER_VERSION == 3
typedef ncclProfilerEventDescr_v3_t descr_t;
typedef ncclProfilerEventStateArgs_v3_t args_t;
#elif PROFILER_VERSION == 2
typedef ncclProfilerEventDescr_v2_t descr_t;
typedef ncclProfilerEventStateArgs_v2_t args_t;
#else
typedef ncclProfilerEventDescr_v1_t descr_t;
typedef ncclProfilerEventStateArgs_v1_t args_t;
#endif

static ncclResult_t start(void* ctx, void** h, descr_t* d) {
  char t[256];
  int fntcp = 0;
  if (ctx != &ctx_token) return ncclInternalError;
  switch ((int)d->type) {
  case ncclProfileGroup: snprintf(t, sizeof t, "Group rank=%d", d->rank); break;
#if PROFILER_VERSION >= 2
  case ncclProfileColl:
    snprintf(t, sizeof t, "Coll rank=%d seq=%llu func=%s count=%zu root=%d dtype=%s nch=%d algo=%s proto=%s",
             d->rank, (unsigned long long)d->coll.seqNumber, S(d->coll.func), d->coll.count, d->coll.root,
             S(d->coll.datatype),
#if PROFILER_VERSION >= 4
             d->coll.nChannels,
#else
             d->coll.nMaxChannels,
#endif
             S(d->coll.algo), S(d->coll.proto));
    break;
  case ncclProfileP2p:
    snprintf(t, sizeof t, "P2p rank=%d func=%s count=%zu dtype=%s peer=%d", d->rank, S(d->p2p.func), d->p2p.count,
             S(d->p2p.datatype), d->p2p.peer);
    break;
#else
  case ncclProfileColl:
    snprintf(t, sizeof t, "Coll rank=%d seq=%llu func=%d count=%zu root=%d dtype=%d nch=%d algo=%d proto=%d", d->rank,
             (unsigned long long)d->coll.seqNumber, d->coll.func, d->coll.count, d->coll.root, d->coll.datatype,
             d->coll.nMaxChannels, d->coll.algo, d->coll.proto);
    break;
  case ncclProfileP2p:
    snprintf(t, sizeof t, "P2p rank=%d func=%d count=%zu dtype=%d peer=%d", d->rank, d->p2p.func, d->p2p.count,
             d->p2p.datatype, d->p2p.peer);
    break;
#endif
  case ncclProfileProxyOp:
    snprintf(t, sizeof t, "ProxyOp rank=%d channel=%d peer=%d send=%d chunk=%d pid_ok=%d", d->rank,
             d->proxyOp.channelId, d->proxyOp.peer, d->proxyOp.isSend, d->proxyOp.chunkSize, d->proxyOp.pid > 0);
    break;
  case ncclProfileProxyStep: snprintf(t, sizeof t, "ProxyStep rank=%d step=%d", d->rank, d->proxyStep.step); break;
#if PROFILER_VERSION >= 3
  case ncclProfileNetPlugin:
    fntcp = d->netPlugin.id == FNTCP_EVENT && d->netPlugin.data;
    if (fntcp) {
      snprintf(t, sizeof t, "NetPlugin rank=%d fntcp send=%d", d->rank, ((struct fntcp_event*)d->netPlugin.data)->send);
    } else if (d->netPlugin.id == (NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER) && d->netPlugin.data) {
      const ncclProfilerNetSockDescr_v1_t* sd = d->netPlugin.data;
      char thread[16] = "";
      pthread_getname_np(pthread_self(), thread, sizeof thread);
      snprintf(t, sizeof t, "NetPlugin rank=%d sock fd_ok=%d op=%d length=%zu helper=%d", d->rank, sd->sock.fd >= 0,
               sd->sock.op, sd->sock.length, strncmp(thread, "fn-net-help", 11) == 0);
    } else {
      snprintf(t, sizeof t, "NetPlugin rank=%d id=%#llx", d->rank, (unsigned long long)d->netPlugin.id);
    }
    break;
#endif
  default: snprintf(t, sizeof t, "Type%d", (int)d->type);
  }
  add(h, d->parentObj, t, fntcp);
  return ncclSuccess;
}

static ncclResult_t stop(void* h) {
  if (!h) return ncclInvalidArgument;
  pthread_mutex_lock(&lock);
  ((ev_t*)h)->stopped++;
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static ncclResult_t record(void* h, ncclProfilerEventState_t s, args_t* a) {
#if PROFILER_VERSION < 4
  (void)s;
#endif
  if (!h) return ncclInvalidArgument;
  pthread_mutex_lock(&lock);
  ev_t* e = (ev_t*)h;
  e->nstates++;
#if PROFILER_VERSION >= 4
  if (a && e->fntcp && s == ncclProfilerNetPluginUpdate) e->last_bytes = ((struct fntcp_event*)a->netPlugin.data)->bytes;
  else if (a) e->last_bytes = a->proxyStep.transSize;
#else
  if (a) e->last_bytes = a->proxyOp.transSize;
#endif
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

static ncclResult_t fini(void* ctx) {
  if (ctx != &ctx_token) return ncclInternalError;
  const char* path = getenv("TEST_PROFILER_OUT");
  pthread_mutex_lock(&lock);
  FILE* f = path ? fopen(path, "a") : stderr;
  if (f) {
    /* A line per write: processes appending to one file keep their lines whole. */
    setvbuf(f, NULL, _IOLBF, 0);
    for (int i = 0; i < nevents; i++) {
      ev_t* e = &events[i];
      if (!e->used) continue;
      if (e->parent >= 0) fprintf(f, "%d %ld %s stopped=%d states=%d bytes=%zu\n", i, e->parent, e->text, e->stopped, e->nstates, e->last_bytes);
      else fprintf(f, "%d - %s stopped=%d states=%d bytes=%zu\n", i, e->text, e->stopped, e->nstates, e->last_bytes);
      e->used = 0;
    }
    if (f != stderr) fclose(f);
  }
  pthread_mutex_unlock(&lock);
  return ncclSuccess;
}

#if PROFILER_VERSION == 5
static ncclResult_t init5(void** ctx, uint64_t id, int* mask, const char* name, int nnodes, int nranks, int rank,
                          ncclDebugLogger_t log) {
  (void)id; (void)name; (void)rank;
  if (nnodes < 1 || nranks < 1 || !log) return ncclInternalError;
  return init_common(ctx, mask);
}
const ncclProfiler_v5_t ncclProfiler_v5 = {"fnprof5", init5, start, stop, record, fini};
#elif PROFILER_VERSION == 4
static ncclResult_t init4(void** ctx, int* mask, const char* name, uint64_t hash, int nnodes, int nranks, int rank,
                          ncclDebugLogger_t log) {
  (void)name; (void)hash; (void)rank;
  if (nnodes < 1 || nranks < 1 || !log) return ncclInternalError;
  return init_common(ctx, mask);
}
const ncclProfiler_v4_t ncclProfiler_v4 = {"fnprof4", init4, start, stop, record, fini};
#elif PROFILER_VERSION == 3
const ncclProfiler_v3_t ncclProfiler_v3 = {"fnprof3", init_common, start, stop, record, fini};
#elif PROFILER_VERSION == 2
const ncclProfiler_v2_t ncclProfiler_v2 = {"fnprof2", init_common, start, stop, record, fini};
#else
const ncclProfiler_v1_t ncclProfiler_v1 = {"fnprof1", init_common, start, stop, record, fini};
#endif
