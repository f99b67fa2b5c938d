// The attention fallback: ATen's scaled_dot_product_attention, once per
// document, with is_causal = true. attention() takes it on a CUDA device
// where the project's kernel cannot run (kernels/attention_tiles.h: an arch
// before sm_80, a head dim other than 64 / 128 / 256, too little shared
// memory, or fp32 / fp64 inputs), and logs the reason to stderr once per
// process and reason. Internal to kernels/; exposed so that tests run it on
// the CPU against the float64 reference.
//
// Never builds a dense mask: each document is one SDPA call over its own
// tokens, so ATen may pick its flash or memory-efficient kernel (bf16 / fp16
// on CUDA) or the math one. GQA through enable_gqa. Differentiable by ATen's
// own autograd.
#ifndef BALLAST_KERNELS_ATTENTION_FALLBACK_H_
#define BALLAST_KERNELS_ATTENTION_FALLBACK_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "kernels/attention.h"

namespace ballast::kernels {

// attention() with the same arguments, already validated, by SDPA per
// document. Throws c10::Error naming the mask when it is not plain causal
// (block diffusion, sliding window): SDPA cannot express those without a
// dense mask.
at::Tensor attention_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionMask& mask, double scale);

// Writes "attention: <reason>; using ATen SDPA per document" to stderr the
// first time this process meets `reason`.
void log_attention_fallback_once(const std::string& reason);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_ATTENTION_FALLBACK_H_
