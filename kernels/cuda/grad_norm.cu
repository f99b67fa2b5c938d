// CUDA grad_norm over many tensors in two launches.
//
// Inputs: n tensors on one device, each contiguous, fp32 / bf16 / fp16 / fp64.
// Launch 1 (chunk_sum_squares): one block per work item, a chunk of at most
//   kChunk elements of one tensor; the block writes sum(x^2) and a non-finite
//   flag. Work items are ordered by tensor.
// Launch 2 (segment_sum): one block per tensor adds its items' partials in
//   a fixed order, so the result is deterministic (no atomics).
// Precision: every value is widened to fp64 before it is squared, and all
// partial and per-tensor sums are fp64, as on the CPU. A finite fp32 value
// squares to at most 1.2e77, so the sums cannot overflow; squaring in fp32
// would make any |x| > 1.8e19 an inf with no non-finite value to report.
// Only the norm is rounded to fp32, once.
// Indexing is int64 throughout; a tensor may hold more than 2^31 elements.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/grad_norm_cuda.h"

namespace ballast::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 1 << 16;
static_assert(kChunk % kThreads == 0, "a chunk is a whole number of block strides");

struct WorkItem {
  const void* data;
  int64_t begin;
  int64_t end;
};

template <typename T>
__device__ __forceinline__ double Widen(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(x));
  } else if constexpr (std::is_same_v<T, __half>) {
    return static_cast<double>(__half2float(x));
  } else {
    return static_cast<double>(x);
  }
}

template <typename T>
__global__ void chunk_sum_squares(const WorkItem* items, double* partial, int* nonfinite) {
  using BlockReduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  __shared__ int any_bad;
  if (threadIdx.x == 0) any_bad = 0;
  __syncthreads();

  const WorkItem item = items[blockIdx.x];
  const T* x = static_cast<const T*>(item.data);
  double acc = 0;
  bool bad = false;
  for (int64_t i = item.begin + threadIdx.x; i < item.end; i += kThreads) {
    const double v = Widen(x[i]);
    acc += v * v;
    bad |= !isfinite(v);
  }
  if (bad) atomicOr(&any_bad, 1);
  const double total = BlockReduce(storage).Sum(acc);
  __syncthreads();
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = total;
    nonfinite[blockIdx.x] = any_bad;
  }
}

// (n_tensors) blocks; item_offsets is (n_tensors + 1), prefix offsets into partial.
__global__ void segment_sum(const double* partial, const int* nonfinite,
                            const int64_t* item_offsets, double* sum_squares, int* tensor_bad) {
  using BlockReduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const int64_t begin = item_offsets[blockIdx.x];
  const int64_t end = item_offsets[blockIdx.x + 1];
  double acc = 0;
  int bad = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    acc += partial[i];
    bad |= nonfinite[i];
  }
  const double total = BlockReduce(storage).Sum(acc);
  __syncthreads();
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    sum_squares[blockIdx.x] = total;
    tensor_bad[blockIdx.x] = any_bad;
  }
}

}  // namespace

GradNormResult grad_norm_cuda(const std::vector<at::Tensor>& tensors, bool locate_nonfinite) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  at::Device device(at::kCUDA);
  for (const at::Tensor& t : tensors) {
    if (t.defined()) {
      device = t.device();
      break;
    }
  }
  c10::cuda::CUDAGuard guard(device);
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  const auto i32 = at::TensorOptions().dtype(at::kInt).device(device);
  at::Tensor sum_squares = at::zeros({n}, f64);
  at::Tensor tensor_bad = at::zeros({n}, i32);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  // One pass per dtype: items of one dtype go to one templated launch; their
  // per-tensor sums land in sum_squares by segment.
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    std::vector<WorkItem> items;
    std::vector<int64_t> offsets = {0};
    std::vector<int64_t> tensor_ids;
    for (int64_t t = 0; t < n; ++t) {
      const at::Tensor& x = tensors[t];
      if (!x.defined() || x.scalar_type() != dtype || x.numel() == 0) continue;
      for (int64_t b = 0; b < x.numel(); b += kChunk) {
        items.push_back({x.const_data_ptr(), b, std::min(x.numel(), b + kChunk)});
      }
      offsets.push_back(static_cast<int64_t>(items.size()));
      tensor_ids.push_back(t);
    }
    if (items.empty()) continue;
    const int64_t n_items = static_cast<int64_t>(items.size());
    const int64_t n_seg = static_cast<int64_t>(tensor_ids.size());
    // Through pinned memory, so the copies are queued and the host does not
    // wait for the device (a pageable copy would).
    auto to_device = [&](const at::Tensor& host) {
      return host.pin_memory().to(device, /*non_blocking=*/true);
    };
    at::Tensor items_dev = to_device(
        at::from_blob(items.data(), {n_items * static_cast<int64_t>(sizeof(WorkItem))}, at::kByte));
    at::Tensor offsets_dev = to_device(at::tensor(offsets, at::kLong));
    at::Tensor ids_dev = to_device(at::tensor(tensor_ids, at::kLong));
    at::Tensor partial = at::empty({n_items}, f64);
    at::Tensor flags = at::empty({n_items}, i32);
    at::Tensor seg_sums = at::empty({n_seg}, f64);
    at::Tensor seg_bad = at::empty({n_seg}, i32);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "grad_norm_cuda", [&] {
      using T = std::conditional_t<
          std::is_same_v<scalar_t, at::BFloat16>, __nv_bfloat16,
          std::conditional_t<std::is_same_v<scalar_t, at::Half>, __half, scalar_t>>;
      chunk_sum_squares<T><<<n_items, kThreads, 0, stream>>>(
          reinterpret_cast<const WorkItem*>(items_dev.const_data_ptr()),
          partial.mutable_data_ptr<double>(), flags.mutable_data_ptr<int>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    segment_sum<<<n_seg, kThreads, 0, stream>>>(
        partial.const_data_ptr<double>(), flags.const_data_ptr<int>(),
        offsets_dev.const_data_ptr<int64_t>(), seg_sums.mutable_data_ptr<double>(),
        seg_bad.mutable_data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sum_squares.index_copy_(0, ids_dev, seg_sums);
    tensor_bad.index_copy_(0, ids_dev, seg_bad);
  }

  GradNormResult result;
  result.sum_squares = sum_squares;
  result.norm = sum_squares.sum().sqrt().to(at::kFloat);
  if (!locate_nonfinite) return result;
  // One host sync: the guard needs the answer before deciding on the step.
  at::Tensor bad_ids = tensor_bad.nonzero();
  result.first_nonfinite = bad_ids.numel() == 0 ? -1 : bad_ids.min().item<int64_t>();
  return result;
}

}  // namespace ballast::kernels
