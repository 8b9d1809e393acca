// expect.cuh: soft checks for the GPU test programs whose ranks are processes: a failed EXPECT
// names the rank (gRank, set by the rank's process) and the condition, counts in gFailures and
// goes on, so one run reports every failure.
#pragma once

#include <stdio.h>

static int gRank = -1;
static int gFailures = 0;

#define EXPECT(cond, ...)                                    \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "rank %d: FAILED %s: ", gRank, #cond); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      gFailures++;                                           \
    }                                                        \
  } while (0)
