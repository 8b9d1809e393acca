/*
 * A test net plugin: NCCL's net API over one loopback TCP socket per connection, built by
 * tests/net.rs against ferronickel's own src/transport/net/net_plugin_abi.h. Compiled twice:
 * -DPLUGIN_VERSION=11 exports ncclNetPlugin_v11, -DPLUGIN_VERSION=8 only ncclNetPlugin_v8.
 *
 * Wire format per message: int32 tag, uint64 size, then the payload. Requests of a comm
 * complete in posting order; one buffer per receive (maxRecvs 1). Every failure is logged
 * through the library's logger, naming the peer, and returned as an error code.
 *
 * v11 reports each request to the library's profiler callback, as vendors' plugins may: an
 * event of type FNTCP_EVENT under the request's pHandle, started when it is posted, updated with
 * its bytes and stopped when it completes or fails.
 */
#include "net_plugin_abi.h"
#include "fntcp_event.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef PLUGIN_VERSION
#error "build with -DPLUGIN_VERSION=11 or 8"
#endif

#if PLUGIN_VERSION >= 9
typedef size_t size_arg_t;
#else
typedef int size_arg_t;
#endif

#define MAGIC 0x46544350u /* "FTCP" */
#define NREQ NCCL_NET_MAX_REQUESTS

static ncclDebugLogger_t logger;
static ncclProfilerCallback_t prof_cb;
#define LOG(level, ...) do { if (logger) logger(level, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); } while (0)

struct handle { uint32_t magic; struct sockaddr_in addr; };
struct listen_comm { int fd; };

struct comm;
struct request {
  struct comm* comm;
  int used, send, done;
  char* data;
  size_t cap;  /* recv: buffer size; send: message size */
  int tag;
  unsigned char hdr[12];
  size_t hdr_done, done_bytes, size;
  void* event; /* the profiler's handle of this request's event, or NULL */
  struct fntcp_event info;
};

struct comm {
  int fd, failed;
  char peer[64];
  struct request reqs[NREQ];
  int order[NREQ], head, count; /* FIFO of request indices */
};

static ncclResult_t plugin_devices(int* n) { *n = 1; return ncclSuccess; }

static void describe(int fd, char* out, size_t n) {
  struct sockaddr_in a; socklen_t l = sizeof(a);
  if (getpeername(fd, (struct sockaddr*)&a, &l) == 0) snprintf(out, n, "%s:%d", inet_ntoa(a.sin_addr), ntohs(a.sin_port));
  else snprintf(out, n, "(unknown peer)");
}

static ncclResult_t do_listen(int dev, void* handle, void** listenComm) {
  (void)dev;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ncclSystemError;
  struct handle* h = (struct handle*)handle;
  memset(h, 0, sizeof(*h));
  h->magic = MAGIC;
  h->addr.sin_family = AF_INET;
  h->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof(h->addr);
  if (bind(fd, (struct sockaddr*)&h->addr, l) || listen(fd, 64) || getsockname(fd, (struct sockaddr*)&h->addr, &l)) {
    close(fd);
    return ncclSystemError;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  struct listen_comm* c = calloc(1, sizeof(*c));
  c->fd = fd;
  *listenComm = c;
  return ncclSuccess;
}

static struct comm* new_comm(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, O_NONBLOCK);
  struct comm* c = calloc(1, sizeof(*c));
  c->fd = fd;
  describe(fd, c->peer, sizeof(c->peer));
  return c;
}

static ncclResult_t do_connect(void* handle, void** sendComm) {
  struct handle* h = (struct handle*)handle;
  if (h->magic != MAGIC) return ncclInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ncclSystemError;
  if (connect(fd, (struct sockaddr*)&h->addr, sizeof(h->addr))) {
    LOG(NCCL_LOG_WARN, "fn-tcp: connect failed: %s", strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  *sendComm = new_comm(fd);
  return ncclSuccess;
}

static ncclResult_t plugin_accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** dev) {
  (void)dev;
  struct listen_comm* l = listenComm;
  *recvComm = NULL;
  int fd = accept(l->fd, NULL, NULL);
  if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? ncclSuccess : ncclSystemError;
  *recvComm = new_comm(fd);
  return ncclSuccess;
}

static ncclResult_t plugin_regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm; (void)data; (void)size;
  if (type != NCCL_PTR_HOST) return ncclInternalError;
  *mhandle = (void*)1;
  return ncclSuccess;
}
static ncclResult_t plugin_regMrDmaBuf(void* c, void* d, size_t s, int t, uint64_t o, int fd, void** m) {
  (void)c; (void)d; (void)s; (void)t; (void)o; (void)fd; (void)m;
  return ncclInternalError;
}
static ncclResult_t plugin_deregMr(void* comm, void* mhandle) { (void)comm; (void)mhandle; return ncclSuccess; }

