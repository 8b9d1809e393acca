/* A CUPTI injection library for telling a collective's time apart into its launch, the skew between
 * the ranks' kernel starts, and the time inside the kernel, under NVIDIA's NCCL and under
 * ferronickel alike, without changing either library. CUDA loads it at cuInit when
 * CUDA_INJECTION64_PATH names it, and calls its InitializeInjection, which turns on CUPTI's activity
 * records of kernels (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, so kernels on different streams are
 * not serialized) and, with KERNEL_TRACE_API=1, of the driver API calls that launch them
 * (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz
 * forms; KERNEL_TRACE_API=all keeps every driver API call). Records are kept in memory (at most
 * 4M, the rest counted as dropped). At the process's first cudaProfilerStop (cuProfilerStop), or
 * else at exit after main returns, it forces CUPTI to flush and writes the process's records to
 * $KERNEL_TRACE_DIR/kt.<pid>.txt (default: the working directory), once, one line each:
 *   P <pid> <hostname> <NCCL_HOSTID or -> <OMPI_COMM_WORLD_RANK, else RANK, or ->
 *   K <start> <end> <deviceId> <streamId> <correlationId> <gridX> <blockX> <name>
 *   A <start> <end> <correlationId> <cbid> <threadId>
 *   D <records dropped, by CUPTI or over the cap>
 *   C <CLOCK_REALTIME> <CLOCK_MONOTONIC> (read back to back, ns: to set other tools' monotonic
 *     stamps, such as benches/proxy_timeline.c's, beside these)
 * An A line is a driver API call on the CPU, and the K line with the same correlationId is the
 * kernel it launched. Times in ns, CUPTI's: its header says that on Linux it stamps CPU events with
 * clock_gettime(CLOCK_REALTIME) and converts the GPU's kernel timestamps to that clock by linear
 * interpolation (see cuptiGetTimestamp and cuptiActivityRegisterTimestampCallback in
 * cupti_activity.h), so the times of the processes of one machine can be compared; across
 * machines only as well as their clocks agree. A kernel still running at the flush may show
 * start or end 0. A process killed by a signal, or ending in _exit without a cudaProfilerStop
 * before it (benches/net_bench.cu's ranks call it last), writes nothing.
 * scripts/kernel_trace.py reads the files. Build (CUPTI 13 headers; a pip wheel names its library
 * libcupti.so.13, so write -l:libcupti.so.13 there):
 *   gcc -shared -fPIC -O2 -I<cupti include> -I<cuda include> -o libkernel_trace.so benches/kernel_trace.c \
 *     -L<cupti lib> -lcupti -Wl,-rpath,<cupti lib>
 * and run with CUDA_INJECTION64_PATH=<that file> [KERNEL_TRACE_DIR=<dir>] [KERNEL_TRACE_API=1].
 * Not for production: it keeps every record. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cupti.h>

#if CUPTI_API_VERSION < 130000
#error "kernel_trace.c reads kernel records as CUpti_ActivityKernel10, CUPTI 13's"
#endif

#define BUF_SIZE (8u << 20)
#define MAX_RECORDS (1L << 22)
#define NAME_SLOTS 8192

typedef struct {
  char kind; /* 'K' or 'A' */
  uint64_t start, end;
  uint32_t dev, stream, corr, cbid, tid;
  int32_t grid_x, block_x;
  const char* name;
} rec_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static rec_t* recs;
static long nrecs, cap_recs;
static unsigned long long dropped;
static int api_mode; /* 0 off, 1 launches, 2 every driver call */
static int done;
static pid_t init_pid;
static struct {
  const char* key;
  char* copy;
} names[NAME_SLOTS];

static int check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return 0;
  const char* s = NULL;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "?";
  fprintf(stderr, "kernel_trace: %s failed: %s (%d)\n", what, s, (int)r);
  return -1;
}

/* CUPTI shares a kernel's name among its records; keep a copy that outlives CUPTI's. */
static const char* intern(const char* name) {
  if (!name) return "?";
  size_t h = ((uintptr_t)name >> 3) % NAME_SLOTS;
  for (int i = 0; i < NAME_SLOTS; i++, h = (h + 1) % NAME_SLOTS) {
    if (names[h].key == name) return names[h].copy;
    if (!names[h].key) {
      char* c = strdup(name);
      if (!c) return "?";
      names[h].key = name;
      names[h].copy = c;
      return c;
    }
  }
  char* c = strdup(name); /* table full: a copy per record */
  return c ? c : "?";
}

static rec_t* push(void) {
  if (nrecs >= MAX_RECORDS) return NULL;
  if (nrecs == cap_recs) {
    long n = cap_recs ? cap_recs * 2 : 1 << 16;
    if (n > MAX_RECORDS) n = MAX_RECORDS;
    rec_t* r = realloc(recs, (size_t)n * sizeof(rec_t));
    if (!r) return NULL;
    recs = r;
    cap_recs = n;
  }
  return &recs[nrecs++];
}

