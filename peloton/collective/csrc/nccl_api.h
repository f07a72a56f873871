// The slice of the NCCL and CUDA runtime APIs the runtime calls, always through dlsym.
//
// With the real headers (PELOTON_HAVE_NCCL_H: nccl.h from the nvidia-nccl-cu12/cu13 wheel;
// PELOTON_HAVE_CUDA_H: cuda_runtime_api.h from the toolkit) the types come from them, so the
// compiler checks our function-pointer types against NCCL's own declarations. Without them the
// same ABI-stable declarations are spelled out here, so one build works everywhere and nothing
// links against libnccl or libcudart.
#pragma once

#include <cstddef>

#ifdef PELOTON_HAVE_CUDA_H
#include <cuda_runtime_api.h>
using peloton_cuda_error_t = cudaError_t;
constexpr int kCudaSuccess = cudaSuccess;
constexpr int kCudaNotReady = cudaErrorNotReady;
#else
typedef struct CUstream_st* cudaStream_t;
using peloton_cuda_error_t = int;
constexpr int kCudaSuccess = 0;
constexpr int kCudaNotReady = 600;
#endif

#ifdef PELOTON_HAVE_NCCL_H
#include <nccl.h>
#else
typedef struct ncclComm* ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInProgress = 7 } ncclResult_t;
typedef enum {
  ncclInt32 = 2,
  ncclInt64 = 4,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
#endif
