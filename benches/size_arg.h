// size_arg.h: the benchmarks' byte-count arguments, as nccl-tests writes them ("8", "64K", "1M",
// "2G"; powers of 1024). Shared by nccl_bench.cu and net_bench.cu.
#pragma once
#include <stdlib.h>

static size_t parseSize(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return (size_t)v;
}
