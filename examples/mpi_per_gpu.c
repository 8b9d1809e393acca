/* One process per GPU under mpirun: rank 0 creates the unique id, MPI_Bcast shares it, every
 * rank selects its GPU by local rank, ncclCommInitRank, AllReduce, verify, destroy.
 *
 * Build: mpicc mpi_per_gpu.c -I include -I /usr/local/cuda/include -L target/release -lnccl \
 *           -L /usr/local/cuda/lib64 -lcudart -o mpi_per_gpu
 * Run:   mpirun --allow-run-as-root -np 2 ./mpi_per_gpu [count]   (PASS/FAIL, exit 0/1) */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define MPICHECK(cmd)                                                              \
  do {                                                                             \
    int e = (cmd);                                                                 \
    if (e != MPI_SUCCESS) {                                                        \
      fprintf(stderr, "FAIL %s:%d MPI error %d in %s\n", __FILE__, __LINE__, e, #cmd); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                \
    }                                                                              \
  } while (0)

#define CUDACHECK(cmd)                                                                              \
  do {                                                                                              \
    cudaError_t cudacheck_err_ = (cmd);                                                                          \
    if (cudacheck_err_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "FAIL %s:%d CUDA error '%s' in %s\n", __FILE__, __LINE__, cudaGetErrorString(cudacheck_err_), #cmd); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                 \
    }                                                                                               \
  } while (0)

#define NCCLCHECK(cmd)                                                                              \
  do {                                                                                              \
    ncclResult_t ncclcheck_res_ = (cmd);                                                                         \
    if (ncclcheck_res_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "FAIL %s:%d NCCL error '%s' in %s\n", __FILE__, __LINE__, ncclGetErrorString(ncclcheck_res_), #cmd); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                 \
    }                                                                                               \
  } while (0)

int main(int argc, char** argv) {
  int rank, nranks, nDev;
  MPICHECK(MPI_Init(&argc, &argv));
  MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, &nranks));
  size_t count = argc > 1 ? (size_t)atol(argv[1]) : (size_t)8 * 1024 * 1024 + 5;

  /* Local rank from Open MPI's environment (fallback: global rank); more ranks than GPUs share. */
  const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  int localRank = lr ? atoi(lr) : rank;
  CUDACHECK(cudaGetDeviceCount(&nDev));
  CUDACHECK(cudaSetDevice(localRank % nDev));

  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPICHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));

  float *sendbuff, *recvbuff;
  float* host = (float*)malloc(count * sizeof(float));
  if (!host) { fprintf(stderr, "FAIL: out of host memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
  cudaStream_t s;
  CUDACHECK(cudaMalloc((void**)&sendbuff, count * sizeof(float)));
  CUDACHECK(cudaMalloc((void**)&recvbuff, count * sizeof(float)));
  for (size_t i = 0; i < count; i++) host[i] = (float)(rank + 1) * (float)(1 + i % 5);
  CUDACHECK(cudaMemcpy(sendbuff, host, count * sizeof(float), cudaMemcpyHostToDevice));
  CUDACHECK(cudaMemset(recvbuff, 0xA5, count * sizeof(float)));
  CUDACHECK(cudaStreamCreate(&s));

  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  NCCLCHECK(ncclAllReduce(sendbuff, recvbuff, count, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));

  /* Sum over ranks of (r+1)*(1 + i%5) = n(n+1)/2 * (1 + i%5): exact in float. */
  CUDACHECK(cudaMemcpy(host, recvbuff, count * sizeof(float), cudaMemcpyDeviceToHost));
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = (float)(nranks * (nranks + 1) / 2) * (float)(1 + i % 5);
    if (host[i] != want) {
      if (wrong < 5) fprintf(stderr, "rank %d [%zu]: got %g expected %g\n", rank, i, host[i], want);
      wrong++;
    }
  }
  long total = 0;
  MPICHECK(MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));

  NCCLCHECK(ncclCommDestroy(comm));
  CUDACHECK(cudaFree(sendbuff));
  CUDACHECK(cudaFree(recvbuff));
  CUDACHECK(cudaStreamDestroy(s));
  free(host);
  if (rank == 0)
    printf("mpi_per_gpu: %d ranks, %zu floats, %ld wrong: %s\n", nranks, count, total, total ? "FAIL" : "PASS");
  MPICHECK(MPI_Finalize());
  return total ? 1 : 0;
}
