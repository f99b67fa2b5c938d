// With R = cos.size(1) the rotated channels, h = R / 2 and the halves
// x1 = x[:h], x2 = x[h:R] (likewise for cos, sin):
//   forward:   out1 = x1 cos1 - x2 sin1          out2 = x2 cos2 + x1 sin2
//   backward:  dx1  = dy1 cos1 + dy2 sin2        dx2  = dy2 cos2 - dy1 sin1
// (the backward is dy * cos + rotate_half^T(dy * sin), rotate_half^T([z1, z2])
// = [z2, -z1]); channels R..D-1 pass through both ways (out = x, dx = dy).
// CPU tensors take the threaded kernel below; other devices compute
// x * cos + rotate_half(x) * sin with ATen ops (see apply_rope).
#include "kernels/rope.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace ballast::kernels {
namespace {

// Rotates (T, heads, D) `in` into contiguous `out` by the forward formula, or
// by the backward one (in = dy, out = dx).
void Rotate(const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin, bool backward,
            at::Tensor& out) {
  const int64_t tokens = in.size(0);
  const int64_t heads = in.size(1);
  const int64_t dim = in.size(2);
  const int64_t half = cos.size(1) / 2;
  const at::Tensor c = cos.contiguous();
  const at::Tensor s = sin.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.scalar_type(), "rope", [&] {
    const scalar_t* x = in.const_data_ptr<scalar_t>();
    const scalar_t* cp = c.const_data_ptr<scalar_t>();
    const scalar_t* sp = s.const_data_ptr<scalar_t>();
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    const int64_t row_stride = in.stride(0), head_stride = in.stride(1);
    // Rows of heads * D elements; ~16k elements per task.
    const int64_t grain = std::max<int64_t>(1, 16384 / (heads * dim));
    at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* ct = cp + t * 2 * half;
        const scalar_t* st = sp + t * 2 * half;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t* xi = x + t * row_stride + h * head_stride;
          scalar_t* yo = y + (t * heads + h) * dim;
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = xi[i], x2 = xi[half + i];
            const float s1 = static_cast<float>(st[i]), s2 = static_cast<float>(st[half + i]);
            // out1 = x1 c1 - x2 (s1 | -s2),  out2 = x2 c2 + x1 (s2 | -s1)
            const float s_first = backward ? -s2 : s1;
            const float s_second = backward ? -s1 : s2;
            yo[i] = static_cast<scalar_t>(x1 * static_cast<float>(ct[i]) - x2 * s_first);
            yo[half + i] =
                static_cast<scalar_t>(x2 * static_cast<float>(ct[half + i]) + x1 * s_second);
          }
          for (int64_t i = 2 * half; i < dim; ++i) yo[i] = xi[i];  // not rotated
        }
      }
    });
  });
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    at::Tensor out = at::empty(x.sizes(), x.options());
    Rotate(x.stride(2) == 1 ? x : x.contiguous(), cos, sin, /*backward=*/false, out);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor dy =
        grad_outputs[0].stride(2) == 1 ? grad_outputs[0] : grad_outputs[0].contiguous();
    at::Tensor dx = at::empty(dy.sizes(), dy.options());
    Rotate(dy, saved[0], saved[1], /*backward=*/true, dx);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // The kernel indexes cos/sin by token and x by its strides; a mismatch would
  // read out of bounds, so it is refused here.
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0,
              "apply_rope: x must be (T, heads, D) with D even, got ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == x.size(0) &&
                  cos.size(1) % 2 == 0 && cos.size(1) >= 2 && cos.size(1) <= x.size(2),
              "apply_rope: cos and sin must be (T, R) with T = ", x.size(0),
              " and R even in 2..D = ", x.size(2), ", got ", cos.sizes(), " and ", sin.sizes());
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "apply_rope: cos and sin must have x's dtype ", x.scalar_type());
  TORCH_CHECK(cos.device() == x.device() && sin.device() == x.device(),
              "apply_rope: cos and sin must be on x's device ", x.device(), ", got ", cos.device(),
              " and ", sin.device());
  if (x.device().is_cpu()) return RopeFunction::apply(x, cos, sin);
  // Elsewhere (CUDA) by ATen ops, differentiated by autograd: the same
  // formula, in fp32, rounded once to x's dtype as on the CPU.
  const int64_t rot = cos.size(1), half = rot / 2;
  const at::Tensor xf = x.narrow(2, 0, rot).to(at::kFloat);
  const at::Tensor rotated = at::cat({-xf.narrow(2, half, half), xf.narrow(2, 0, half)}, 2);
  const at::Tensor out =
      (xf * cos.to(at::kFloat).unsqueeze(1) + rotated * sin.to(at::kFloat).unsqueeze(1))
          .to(x.scalar_type());
  if (rot == x.size(2)) return out;
  return at::cat({out, x.narrow(2, rot, x.size(2) - rot)}, 2);
}

}  // namespace ballast::kernels
