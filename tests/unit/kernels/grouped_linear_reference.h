// The float64 reference for grouped_linear, one at::mm per expert, and the
// runner that takes the kernel's output and gradients through autograd.
// Shared by the CPU test and the CUDA comparison.
#ifndef BALLAST_TESTS_UNIT_KERNELS_GROUPED_LINEAR_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_GROUPED_LINEAR_REFERENCE_H_

#include <torch/torch.h>

#include <vector>

#include "kernels/grouped_linear.h"

namespace ballast::kernels::grouped_linear_reference {

struct ProductsOf {
  at::Tensor y, d_x, d_w;
};

// (E,) int32 cumulative row ends of `counts`, on the CPU.
inline at::Tensor Offsets(const std::vector<int64_t>& counts) {
  return torch::tensor(counts, torch::kLong).cumsum(0).to(torch::kInt);
}

// y and the gradients of sum(y * dy), in float64 from the (rounded) inputs;
// d_x and d_w are left undefined when dy is.
inline ProductsOf Reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets,
                            const at::Tensor& dy) {
  const at::Tensor xd = x.cpu().to(torch::kDouble), wd = w.cpu().to(torch::kDouble);
  const at::Tensor ends = offsets.cpu().to(torch::kLong);
  ProductsOf r{torch::zeros({x.size(0), w.size(1)}, torch::kDouble), at::Tensor(), at::Tensor()};
  const at::Tensor dyd = dy.defined() ? dy.cpu().to(torch::kDouble) : at::Tensor();
  if (dy.defined()) {
    r.d_x = torch::zeros_like(xd);
    r.d_w = torch::zeros_like(wd);
  }
  int64_t start = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    const int64_t end = ends[e].item<int64_t>();
    const at::Tensor xe = xd.narrow(0, start, end - start);
    r.y.narrow(0, start, end - start).copy_(at::mm(xe, wd[e].t()));
    if (dy.defined()) {
      const at::Tensor dye = dyd.narrow(0, start, end - start);
      r.d_x.narrow(0, start, end - start).copy_(at::mm(dye, wd[e]));
      r.d_w[e].copy_(at::mm(dye.t(), xe));
    }
    start = end;
  }
  return r;
}

// grouped_linear's y and its gradients of sum(y * dy), on x's device, as CPU
// tensors.
inline ProductsOf RunKernel(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets,
                            const at::Tensor& dy) {
  const at::Tensor xl = x.detach().clone().requires_grad_(true);
  const at::Tensor wl = w.detach().clone().requires_grad_(true);
  const at::Tensor y = grouped_linear(xl, wl, offsets);
  y.backward(dy);
  return {y.detach().cpu(), xl.grad().cpu(), wl.grad().cpu()};
}

// ||got - want|| / ||want|| in float64; 0 when both are empty or zero.
inline double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().to(torch::kDouble), w = want.cpu().to(torch::kDouble);
  const double norm = w.norm().item<double>();
  const double diff = (g - w).norm().item<double>();
  return norm == 0 ? diff : diff / norm;
}

}  // namespace ballast::kernels::grouped_linear_reference

#endif  // BALLAST_TESTS_UNIT_KERNELS_GROUPED_LINEAR_REFERENCE_H_