static int is_launch(uint32_t cbid) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz:
      return 1;
    default:
      return 0;
  }
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = NULL;
  if (posix_memalign(&p, 8, BUF_SIZE) != 0) p = NULL;
  if (!p) fprintf(stderr, "kernel_trace: no memory for a CUPTI buffer\n");
  *buffer = p;
  *size = p ? BUF_SIZE : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)ctx; (void)stream; (void)size;
  CUpti_Activity* a = NULL;
  pthread_mutex_lock(&lock);
  while (!done && valid > 0) {
    CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &a);
    if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    if (check(r, "cuptiActivityGetNextRecord")) break;
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)a;
      rec_t* e = push();
      if (!e) { dropped++; continue; }
      *e = (rec_t){.kind = 'K', .start = k->start, .end = k->end, .dev = k->deviceId, .stream = k->streamId,
                   .corr = k->correlationId, .grid_x = k->gridX, .block_x = k->blockX, .name = intern(k->name)};
    } else if (a->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const CUpti_ActivityAPI* d = (const CUpti_ActivityAPI*)a;
      if (api_mode == 1 && !is_launch((uint32_t)d->cbid)) continue;
      rec_t* e = push();
      if (!e) { dropped++; continue; }
      *e = (rec_t){.kind = 'A', .start = d->start, .end = d->end, .corr = d->correlationId,
                   .cbid = (uint32_t)d->cbid, .tid = d->threadId};
    }
  }
  size_t n = 0;
  if (!done && !check(cuptiActivityGetNumDroppedRecords(ctx, stream, &n), "cuptiActivityGetNumDroppedRecords"))
    dropped += n;
  pthread_mutex_unlock(&lock);
  free(buffer);
}

/* Hostnames and environment values go into one space-separated field each. */
static void put_field(FILE* f, const char* s) {
  fputc(' ', f);
  if (!s || !*s) { fputc('-', f); return; }
  for (; *s; s++) fputc((*s == ' ' || *s == '\t' || *s == '\n') ? '_' : *s, f);
}

static void write_trace(void) {
  static int written;
  if (getpid() != init_pid) return; /* a forked child has its parent's records */
  if (__atomic_exchange_n(&written, 1, __ATOMIC_ACQ_REL)) return;
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  pthread_mutex_lock(&lock);
  done = 1;
  const char* dir = getenv("KERNEL_TRACE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/kt.%d.txt", dir && *dir ? dir : ".", (int)getpid());
  FILE* f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    pthread_mutex_unlock(&lock);
    return;
  }
  char host[256] = "?";
  if (gethostname(host, sizeof host) != 0) strcpy(host, "?");
  host[sizeof host - 1] = 0;
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  if (!rank || !*rank) rank = getenv("RANK");
  fprintf(f, "P %d", (int)getpid());
  put_field(f, host);
  put_field(f, getenv("NCCL_HOSTID"));
  put_field(f, rank);
  fputc('\n', f);
  for (long i = 0; i < nrecs; i++) {
    const rec_t* e = &recs[i];
    if (e->kind == 'K')
      fprintf(f, "K %llu %llu %u %u %u %d %d %s\n", (unsigned long long)e->start, (unsigned long long)e->end, e->dev,
              e->stream, e->corr, e->grid_x, e->block_x, e->name);
    else
      fprintf(f, "A %llu %llu %u %u %u\n", (unsigned long long)e->start, (unsigned long long)e->end, e->corr, e->cbid,
              e->tid);
  }
  fprintf(f, "D %llu\n", dropped);
  struct timespec rt, mono;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  fprintf(f, "C %lld %lld\n", (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec,
          (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec);
  if (fclose(f) != 0) fprintf(stderr, "kernel_trace: error writing %s\n", path);
  pthread_mutex_unlock(&lock);
}

/* cuProfilerStop's exit: a process that ends in _exit (net_bench's forked ranks) writes here. */
static void CUPTIAPI on_profiler_stop(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  (void)user; (void)domain; (void)cbid;
  if (((const CUpti_CallbackData*)data)->callbackSite == CUPTI_API_EXIT) write_trace();
}

__attribute__((visibility("default"))) int InitializeInjection(void) {
  static int initialized;
  if (__atomic_exchange_n(&initialized, 1, __ATOMIC_ACQ_REL)) return 1;
  init_pid = getpid();
  const char* api = getenv("KERNEL_TRACE_API");
  api_mode = !api || !*api || !strcmp(api, "0") ? 0 : !strcmp(api, "all") ? 2 : 1;
  if (check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks"))
    return 1;
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  if (api_mode) {
    check(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM), "cuptiSetThreadIdType");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "cuptiActivityEnable(DRIVER)");
  }
  CUpti_SubscriberHandle sub;
  if (!check(cuptiSubscribe(&sub, on_profiler_stop, NULL), "cuptiSubscribe"))
    check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop),
          "cuptiEnableCallback(cuProfilerStop)");
  if (atexit(write_trace) != 0) fprintf(stderr, "kernel_trace: atexit failed; nothing will be written\n");
  return 1;
}
