/* An LD_PRELOAD shim that times the socket calls a NET proxy makes, under NVIDIA's NCCL and under
 * ferronickel alike (docs/NET.md, "What the proxy's calls cost"): every send, sendmsg, recv and
 * recvmsg of the process, split into calls that moved bytes and looks that moved none (a
 * would-block answer, or a MSG_PEEK), plus sched_yield; and, at the start of every collective
 * (ncclAllReduce, ncclAllGather, ncclReduceScatter, ncclBroadcast, ncclReduce, or an outermost
 * ncclGroupStart), the process's totals so far, so that what one call cost is the difference to
 * the next. At exit (exit or _exit, which the benchmark's ranks end with) it writes
 * $SYSCALL_TIME_DIR/st.<pid>.txt, one line each:
 *   T <thread name> <send ns> <sent bytes> <recv ns> <received bytes> <looks> <look ns> <yields> <yield ns> <cpu ns>
 *     <sends> <receives>
 *   K <index> <t ns> <send ns> <sent bytes> <recv ns> <received bytes> <looks> <look ns> <sends> <receives>
 * (sends and receives: the calls that moved bytes, so that bytes / calls is what one call moved).
 * T: a thread that made such a call and ended before the process, or the one that exits (its CPU
 * time is its whole life's); K: a collective's start,
 * CLOCK_MONOTONIC, with the process's totals at that moment. Nothing is written without
 * SYSCALL_TIME_DIR, or by a process that made no such call. scripts/syscall_time.py reads them.
 * Build:
 *   gcc -shared -fPIC -O2 -o libsyscall_time.so benches/syscall_time.c -ldl
 * Each timed call costs two clock reads (tens of ns): fine for calls that copy KiBs, visible on
 * the smallest steps. Not for production. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { SEND, RECV };

/* What one thread did: the calls that moved bytes, the bytes and the time in them, per direction;
 * looks; yields. */
struct counts {
  unsigned long long ns[2], bytes[2], n[2], looks, look_ns, yields, yield_ns;
};

struct thread_entry {
  char name[20];
  struct counts c;
  unsigned long long cpu_ns;
};

#define MAX_THREADS 512
#define MAX_CALLS 8192

static __thread struct counts mine;
static __thread int registered;
static struct thread_entry ended[MAX_THREADS];
static int nended;
static pthread_mutex_t ended_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t end_key;

/* The process's totals, and a copy of them at each collective's start. */
static struct counts total;
static struct {
  unsigned long long t;
  struct counts c;
} calls[MAX_CALLS];
static unsigned long long ncalls;
static __thread int group_depth;

static ssize_t (*real_send)(int, const void*, size_t, int);
static ssize_t (*real_sendmsg)(int, const struct msghdr*, int);
static ssize_t (*real_recv)(int, void*, size_t, int);
static ssize_t (*real_recvmsg)(int, struct msghdr*, int);
static int (*real_yield)(void);

static unsigned long long clock_ns(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void add(unsigned long long* at, unsigned long long v) { __atomic_fetch_add(at, v, __ATOMIC_RELAXED); }

/* A thread's counts go to `ended` when it ends, and the exiting thread's at exit: a thread still
 * running then (one the process never joined) is left out. */
static void keep(void) {
  if (registered) return;
  registered = 1;
  pthread_setspecific(end_key, (void*)1);
}

static void thread_ended(void* unused) {
  (void)unused;
  pthread_mutex_lock(&ended_lock);
  if (nended < MAX_THREADS) {
    struct thread_entry* e = &ended[nended++];
    prctl(PR_GET_NAME, e->name, 0, 0, 0);
    e->c = mine;
    e->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  }
  pthread_mutex_unlock(&ended_lock);
  registered = 0;
}

static void count(int dir, ssize_t n, unsigned long long ns) {
  keep();
  if (n > 0) {
    mine.ns[dir] += ns;
    mine.bytes[dir] += (unsigned long long)n;
    mine.n[dir]++;
    add(&total.ns[dir], ns);
    add(&total.bytes[dir], (unsigned long long)n);
    add(&total.n[dir], 1);
  } else {
    mine.looks++;
    mine.look_ns += ns;
    add(&total.looks, 1);
    add(&total.look_ns, ns);
  }
}

/* A call that moved nothing is a look, whichever its direction. */
static void look(unsigned long long ns) { count(RECV, 0, ns); }

__attribute__((constructor)) static void init(void) {
  pthread_key_create(&end_key, thread_ended);
  real_send = (ssize_t(*)(int, const void*, size_t, int))dlsym(RTLD_NEXT, "send");
  real_sendmsg = (ssize_t(*)(int, const struct msghdr*, int))dlsym(RTLD_NEXT, "sendmsg");
  real_recv = (ssize_t(*)(int, void*, size_t, int))dlsym(RTLD_NEXT, "recv");
  real_recvmsg = (ssize_t(*)(int, struct msghdr*, int))dlsym(RTLD_NEXT, "recvmsg");
  real_yield = (int (*)(void))dlsym(RTLD_NEXT, "sched_yield");
}

/* Counts a call that started at `t0` and returned `n`; errno as the call left it. */
static ssize_t done(int dir, ssize_t n, unsigned long long t0, int flags) {
  int e = errno;
  unsigned long long ns = clock_ns(CLOCK_MONOTONIC) - t0;
  if (dir == RECV && (flags & MSG_PEEK))
    look(ns);
  else
    count(dir, n, ns);
  errno = e;
  return n;
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  unsigned long long t = clock_ns(CLOCK_MONOTONIC);
  return done(SEND, real_send(fd, buf, len, flags), t, flags);
}

ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  unsigned long long t = clock_ns(CLOCK_MONOTONIC);
  return done(SEND, real_sendmsg(fd, msg, flags), t, flags);
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  unsigned long long t = clock_ns(CLOCK_MONOTONIC);
  return done(RECV, real_recv(fd, buf, len, flags), t, flags);
}

ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  unsigned long long t = clock_ns(CLOCK_MONOTONIC);
  return done(RECV, real_recvmsg(fd, msg, flags), t, flags);
}

