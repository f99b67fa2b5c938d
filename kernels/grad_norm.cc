// Dispatch for grad_norm, and its CPU implementation.
//
// CPU math: each tensor is cut into chunks of kChunk elements; chunks are
// summed in parallel (at::parallel_for) in fp64 and then added per tensor in
// chunk order, so the result does not depend on the thread count. Values are
// squared in fp64, so no finite fp32 / bf16 / fp16 value overflows (an fp32
// square is at most 1.2e77); the norm is rounded to fp32 once, at the end. A
// value is non-finite when x != x (NaN) or |x| == inf.
#include "kernels/grad_norm.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "kernels/cuda/grad_norm_cuda.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kChunk = 1 << 16;

struct Chunk {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

GradNormResult grad_norm_cpu(const std::vector<at::Tensor>& tensors) {
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < static_cast<int64_t>(tensors.size()); ++t) {
    if (!tensors[t].defined()) continue;
    const int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({t, b, std::min(n, b + kChunk)});
  }
  std::vector<double> partial(chunks.size(), 0.0);
  std::vector<char> bad(chunks.size(), 0);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const at::Tensor& x = tensors[chunks[c].tensor];
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "grad_norm_cpu",
                                      [&] {
                                        const scalar_t* data = x.const_data_ptr<scalar_t>();
                                        double acc = 0.0;
                                        bool nonfinite = false;
                                        for (int64_t i = chunks[c].begin; i < chunks[c].end; ++i) {
                                          const double v = static_cast<double>(data[i]);
                                          acc += v * v;
                                          nonfinite |= !std::isfinite(v);
                                        }
                                        partial[c] = acc;
                                        bad[c] = nonfinite;
                                      });
    }
  });

  GradNormResult result;
  std::vector<double> per_tensor(tensors.size(), 0.0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    per_tensor[chunks[c].tensor] += partial[c];
    if (bad[c] && (result.first_nonfinite < 0 || chunks[c].tensor < result.first_nonfinite)) {
      result.first_nonfinite = chunks[c].tensor;
    }
  }
  double total = 0.0;
  for (double s : per_tensor) total += s;
  result.sum_squares = at::tensor(per_tensor, at::TensorOptions().dtype(at::kDouble));
  result.norm = at::scalar_tensor(static_cast<float>(std::sqrt(total)), at::kFloat);
  return result;
}

}  // namespace

GradNormResult grad_norm(const std::vector<at::Tensor>& tensors, bool locate_nonfinite) {
  at::Device device(at::kCPU);
  bool first = true;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    TORCH_CHECK(t.is_contiguous(), "grad_norm: every tensor must be contiguous");
    // Listed, not isFloatingType: that also admits the float8 types, which
    // neither backend reads (the CUDA one would skip them without a word).
    const at::ScalarType dtype = t.scalar_type();
    TORCH_CHECK(
        dtype == at::kDouble || dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
        "grad_norm: tensors must be fp64, fp32, bf16 or fp16, got ", dtype);
    if (first) device = t.device();
    TORCH_CHECK(t.device() == device, "grad_norm: all tensors must be on one device, got ", device,
                " and ", t.device());
    first = false;
  }
  if (device.is_cuda()) return grad_norm_cuda(tensors, locate_nonfinite);
  GradNormResult result = grad_norm_cpu(tensors);
  // The same answer from both backends: not looked for means -1.
  if (!locate_nonfinite) result.first_nonfinite = -1;
  return result;
}

}  // namespace ballast::kernels
