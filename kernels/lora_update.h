// The adapters' share of a fused projection (the decoder's fused projections,
// worker/train/model/decoder.h): with the modules' outputs side by side in y (T, sum out) and their
// A products side by side in down (T, sum r),
//   y[:, module i's columns] += scaling * down[:, module i's ranks] @ B_i^T
// for every adapted module i, in place.
#ifndef BALLAST_KERNELS_LORA_UPDATE_H_
#define BALLAST_KERNELS_LORA_UPDATE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ballast::kernels {

// y (T, sum out), a fresh product that no backward reads; down (T, sum r);
// ups[i] is B_i (out_i, r_i), whose rows start at column out_begins[i] of y
// and whose ranks are the next r_i columns of down, in order. Returns y,
// differentiable in y, down and every B_i.
//
// One product per module, each into its own columns: a block-diagonal B over
// all modules would be one product, but multiplies the zero blocks too (half
// or more of the work for gate/up and q/k/v, both ways), and autograd would
// copy y for the out-of-place add and concatenate the pieces of its gradient.
// The backward hands y's gradient through unchanged and writes each module's
// share of down's gradient into its columns.
at::Tensor add_lora_update(const at::Tensor& y, const at::Tensor& down,
                           const std::vector<at::Tensor>& ups,
                           const std::vector<int64_t>& out_begins, double scaling);

// The same for a grouped projection (kernels/grouped_linear.h): the rows of y
// and down are in expert order, expert e's rows ending at offsets[e] ((E,)
// int32 on y's device), and ups[i] is (E, out_i, r_i), B_i of every expert:
//   y[e's rows, module i's columns] += scaling * down[e's rows, module i's ranks] @ B_i[e]^T.
// The experts' LoRA on gate/up and down (worker/train/model/sparse_moe.cc),
// with no (rows, out) update, scaled copy or concatenation of its own.
at::Tensor add_grouped_lora_update(const at::Tensor& y, const at::Tensor& down,
                                   const std::vector<at::Tensor>& ups,
                                   const std::vector<int64_t>& out_begins,
                                   const at::Tensor& offsets, double scaling);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_LORA_UPDATE_H_