static struct request* new_req(struct comm* c) {
  if (c->count == NREQ) return NULL;
  for (int i = 0; i < NREQ; i++) {
    if (!c->reqs[i].used) {
      struct request* r = &c->reqs[i];
      memset(r, 0, sizeof(*r));
      r->used = 1;
      r->comm = c;
      c->order[(c->head + c->count++) % NREQ] = i;
      return r;
    }
  }
  return NULL;
}

static void event_start(struct request* r, void* ph) {
  r->info.send = r->send;
  if (prof_cb && ph) prof_cb(&r->event, ncclProfilerNetEventStart, ph, FNTCP_EVENT, &r->info);
}

/* Sends report their bytes and stop in one call, receives in two, so both ways are exercised. */
static void event_end(struct request* r) {
  if (!prof_cb || !r->event) return;
  r->info.bytes = r->done_bytes;
  if (r->send) {
    prof_cb(&r->event, ncclProfilerNetEventUpdateAndStop, NULL, 0, &r->info);
  } else {
    prof_cb(&r->event, ncclProfilerNetEventUpdate, NULL, 0, &r->info);
    prof_cb(&r->event, ncclProfilerNetEventStop, NULL, 0, NULL);
  }
  r->event = NULL;
}

static ncclResult_t post_send(void* sendComm, void* data, size_t size, int tag, void* ph, void** request) {
  struct comm* c = sendComm;
  if (c->failed) return ncclRemoteError;
  struct request* r = new_req(c);
  *request = r;
  if (!r) return ncclSuccess;
  r->send = 1; r->data = data; r->size = size; r->tag = tag;
  int32_t t = tag; uint64_t s = size;
  memcpy(r->hdr, &t, 4); memcpy(r->hdr + 4, &s, 8);
  event_start(r, ph);
  return ncclSuccess;
}

static ncclResult_t post_recv(void* recvComm, int n, void** data, size_t size, int tag, void* ph, void** request) {
  struct comm* c = recvComm;
  if (n != 1) return ncclInternalError;
  if (c->failed) return ncclRemoteError;
  struct request* r = new_req(c);
  *request = r;
  if (!r) return ncclSuccess;
  r->data = data[0]; r->cap = size; r->tag = tag;
  event_start(r, ph);
  return ncclSuccess;
}

/* Moves the head request forward; 1 while more may be possible, 0 when blocked, -1 on error. */
static int step(struct comm* c) {
  if (c->count == 0) return 0;
  struct request* r = &c->reqs[c->order[c->head]];
  while (r->hdr_done < sizeof(r->hdr)) {
    ssize_t k = r->send ? send(c->fd, r->hdr + r->hdr_done, sizeof(r->hdr) - r->hdr_done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->fd, r->hdr + r->hdr_done, sizeof(r->hdr) - r->hdr_done, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k <= 0) {
      LOG(NCCL_LOG_WARN, "fn-tcp: peer %s closed the connection or failed (%s) between messages", c->peer, k ? strerror(errno) : "EOF");
      return -1;
    }
    r->hdr_done += (size_t)k;
    if (!r->send && r->hdr_done == sizeof(r->hdr)) {
      int32_t t; uint64_t s;
      memcpy(&t, r->hdr, 4); memcpy(&s, r->hdr + 4, 8);
      if (t != r->tag) { LOG(NCCL_LOG_WARN, "fn-tcp: peer %s sent tag %d, the receive expects tag %d", c->peer, t, r->tag); return -1; }
      if (s > r->cap) { LOG(NCCL_LOG_WARN, "fn-tcp: peer %s sent %llu bytes into a %zu-byte buffer", c->peer, (unsigned long long)s, r->cap); return -1; }
      r->size = s;
    }
  }
  while (r->done_bytes < r->size) {
    ssize_t k = r->send ? send(c->fd, r->data + r->done_bytes, r->size - r->done_bytes, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->fd, r->data + r->done_bytes, r->size - r->done_bytes, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k <= 0) {
      LOG(NCCL_LOG_WARN, "fn-tcp: peer %s closed the connection mid-message (%zu of %zu bytes): %s", c->peer, r->done_bytes, r->size,
          k ? strerror(errno) : "EOF");
      return -1;
    }
    r->done_bytes += (size_t)k;
  }
  r->done = 1;
  event_end(r);
  c->head = (c->head + 1) % NREQ;
  c->count--;
  return 1;
}

