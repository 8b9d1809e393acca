/* One process drives every GPU: ncclCommInitAll, then ncclGroupStart / one AllReduce per device /
 * ncclGroupEnd, synchronize, and verify every element on the host.
 *
 * Build: cc single_process.c -I include -I /usr/local/cuda/include -L target/release -lnccl \
 *           -L /usr/local/cuda/lib64 -lcudart -o single_process
 * Run:   ./single_process [ngpus] [count]      (prints PASS/FAIL, exit code 0/1) */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDACHECK(cmd)                                                                              \
  do {                                                                                              \
    cudaError_t cudacheck_err_ = (cmd);                                                                          \
    if (cudacheck_err_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "FAIL %s:%d CUDA error '%s' in %s\n", __FILE__, __LINE__, cudaGetErrorString(cudacheck_err_), #cmd); \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

#define NCCLCHECK(cmd)                                                                              \
  do {                                                                                              \
    ncclResult_t ncclcheck_res_ = (cmd);                                                                         \
    if (ncclcheck_res_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "FAIL %s:%d NCCL error '%s' in %s\n", __FILE__, __LINE__, ncclGetErrorString(ncclcheck_res_), #cmd); \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

int main(int argc, char** argv) {
  int nDev = 0;
  CUDACHECK(cudaGetDeviceCount(&nDev));
  if (argc > 1 && atoi(argv[1]) > 0 && atoi(argv[1]) < nDev) nDev = atoi(argv[1]);
  size_t count = argc > 2 ? (size_t)atol(argv[2]) : (size_t)32 * 1024 * 1024 + 3;
  if (nDev < 1) { fprintf(stderr, "FAIL: no GPU\n"); return 1; }

  ncclComm_t* comms = (ncclComm_t*)calloc(nDev, sizeof(ncclComm_t));
  int* devs = (int*)calloc(nDev, sizeof(int));
  float** sendbuff = (float**)calloc(nDev, sizeof(float*));
  float** recvbuff = (float**)calloc(nDev, sizeof(float*));
  cudaStream_t* s = (cudaStream_t*)calloc(nDev, sizeof(cudaStream_t));
  float* host = (float*)malloc(count * sizeof(float));
  if (!comms || !devs || !sendbuff || !recvbuff || !s || !host) { fprintf(stderr, "FAIL: out of host memory\n"); return 1; }

  /* Rank r's input: element i = (r + 1) + (i % 7).  The sum over n ranks is
   * n(n+1)/2 + n*(i % 7): small integers, exact in float. */
  for (int r = 0; r < nDev; r++) {
    devs[r] = r;
    CUDACHECK(cudaSetDevice(r));
    CUDACHECK(cudaMalloc((void**)&sendbuff[r], count * sizeof(float)));
    CUDACHECK(cudaMalloc((void**)&recvbuff[r], count * sizeof(float)));
    for (size_t i = 0; i < count; i++) host[i] = (float)(r + 1) + (float)(i % 7);
    CUDACHECK(cudaMemcpy(sendbuff[r], host, count * sizeof(float), cudaMemcpyHostToDevice));
    CUDACHECK(cudaMemset(recvbuff[r], 0xA5, count * sizeof(float))); /* poison */
    CUDACHECK(cudaStreamCreate(&s[r]));
  }

  NCCLCHECK(ncclCommInitAll(comms, nDev, devs));

  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < nDev; r++)
    NCCLCHECK(ncclAllReduce(sendbuff[r], recvbuff[r], count, ncclFloat, ncclSum, comms[r], s[r]));
  NCCLCHECK(ncclGroupEnd());

  for (int r = 0; r < nDev; r++) {
    CUDACHECK(cudaSetDevice(r));
    CUDACHECK(cudaStreamSynchronize(s[r]));
  }

  size_t wrong = 0;
  for (int r = 0; r < nDev; r++) {
    CUDACHECK(cudaMemcpy(host, recvbuff[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) {
      float want = (float)(nDev * (nDev + 1) / 2) + (float)nDev * (float)(i % 7);
      if (host[i] != want) {
        if (wrong < 5) fprintf(stderr, "rank %d [%zu]: got %g expected %g\n", r, i, host[i], want);
        wrong++;
      }
    }
  }

  for (int r = 0; r < nDev; r++) {
    CUDACHECK(cudaSetDevice(r));
    CUDACHECK(cudaFree(sendbuff[r]));
    CUDACHECK(cudaFree(recvbuff[r]));
    CUDACHECK(cudaStreamDestroy(s[r]));
  }
  for (int r = 0; r < nDev; r++) NCCLCHECK(ncclCommDestroy(comms[r]));

  printf("single_process: %d GPUs, %zu floats, %zu wrong: %s\n", nDev, count, wrong, wrong ? "FAIL" : "PASS");
  free(comms); free(devs); free(sendbuff); free(recvbuff); free(s); free(host);
  return wrong ? 1 : 0;
}
