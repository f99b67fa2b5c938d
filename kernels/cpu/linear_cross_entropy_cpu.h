// CPU implementation of kernels/loss.h linear_cross_entropy; callers go
// through linear_cross_entropy(), which validates arguments and wraps this in
// autograd. Nothing here checks shapes or dtypes again.
#ifndef BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_
#define BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::kernels {

// The logits that exist at any time are one block of whole rows, at most
// kLceLogitsBlockBytes in the compute dtype (and at most kLceMaxBlockRows
// rows). Whole rows, because the gradient of a row needs its log-sum-exp over
// the entire vocabulary; see linear_cross_entropy_cpu.cc.
// 80 MiB is 136 rows of a 151936 vocabulary: enough rows for MKL to run the
// products near full speed, and with the fp32 (V, H) gradient the loss stays
// under a tenth of the memory of materialised logits at T = 4096.
inline constexpr int64_t kLceLogitsBlockBytes = int64_t{80} << 20;
// Small vocabularies would fit every row in the byte budget, but a block that
// stays in cache between its product and its softmax passes is faster: at
// V = 4096, H = 256, T = 2048 (the trainer benchmark's loss) 512-row blocks
// (8 MiB) ran 0.61-0.66x of logits + cross_entropy, all 2048 rows 0.74x, and
// peak memory fell from 0.42x to 0.13x. (256 rows: 0.65-0.67x.)
inline constexpr int64_t kLceMaxBlockRows = 512;
// Products against weight run kLceChunkVocab vocabulary rows at a time, so a
// bf16 or fp16 weight is upcast one tile at a time, never whole.
inline constexpr int64_t kLceChunkVocab = 8192;

// Counted rows per logits block for a vocabulary of `vocab` entries of
// `element_bytes` each: at least 1.
int64_t lce_block_rows(int64_t vocab, int64_t element_bytes);

struct LceGrads {
  at::Tensor hidden;  // (T, H), zero on ignored rows; undefined unless asked for.
  at::Tensor weight;  // (V, H); undefined unless asked for.
};

// The loss and, when asked for, its gradients for an upstream gradient of 1,
// in the compute dtype (fp32, or fp64 for fp64 inputs). The autograd wrapper
// scales them by the actual upstream gradient (exact, because the loss is a
// sum) and only then rounds them to the inputs' dtype, so a bf16 or fp16
// gradient is rounded once.
struct LceSumAndGrads {
  // Scalar: sum over counted rows of token_weight * loss; fp32 (fp64 for fp64 inputs).
  at::Tensor sum;
  LceGrads unit_grads;
};

// rows (T_c) int64: positions of the counted tokens (target != ignore_index),
// increasing. token_weights may be undefined (all ones).
LceSumAndGrads linear_cross_entropy_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                        const at::Tensor& targets, const at::Tensor& rows,
                                        const at::Tensor& token_weights, double z_loss,
                                        bool need_hidden, bool need_weight);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_
