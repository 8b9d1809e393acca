/* What the test net plugin (net_plugin_tcp.c) tells a profiler of each request, as the
 * netPlugin.data of its events of type and version FNTCP_EVENT: the test profiler plugin
 * (profiler_plugin.c) reads it, as NCCL's profilers read the descriptors of NCCL's own nets. */
#ifndef FNTCP_EVENT_H
#define FNTCP_EVENT_H
#include <stddef.h>

#define FNTCP_EVENT ((7 << 16) | 1)
struct fntcp_event {
  int send;
  size_t bytes;
};
#endif
