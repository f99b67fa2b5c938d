// Chunked linear cross-entropy on CUDA: logits = hidden @ weight^T without the
// (T, V) logits.
//
// Inputs: hidden (T, H) and weight (V, H) in bf16 / fp16 / fp32 (compute in
// fp32) or fp64 (compute in fp64); targets (T) int64; rows (T_c) int64, the
// counted positions; token_weights (T) fp32 or undefined. For each counted
// row t, with z = hidden_t @ weight^T:
//   lse_t  = log sum_v exp(z_v)                                  fp32 (fp64)
//   loss_t = w_t * (lse_t - z[target_t] + z_loss * lse_t^2)
// and the result is sum_t loss_t. The backward, for an upstream gradient g:
//   dz_v      = g * w_t * (softmax(z)_v * (1 + 2 * z_loss * lse_t) - [v == target_t])
//   dhidden_t = dz @ weight,  dweight = dz^T @ hidden.
// These are the CPU backend's formulas (linear_cross_entropy_cpu.cc); the
// tiling differs, see linear_cross_entropy_cuda.h.
//
// Tiling: counted rows, kLceCudaChunkRows at a time, gathered from hidden;
// each chunk sweeps the vocabulary in tiles of kLceCudaChunkVocab rows of
// weight. A tile's logits come from one cuBLAS product: bf16 / fp16 operands
// with fp32 output (at::mm's out_dtype overload, fp32 accumulation on tensor
// cores); fp64 operands through at::mm; fp32 operands through cublasGemmEx
// with CUBLAS_COMPUTE_32F_PEDANTIC (Fp32Gemm), because at::mm on fp32 turns
// into TF32 (10-bit mantissa) whenever the program allows TF32 globally, and
// the fp32 path is what a `precision: fp32` check compares against the CPU.
// The same holds for the backward's products. Then one kernel per tile:
//   forward:  LseTileKernel folds the tile into each row's running
//             (max, sum of exp(z - max)) and picks z[target] when the target
//             lies in the tile;
//   backward: GradTileKernel turns the recomputed logits into dz in one pass.
//
// Precision: logits, log-sum-exp, loss and gradient accumulators are fp32
// (fp64 for fp64). For bf16 / fp16 inputs dz is rounded to the input dtype to
// feed the tensor-core products dz @ weight and dz^T @ hidden, as fused
// cross-entropy kernels do; before rounding it is multiplied by a power of
// two 2^k that brings max |g * w_t| near 1, and the fp32 products are divided
// by it, so fp16's narrow exponent range cannot flush small gradients (a
// softmax entry of 1e-6 times g = 1e-5 is below fp16's smallest subnormal).
// Every exponent is of z - max or z - lse <= 0 (up to rounding). Ignored rows
// get zero gradient. No atomics: results are deterministic.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/Exceptions.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <limits>

#include "kernels/cuda/linear_cross_entropy_cuda.h"

