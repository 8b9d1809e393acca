/* exit_calls.c: calls into the library from an exit handler, after exit() has destroyed the main
 * thread's thread-locals (glibc runs those destructors before the atexit handlers), as C++ static
 * destructors do (PyTorch's symmetric-memory manager destroys its device communicators from one).
 * Every call must return a result code; none may abort the process. Prints "exit_calls: ok" last. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

static void late(void) {
  /* A group end with no start is an error: the error path records into the group state. */
  ncclResult_t end = ncclGroupEnd();
  ncclResult_t start = ncclGroupStart();
  const char* text = ncclGetLastError(NULL);
  ncclResult_t freed = ncclMemFree(NULL);
  /* A pointer ncclMemAlloc never returned: an argument error, recorded on the way out. */
  ncclResult_t foreign = ncclMemFree((void*)0x1000);
  printf("late: ncclGroupEnd %d, ncclGroupStart %d, ncclMemFree(NULL) %d, ncclMemFree(foreign) %d, last error: %s\n",
         (int)end, (int)start, (int)freed, (int)foreign, text ? text : "(null)");
  if (end != ncclInvalidUsage || start != ncclInvalidUsage || freed != ncclSuccess ||
      foreign != ncclInvalidArgument || text == NULL) {
    printf("exit_calls: FAIL\n");
    fflush(stdout);
    _Exit(1);
  }
  printf("exit_calls: ok\n");
  fflush(stdout);
}

int main(void) {
  /* Use the group state and the last-error copy once, so that both thread-locals exist. */
  if (ncclGroupStart() != ncclSuccess || ncclGroupEnd() != ncclSuccess) return 2;
  (void)ncclGetLastError(NULL);
  atexit(late);
  return 0;
}
