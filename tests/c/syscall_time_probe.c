/* What tests/syscall_time.rs runs under benches/syscall_time.c: CALLS times, an all-reduce (the
 * stub library's, which does nothing) and then MSG bytes sent from a second thread to this one over
 * a loopback TCP connection, the receiver looking once before anything was sent. Ends in _exit, as
 * the benchmark's ranks do. The stub: built from this file with -DSTUB as a shared library. */
#ifdef STUB
#include <stddef.h>
int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* comm, void* st) {
  (void)s, (void)r, (void)n, (void)t, (void)op, (void)comm, (void)st;
  return 0;
}
#else
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define CALLS 3
#define MSG (256 * 1024)

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* comm, void* st);

static int tx;
static pthread_barrier_t go;
static char out[MSG], in[MSG];

static void die(const char* what) {
  perror(what);
  _exit(1);
}

static void* sender(void* arg) {
  (void)arg;
  for (int k = 0; k < CALLS; k++) {
    pthread_barrier_wait(&go);
    for (size_t off = 0; off < MSG;) {
      ssize_t n = send(tx, out + off, MSG - off, MSG_NOSIGNAL);
      if (n <= 0) die("send");
      off += (size_t)n;
    }
    pthread_barrier_wait(&go);
  }
  return NULL;
}

int main(void) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) || listen(l, 1) || getsockname(l, (struct sockaddr*)&a, &al)) die("listen");
  tx = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(tx, (struct sockaddr*)&a, sizeof a)) die("connect");
  int rx = accept(l, NULL, NULL);
  if (rx < 0) die("accept");
  pthread_barrier_init(&go, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, sender, NULL);
  char b;
  if (recv(rx, &b, 1, MSG_DONTWAIT) != -1 || errno != EAGAIN) die("a look at an empty socket");
  for (int k = 0; k < CALLS; k++) {
    ncclAllReduce(NULL, NULL, 0, 0, 0, NULL, NULL);
    pthread_barrier_wait(&go);
    for (size_t off = 0; off < MSG;) {
      ssize_t n = recv(rx, in + off, MSG - off, 0);
      if (n <= 0) die("recv");
      off += (size_t)n;
    }
    pthread_barrier_wait(&go);
  }
  pthread_join(t, NULL);
  _exit(0);
}
#endif