static ncclResult_t plugin_test(void* request, int* done, int* sizes) {
  struct request* r = request;
  struct comm* c = r->comm;
  *done = 0;
  int s;
  while (!c->failed && (s = step(c)) != 0) {
    if (s < 0) c->failed = 1;
  }
  if (r->done) {
    *done = 1;
    if (sizes) sizes[0] = (int)r->size;
    r->used = 0;
    return ncclSuccess;
  }
  if (c->failed) { event_end(r); r->used = 0; return ncclRemoteError; }
  return ncclSuccess;
}

static ncclResult_t plugin_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)recvComm; (void)n; (void)data; (void)sizes; (void)mhandles;
  *request = NULL;
  return ncclSuccess;
}

/* Strict, as vendors' plugins are: closing a comm with requests still posted is the caller's bug. */
static ncclResult_t close_comm(void* comm) {
  struct comm* c = comm;
  int used = 0;
  for (int i = 0; i < NREQ; i++) {
    used += c->reqs[i].used;
    if (c->reqs[i].used) event_end(&c->reqs[i]);
  }
  if (used) LOG(NCCL_LOG_WARN, "fn-tcp: closing the comm of peer %s with %d request(s) in flight", c->peer, used);
  close(c->fd);
  free(c);
  return ncclSuccess;
}
static ncclResult_t plugin_closeListen(void* comm) {
  struct listen_comm* l = comm;
  close(l->fd);
  free(l);
  return ncclSuccess;
}

/* The link it reports, which the tuner prices NET by: -DPLUGIN_SPEED=<Mbps>, -DPLUGIN_LATENCY=<us>,
 * -DPLUGIN_MAX_COMMS=<n> change it. */
#ifndef PLUGIN_SPEED
#define PLUGIN_SPEED 10000
#endif
#ifndef PLUGIN_LATENCY
#define PLUGIN_LATENCY 0
#endif
#ifndef PLUGIN_MAX_COMMS
#define PLUGIN_MAX_COMMS 1024
#endif

static void fill_props(int dev, char** name, char** pci, uint64_t* guid, int* ptr, int* speed, float* latency,
                       int* maxComms, int* maxRecvs) {
  *name = "fn-tcp-lo"; *pci = NULL; *guid = (uint64_t)dev; *ptr = NCCL_PTR_HOST; *speed = PLUGIN_SPEED;
  *latency = PLUGIN_LATENCY; *maxComms = PLUGIN_MAX_COMMS; *maxRecvs = 1;
}

static void say_hello(void) {
  LOG(NCCL_LOG_INFO, "fn-tcp plugin v%d up: %s, %.2f, %lld, %c", PLUGIN_VERSION, "loopback", 2.5, 1LL << 40, 'k');
}