namespace ballast::kernels {
namespace {

constexpr int kThreads = 256;
static_assert(kLceCudaChunkRows > 0 && kLceCudaChunkVocab > 0, "tiles must be non-empty");
static_assert(kLceCudaChunkRows <= std::numeric_limits<int32_t>::max(),
              "one block per row of a chunk");

// A running log-sum-exp: max and the sum of exp(z - max).
template <typename Acc>
struct MaxSum {
  Acc max;
  Acc sum;
};

// Merges two running sums. The max of two empty sums is -inf: shifting by it
// would give exp(-inf - -inf) = NaN, so the empty case returns sum 0 directly.
template <typename Acc>
struct MergeMaxSum {
  __device__ __forceinline__ MaxSum<Acc> operator()(const MaxSum<Acc>& a,
                                                    const MaxSum<Acc>& b) const {
    const Acc m = a.max > b.max ? a.max : b.max;
    if (m == -std::numeric_limits<Acc>::infinity()) return {m, Acc(0)};
    // A NaN max (from a NaN logit) makes both terms NaN, so it reaches the loss.
    return {m, a.sum * exp(a.max - m) + b.sum * exp(b.max - m)};
  }
};

// One block per row r of a chunk. logits (ct, nv) row-major are the tile
// [v0, v0 + nv) of the row's logits. run_max, run_sum and z_target (ct) are
// the row's running log-sum-exp and its target logit.
template <typename Acc>
__global__ void __launch_bounds__(kThreads)
    LseTileKernel(const Acc* logits, const int64_t* targets, int64_t v0, int64_t nv, Acc* run_max,
                  Acc* run_sum, Acc* z_target) {
  using BlockReduce = cub::BlockReduce<MaxSum<Acc>, kThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const int64_t r = blockIdx.x;
  const Acc* z = logits + r * nv;
  MaxSum<Acc> acc{-std::numeric_limits<Acc>::infinity(), Acc(0)};
  const MergeMaxSum<Acc> merge;
  for (int64_t j = threadIdx.x; j < nv; j += kThreads) acc = merge(acc, {z[j], Acc(1)});
  const MaxSum<Acc> tile = BlockReduce(storage).Reduce(acc, merge);
  if (threadIdx.x == 0) {
    const MaxSum<Acc> total = merge({run_max[r], run_sum[r]}, tile);
    run_max[r] = total.max;
    run_sum[r] = total.sum;
    const int64_t t = targets[r];
    // Picked from the same tile as the log-sum-exp, so lse - z_target >= 0
    // holds up to rounding even when both are ~1e4.
    if (t >= v0 && t < v0 + nv) z_target[r] += z[t - v0];
  }
}

template <typename Out, typename Acc>
__device__ __forceinline__ Out ToOut(Acc x) {
  if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    return __float2bfloat16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<Out, __half>) {
    return __float2half(static_cast<float>(x));
  } else {
    return static_cast<Out>(x);
  }
}

// One block per row r of a chunk: dz (ct, nv) = grad_scale * (exp(z - lse_r)
// * softmax_scale_r - [v0 + j == target_r] * coef_r), from the recomputed
// logits (ct, nv). grad_scale is a device scalar (see the file comment).
template <typename Acc, typename Out>
__global__ void __launch_bounds__(kThreads)
    GradTileKernel(const Acc* logits, const Acc* lse, const Acc* softmax_scale, const Acc* coef,
                   const int64_t* targets, const Acc* grad_scale, int64_t v0, int64_t nv, Out* dz) {
  const int64_t r = blockIdx.x;
  const Acc s = grad_scale[0];
  const Acc row_lse = lse[r];
  const Acc row_scale = softmax_scale[r] * s;
  const Acc row_coef = coef[r] * s;
  const int64_t t = targets[r] - v0;
  const Acc* z = logits + r * nv;
  Out* out = dz + r * nv;
  for (int64_t j = threadIdx.x; j < nv; j += kThreads) {
    const Acc g = exp(z[j] - row_lse) * row_scale - (j == t ? row_coef : Acc(0));
    out[j] = ToOut<Out>(g);
  }
}

template <typename Acc>
void LaunchLseTile(const at::Tensor& logits, const at::Tensor& targets, int64_t v0, int64_t nv,
                   at::Tensor& run_max, at::Tensor& run_sum, at::Tensor& z_target,
                   cudaStream_t stream) {
  LseTileKernel<Acc><<<static_cast<unsigned>(logits.size(0)), kThreads, 0, stream>>>(
      static_cast<const Acc*>(logits.const_data_ptr()), targets.const_data_ptr<int64_t>(), v0, nv,
      static_cast<Acc*>(run_max.mutable_data_ptr()), static_cast<Acc*>(run_sum.mutable_data_ptr()),
      static_cast<Acc*>(z_target.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The inputs of GradTileKernel for the chunk that starts at counted row r0.
struct GradTileArgs {
  const at::Tensor& logits;         // (ct, nv)
  const at::Tensor& lse;            // (T_c)
  const at::Tensor& softmax_scale;  // (T_c)
  const at::Tensor& coef;           // (T_c)
  const at::Tensor& targets;        // (T_c)
  const at::Tensor& grad_scale;     // (1)
  int64_t r0;
  int64_t v0;
  int64_t nv;
};

template <typename Acc, typename Out>
void LaunchGradTile(const GradTileArgs& a, at::Tensor& dz, cudaStream_t stream) {
  auto acc = [](const at::Tensor& t) { return static_cast<const Acc*>(t.const_data_ptr()); };
  GradTileKernel<Acc, Out><<<static_cast<unsigned>(a.logits.size(0)), kThreads, 0, stream>>>(
      acc(a.logits), acc(a.lse) + a.r0, acc(a.softmax_scale) + a.r0, acc(a.coef) + a.r0,
      a.targets.const_data_ptr<int64_t>() + a.r0, acc(a.grad_scale), a.v0, a.nv,
      static_cast<Out*>(dz.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool IsHalf(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

at::ScalarType ComputeType(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// c (m, n) = op(a) . op(b) [+ c], all fp32, c contiguous, where op(x) is x
// or x^T; IEEE fp32 whatever torch's TF32 setting (see the file comment).
// cuBLAS is column-major: a row-major (r, c) matrix is its (c, r) transpose
// there, so this computes c^T = op(b)^T . op(a)^T.
void Fp32Gemm(const at::Tensor& a_in, bool transpose_a, const at::Tensor& b_in, bool transpose_b,
              at::Tensor& c, bool accumulate) {
  TORCH_INTERNAL_ASSERT(c.is_contiguous());
  const at::Tensor a = a_in.contiguous();
  const at::Tensor b = b_in.contiguous();
  const int64_t m = c.size(0);
  const int64_t n = c.size(1);
  const int64_t k = transpose_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  TORCH_CUDABLAS_CHECK(cublasGemmEx(
      at::cuda::getCurrentCUDABlasHandle(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &alpha, b.const_data_ptr(), CUDA_R_32F, static_cast<int>(b.size(1)),
      a.const_data_ptr(), CUDA_R_32F, static_cast<int>(a.size(1)), &beta, c.mutable_data_ptr(),
      CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
}

// The logits tile (ct, nv) in the compute dtype; h is (ct, H) and w (nv, H)
// in the input dtype for bf16 / fp16, in the compute dtype otherwise.
at::Tensor TileLogits(const at::Tensor& h, const at::Tensor& w, bool half) {
  if (half) return at::mm(h, w.t(), at::kFloat).contiguous();
  if (h.scalar_type() == at::kDouble) return at::mm(h, w.t()).contiguous();
  at::Tensor logits = at::empty({h.size(0), w.size(0)}, h.options());
  Fp32Gemm(h, false, w, true, logits, false);
  return logits;
}

// token_weights gathered at rows, in the compute dtype; ones when undefined.
at::Tensor RowWeights(const at::Tensor& token_weights, const at::Tensor& rows, at::ScalarType acc) {
  if (!token_weights.defined()) return at::ones({rows.size(0)}, rows.options().dtype(acc));
  return token_weights.index_select(0, rows).to(acc);
}

}  // namespace

LceForward linear_cross_entropy_cuda_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, const at::Tensor& rows,
                                             const at::Tensor& token_weights, double z_loss) {
  c10::cuda::CUDAGuard guard(hidden.device());
  const bool half = IsHalf(hidden.scalar_type());
  const at::ScalarType acc = ComputeType(hidden.scalar_type());
  const at::TensorOptions opts = hidden.options().dtype(acc);
  const int64_t counted = rows.size(0);
  const int64_t vocab = weight.size(0);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  const at::Tensor row_targets = targets.index_select(0, rows).contiguous();  // (T_c)
  at::Tensor lse = at::empty({counted}, opts);                                // (T_c)
  at::Tensor loss = at::empty({counted}, opts);                               // (T_c)
  for (int64_t r0 = 0; r0 < counted; r0 += kLceCudaChunkRows) {
    const int64_t ct = std::min(kLceCudaChunkRows, counted - r0);
    at::Tensor h = hidden.index_select(0, rows.narrow(0, r0, ct));  // (ct, H)
    if (!half) h = h.to(acc);
    const at::Tensor tgt = row_targets.narrow(0, r0, ct);  // (ct)
    // -inf start: the first tile rescales the empty sum by exp(-inf) = 0.
    at::Tensor run_max = at::full({ct}, -std::numeric_limits<double>::infinity(), opts);  // (ct)
    at::Tensor run_sum = at::zeros({ct}, opts);                                           // (ct)
    at::Tensor z_target = at::zeros({ct}, opts);                                          // (ct)
    for (int64_t v0 = 0; v0 < vocab; v0 += kLceCudaChunkVocab) {
      const int64_t nv = std::min(kLceCudaChunkVocab, vocab - v0);
      at::Tensor w = weight.narrow(0, v0, nv);  // (nv, H)
      if (!half) w = w.to(acc);
      const at::Tensor logits = TileLogits(h, w, half);  // (ct, nv)
      if (acc == at::kDouble) {
        LaunchLseTile<double>(logits, tgt, v0, nv, run_max, run_sum, z_target, stream);
      } else {
        LaunchLseTile<float>(logits, tgt, v0, nv, run_max, run_sum, z_target, stream);
      }
    }
    at::Tensor lse_c = lse.narrow(0, r0, ct);  // (ct)
    lse_c.copy_(run_max + run_sum.log_());
    loss.narrow(0, r0, ct).copy_(lse_c - z_target + z_loss * lse_c.square());
  }
  loss.mul_(RowWeights(token_weights, rows, acc));
  return {loss.sum(), lse};
}

LceGrads linear_cross_entropy_cuda_backward(const at::Tensor& grad_sum, const at::Tensor& hidden,
                                            const at::Tensor& weight, const at::Tensor& targets,
                                            const at::Tensor& rows, const at::Tensor& token_weights,
                                            const at::Tensor& lse, double z_loss, bool need_hidden,
                                            bool need_weight) {
  c10::cuda::CUDAGuard guard(hidden.device());
  const bool half = IsHalf(hidden.scalar_type());
  const at::ScalarType acc = ComputeType(hidden.scalar_type());
  const at::TensorOptions opts = hidden.options().dtype(acc);
  const int64_t counted = rows.size(0);
  const int64_t vocab = weight.size(0);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  LceGrads grads;
  // Ignored rows are never written, so they keep the zero they start with.
  if (need_hidden) grads.hidden = at::zeros(hidden.sizes(), hidden.options());  // (T, H)
  // dweight sums over every row chunk, so it accumulates in the compute dtype.
  at::Tensor dweight = need_weight ? at::zeros(weight.sizes(), opts) : at::Tensor();  // (V, H)

  const at::Tensor row_targets = targets.index_select(0, rows).contiguous();            // (T_c)
  const at::Tensor coef = RowWeights(token_weights, rows, acc).mul_(grad_sum.to(acc));  // (T_c)
  const at::Tensor softmax_scale = (coef * (1.0 + 2.0 * z_loss * lse)).contiguous();    // (T_c)
  const at::Tensor lse_c = lse.to(acc).contiguous();                                    // (T_c)
  // grad_scale (device scalar): 2^-floor(log2 max |coef|) for bf16 / fp16, 1
  // otherwise or when every coef is 0. A power of two, so scaling is exact.
  at::Tensor grad_scale = at::ones({1}, opts);
  if (half && counted > 0) {
    const at::Tensor peak = coef.abs().max().reshape({1});
    grad_scale = at::where(peak > 0, at::exp2(-at::floor(at::log2(peak))), grad_scale);
  }
  const at::Tensor inv_grad_scale = grad_scale.reciprocal();  // (1)
  const at::ScalarType dz_type = half ? hidden.scalar_type() : acc;

  for (int64_t r0 = 0; r0 < counted; r0 += kLceCudaChunkRows) {
    const int64_t ct = std::min(kLceCudaChunkRows, counted - r0);
    const at::Tensor idx = rows.narrow(0, r0, ct);
    at::Tensor h = hidden.index_select(0, idx);  // (ct, H)
    if (!half) h = h.to(acc);
    at::Tensor dh = need_hidden ? at::zeros({ct, hidden.size(1)}, opts) : at::Tensor();  // (ct, H)
    for (int64_t v0 = 0; v0 < vocab; v0 += kLceCudaChunkVocab) {
      const int64_t nv = std::min(kLceCudaChunkVocab, vocab - v0);
      at::Tensor w = weight.narrow(0, v0, nv);  // (nv, H)
      if (!half) w = w.to(acc);
      const at::Tensor logits = TileLogits(h, w, half);                      // (ct, nv)
      at::Tensor dz = at::empty({ct, nv}, hidden.options().dtype(dz_type));  // (ct, nv)
      const GradTileArgs args{logits, lse_c, softmax_scale, coef, row_targets, grad_scale, r0,
                              v0,     nv};
      switch (dz_type) {
        case at::kDouble:
          LaunchGradTile<double, double>(args, dz, stream);
          break;
        case at::kBFloat16:
          LaunchGradTile<float, __nv_bfloat16>(args, dz, stream);
          break;
        case at::kHalf:
          LaunchGradTile<float, __half>(args, dz, stream);
          break;
        default:
          LaunchGradTile<float, float>(args, dz, stream);
          break;
      }
      if (half) {
        if (need_hidden) dh.add_(at::mm(dz, w, at::kFloat));
        if (need_weight) dweight.narrow(0, v0, nv).add_(at::mm(dz.t(), h, at::kFloat));
      } else if (acc == at::kDouble) {
        if (need_hidden) dh.addmm_(dz, w);
        if (need_weight) dweight.narrow(0, v0, nv).addmm_(dz.t(), h);
      } else {
        if (need_hidden) Fp32Gemm(dz, false, w, false, dh, true);
        if (need_weight) {
          at::Tensor dw = dweight.narrow(0, v0, nv);
          Fp32Gemm(dz, true, h, false, dw, true);
        }
      }
    }
    if (need_hidden) {
      if (half) dh.mul_(inv_grad_scale);
      grads.hidden.index_copy_(0, idx, dh.to(hidden.scalar_type()));
    }
  }
  if (need_weight) {
    if (half) dweight.mul_(inv_grad_scale);
    grads.weight = dweight.to(weight.scalar_type());
  }
  return grads;
}

}  // namespace ballast::kernels
