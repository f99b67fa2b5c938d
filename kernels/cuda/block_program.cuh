// The device side of kernels/cuda/block_program.h: a body runs as a kernel of
// kBlockThreads threads per block, on the current stream, with its shared
// memory opted in above the 48 KiB default. Internal to kernels/cuda.
#ifndef BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_CUH_
#define BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_CUH_

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "kernels/cuda/block_program.h"

namespace ballast::kernels::block_program {

// Host-device so that the bodies' host-device templates may call it; only
// the device code ever runs it.
struct DeviceBlock {
  float* smem;
#if defined(__CUDA_ARCH__)
  __host__ __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __host__ __device__ int threads() const { return static_cast<int>(blockDim.x); }
  __host__ __device__ void sync() const { __syncthreads(); }
#else
  __host__ __device__ int tid() const { return 0; }
  __host__ __device__ int threads() const { return 1; }
  __host__ __device__ void sync() const {}
#endif
};

template <class Body>
__global__ void __launch_bounds__(kBlockThreads) BlockProgramKernel(const Body body) {
  extern __shared__ __align__(16) float smem[];
  body(DeviceBlock{smem}, blockIdx.x, blockIdx.y, blockIdx.z);
}

// The shared memory a block may opt in to on the current device, in bytes.
inline int64_t DeviceSmemOptin() {
  return static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin);
}

// Launches body over grid; `what` names the caller in errors.
struct CudaLaunch {
  const char* what;

  template <class Body>
  void operator()(Grid grid, int64_t smem_floats, const Body& body) const {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    TORCH_CHECK(grid.y <= 65535 && grid.z <= 65535 && grid.x <= 2147483647LL, what, ": grid (",
                grid.x, ", ", grid.y, ", ", grid.z, ") exceeds the CUDA limits");
    const int64_t bytes = smem_floats * static_cast<int64_t>(sizeof(float));
    TORCH_CHECK(bytes <= DeviceSmemOptin(), what, ": a block needs ", bytes,
                " bytes of shared memory, the device allows ", DeviceSmemOptin());
    auto* kernel = BlockProgramKernel<Body>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
    kernel<<<dim3(static_cast<unsigned>(grid.x), static_cast<unsigned>(grid.y),
                  static_cast<unsigned>(grid.z)),
             kBlockThreads, static_cast<size_t>(bytes), c10::cuda::getCurrentCUDAStream()>>>(body);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace ballast::kernels::block_program

#endif  // BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_CUH_