#if PLUGIN_VERSION == 11
static ncclResult_t plugin_init(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t log,
                                ncclProfilerCallback_t prof) {
  prof_cb = prof;
  logger = log;
  *ctx = malloc(sizeof(int));
  if (config->trafficClass != NCCL_NET_TRAFFIC_CLASS_UNDEF) return ncclInvalidArgument;
  say_hello();
  LOG(NCCL_LOG_INFO, "fn-tcp plugin context for comm %#llx", (unsigned long long)commId);
  return ncclSuccess;
}
static ncclResult_t plugin_finalize(void* ctx) { free(ctx); return ncclSuccess; }
static ncclResult_t plugin_getProperties(int dev, ncclNetProperties_v11_t* p) {
  memset(p, 0, sizeof(*p));
  fill_props(dev, &p->name, &p->pciPath, &p->guid, &p->ptrSupport, &p->speed, &p->latency, &p->maxComms, &p->maxRecvs);
  p->maxP2pBytes = (size_t)1 << 40; p->maxCollBytes = (size_t)1 << 30; p->maxMultiRequestSize = 1;
  p->vProps.ndevs = 1; p->vProps.devs[0] = dev;
  return ncclSuccess;
}
static ncclResult_t plugin_listen(void* ctx, int dev, void* handle, void** listenComm) {
  if (!ctx) return ncclInvalidArgument;
  return do_listen(dev, handle, listenComm);
}
static ncclResult_t plugin_connect(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** d) {
  (void)dev; (void)d;
  if (!ctx) return ncclInvalidArgument;
  return do_connect(handle, sendComm);
}
static ncclResult_t plugin_isend(void* c, void* data, size_t size, int tag, void* mh, void* ph, void** req) {
  (void)mh;
  return post_send(c, data, size, tag, ph, req);
}
static ncclResult_t plugin_irecv(void* c, int n, void** data, size_t* sizes, int* tags, void** mh, void** ph, void** req) {
  (void)mh;
  return post_recv(c, n, data, sizes[0], tags[0], ph ? ph[0] : NULL, req);
}
const ncclNet_v11_t ncclNetPlugin_v11 = {
  .name = "FnTcp11",
  .init = plugin_init, .devices = plugin_devices, .getProperties = plugin_getProperties,
  .listen = plugin_listen, .connect = plugin_connect, .accept = plugin_accept,
  .regMr = plugin_regMr, .regMrDmaBuf = plugin_regMrDmaBuf, .deregMr = plugin_deregMr,
  .isend = plugin_isend, .irecv = plugin_irecv, .iflush = plugin_iflush, .test = plugin_test,
  .closeSend = close_comm, .closeRecv = close_comm, .closeListen = plugin_closeListen,
  .finalize = plugin_finalize,
};
#elif PLUGIN_VERSION == 8
static ncclResult_t plugin_init(ncclDebugLogger_t log) { logger = log; say_hello(); return ncclSuccess; }
static ncclResult_t plugin_getProperties(int dev, ncclNetProperties_v8_t* p) {
  memset(p, 0, sizeof(*p));
  fill_props(dev, &p->name, &p->pciPath, &p->guid, &p->ptrSupport, &p->speed, &p->latency, &p->maxComms, &p->maxRecvs);
  return ncclSuccess;
}
static ncclResult_t plugin_listen(int dev, void* handle, void** listenComm) { return do_listen(dev, handle, listenComm); }
static ncclResult_t plugin_connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** d) {
  (void)dev; (void)d;
  return do_connect(handle, sendComm);
}
static ncclResult_t plugin_isend(void* c, void* data, size_arg_t size, int tag, void* mh, void** req) {
  (void)mh;
  if (size < 0) return ncclInvalidArgument;
  return post_send(c, data, (size_t)size, tag, NULL, req);
}
static ncclResult_t plugin_irecv(void* c, int n, void** data, size_arg_t* sizes, int* tags, void** mh, void** req) {
  (void)mh;
  return post_recv(c, n, data, (size_t)sizes[0], tags[0], NULL, req);
}
const ncclNet_v8_t ncclNetPlugin_v8 = {
  .name = "FnTcp8",
  .init = plugin_init, .devices = plugin_devices, .getProperties = plugin_getProperties,
  .listen = plugin_listen, .connect = plugin_connect, .accept = plugin_accept,
  .regMr = plugin_regMr, .regMrDmaBuf = plugin_regMrDmaBuf, .deregMr = plugin_deregMr,
  .isend = plugin_isend, .irecv = plugin_irecv, .iflush = plugin_iflush, .test = plugin_test,
  .closeSend = close_comm, .closeRecv = close_comm, .closeListen = plugin_closeListen,
};
#else
#error "PLUGIN_VERSION must be 11 or 8"
#endif