int sched_yield(void) {
  unsigned long long t = clock_ns(CLOCK_MONOTONIC);
  int r = real_yield();
  keep();
  mine.yields++;
  mine.yield_ns += clock_ns(CLOCK_MONOTONIC) - t;
  return r;
}

/* A collective starts: the process's totals at this moment. */
static void call_starts(void) {
  unsigned long long k = __atomic_fetch_add(&ncalls, 1, __ATOMIC_RELAXED);
  if (k >= MAX_CALLS) return;
  calls[k].t = clock_ns(CLOCK_MONOTONIC);
  for (int d = 0; d < 2; d++) {
    calls[k].c.ns[d] = __atomic_load_n(&total.ns[d], __ATOMIC_RELAXED);
    calls[k].c.bytes[d] = __atomic_load_n(&total.bytes[d], __ATOMIC_RELAXED);
    calls[k].c.n[d] = __atomic_load_n(&total.n[d], __ATOMIC_RELAXED);
  }
  calls[k].c.looks = __atomic_load_n(&total.looks, __ATOMIC_RELAXED);
  calls[k].c.look_ns = __atomic_load_n(&total.look_ns, __ATOMIC_RELAXED);
}

/* The NCCL entry points, passed through to the library after the snapshot; the types are
 * NCCL's, as the ABI passes them (enums as int, handles as pointers). */
#define NEXT(name)                  \
  static __typeof__(name)* real;    \
  if (!real) real = (__typeof__(name)*)dlsym(RTLD_NEXT, #name)

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* comm, void* st) {
  NEXT(ncclAllReduce);
  if (group_depth == 0) call_starts();
  return real(s, r, n, t, op, comm, st);
}

int ncclReduce(const void* s, void* r, size_t n, int t, int op, int root, void* comm, void* st) {
  NEXT(ncclReduce);
  if (group_depth == 0) call_starts();
  return real(s, r, n, t, op, root, comm, st);
}

int ncclAllGather(const void* s, void* r, size_t n, int t, void* comm, void* st) {
  NEXT(ncclAllGather);
  if (group_depth == 0) call_starts();
  return real(s, r, n, t, comm, st);
}

int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* comm, void* st) {
  NEXT(ncclReduceScatter);
  if (group_depth == 0) call_starts();
  return real(s, r, n, t, op, comm, st);
}

int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* comm, void* st) {
  NEXT(ncclBroadcast);
  if (group_depth == 0) call_starts();
  return real(s, r, n, t, root, comm, st);
}

int ncclGroupStart(void) {
  NEXT(ncclGroupStart);
  if (group_depth++ == 0) call_starts();
  return real();
}

int ncclGroupEnd(void) {
  NEXT(ncclGroupEnd);
  if (group_depth > 0) group_depth--;
  return real();
}

static void write_out(void) {
  static int written;
  const char* dir = getenv("SYSCALL_TIME_DIR");
  if (!dir || written) return;
  written = 1;
  if (registered) thread_ended(NULL);
  if (nended == 0) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/st.%d.txt", dir, (int)getpid());
  FILE* f = fopen(path, "w");
  if (!f) return;
  pthread_mutex_lock(&ended_lock);
  for (int i = 0; i < nended; i++) {
    struct counts* c = &ended[i].c;
    for (char* p = ended[i].name; *p; p++)
      if (*p == ' ') *p = '_';
    fprintf(f, "T %s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", ended[i].name, c->ns[SEND],
            c->bytes[SEND], c->ns[RECV], c->bytes[RECV], c->looks, c->look_ns, c->yields, c->yield_ns, ended[i].cpu_ns,
            c->n[SEND], c->n[RECV]);
  }
  pthread_mutex_unlock(&ended_lock);
  unsigned long long n = ncalls < MAX_CALLS ? ncalls : MAX_CALLS;
  for (unsigned long long k = 0; k < n; k++)
    fprintf(f, "K %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", k, calls[k].t, calls[k].c.ns[SEND],
            calls[k].c.bytes[SEND], calls[k].c.ns[RECV], calls[k].c.bytes[RECV], calls[k].c.looks, calls[k].c.look_ns,
            calls[k].c.n[SEND], calls[k].c.n[RECV]);
  fclose(f);
}

__attribute__((destructor)) static void at_exit(void) { write_out(); }

/* The benchmark's ranks end in _exit, which runs no destructor. */
void _exit(int code) {
  write_out();
  syscall(SYS_exit_group, code);
  __builtin_unreachable();
}
