/*
 * A small C application linked the way users link NCCL:
 *     cc link_app.c -I include -L target/release -lnccl
 * Driven by tests/clink.rs. It needs no GPU: it only calls what NCCL answers without one, and
 * expects exactly what NVIDIA NCCL 2.28.9 returns for each call. Prints one line per check and
 * exits non-zero if any failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

static int failures = 0, passes = 0;

#define CHECK(cond, ...)                          \
  do {                                            \
    if (cond) {                                   \
      passes++;                                   \
    } else {                                      \
      failures++;                                 \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
    }                                             \
  } while (0)

#define EXPECT_RESULT(call, want)                                                             \
  do {                                                                                        \
    ncclResult_t got_ = (call);                                                               \
    CHECK(got_ == (want), "%s returned %d (%s), expected %d (%s)", #call, (int)got_,          \
          ncclGetErrorString(got_), (int)(want), ncclGetErrorString(want));                   \
  } while (0)

int main(void) {
  /* Which library answered: the test checks it is the one it built. */
  Dl_info info;
  if (dladdr((void*)&ncclGetVersion, &info) && info.dli_fname) printf("library: %s\n", info.dli_fname);

  /* Version: the same code the header advertises, through both names. */
  int version = -1;
  EXPECT_RESULT(ncclGetVersion(&version), ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE && version == 22809, "ncclGetVersion gave %d, expected 22809", version);
  version = -1;
  EXPECT_RESULT(pncclGetVersion(&version), ncclSuccess);
  CHECK(version == 22809, "pncclGetVersion gave %d, expected 22809", version);
  EXPECT_RESULT(ncclGetVersion(NULL), ncclInvalidArgument);
  printf("version: %d\n", version);

  /* A distinct, non-empty text for every result code, and a text even for unknown codes. */
  {
    const char* texts[ncclNumResults];
    int r, s;
    for (r = ncclSuccess; r < ncclNumResults; r++) {
      texts[r] = ncclGetErrorString((ncclResult_t)r);
      CHECK(texts[r] != NULL && texts[r][0] != '\0', "ncclGetErrorString(%d) is NULL or empty", r);
      printf("error string %d: %s\n", r, texts[r] ? texts[r] : "(null)");
    }
    for (r = 0; r < ncclNumResults; r++)
      for (s = r + 1; s < ncclNumResults; s++)
        CHECK(texts[r] == NULL || texts[s] == NULL || strcmp(texts[r], texts[s]) != 0,
              "ncclGetErrorString(%d) and (%d) are both \"%s\"", r, s, texts[r]);
    {
      const char* unknown = ncclGetErrorString((ncclResult_t)1234);
      CHECK(unknown != NULL && unknown[0] != '\0', "ncclGetErrorString(1234) is NULL or empty");
      printf("error string 1234: %s\n", unknown ? unknown : "(null)");
    }
  }

  /* Argument errors: NULL communicators are rejected with ncclInvalidArgument, and the reason
   * is kept for ncclGetLastError. */
  {
    int n = -7, rank = -7, dev = -7;
    ncclResult_t async = ncclSuccess;
    const char* last;
    EXPECT_RESULT(ncclCommCount(NULL, &n), ncclInvalidArgument);
    CHECK(n == -7, "ncclCommCount(NULL, &n) wrote %d into n", n);
    last = ncclGetLastError(NULL);
    CHECK(last != NULL && last[0] != '\0', "ncclGetLastError(NULL) is empty after a failed call");
    printf("last error: %s\n", last ? last : "(null)");
    EXPECT_RESULT(pncclCommCount(NULL, &n), ncclInvalidArgument);
    EXPECT_RESULT(ncclCommUserRank(NULL, &rank), ncclInvalidArgument);
    EXPECT_RESULT(ncclCommCuDevice(NULL, &dev), ncclInvalidArgument);
    EXPECT_RESULT(ncclCommGetAsyncError(NULL, &async), ncclInvalidArgument);
    EXPECT_RESULT(ncclAllReduce((const void*)0x1000, (void*)0x2000, 1, ncclFloat32, ncclSum, NULL, NULL),
                  ncclInvalidArgument);
    /* Built-in operators cannot be destroyed. */
    EXPECT_RESULT(ncclRedOpDestroy(ncclSum, NULL), ncclInvalidArgument);
  }

  /* Groups: an empty group is fine; ncclGroupEnd outside a group is a usage error. */
  EXPECT_RESULT(ncclGroupStart(), ncclSuccess);
  EXPECT_RESULT(ncclGroupEnd(), ncclSuccess);
  EXPECT_RESULT(ncclGroupEnd(), ncclInvalidUsage);

  printf("link_app: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
