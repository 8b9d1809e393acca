/* Calls ncclGetVersion through whatever libnccl the build system found and says which file the
 * call landed in, so tests/install.rs can check it is the installed ferronickel. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <nccl.h>

int main(void) {
  int version = 0;
  ncclResult_t rc = ncclGetVersion(&version);
  Dl_info info;
  const char *from = dladdr((void *)ncclGetVersion, &info) && info.dli_fname ? info.dli_fname : "<unknown>";
  printf("ncclGetVersion: %d (%s); header: %d.%d.%d (%d)\n", version, ncclGetErrorString(rc), NCCL_MAJOR, NCCL_MINOR,
         NCCL_PATCH, NCCL_VERSION_CODE);
  printf("library: %s\n", from);
  return rc == ncclSuccess && version == NCCL_VERSION_CODE ? 0 : 1;
}
