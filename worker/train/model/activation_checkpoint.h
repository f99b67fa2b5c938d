// Activation checkpointing per decoder layer. LibTorch has no
// torch.utils.checkpoint (pytorch/pytorch#52744), so this is a custom
// autograd Function: the forward runs the layer without recording a graph and
// keeps only its input; the backward re-runs the layer with the same RNG
// state (so dropout masks repeat) and backpropagates through it. With or
// without it, the numbers are the same.
#ifndef BALLAST_WORKER_TRAIN_MODEL_ACTIVATION_CHECKPOINT_H_
#define BALLAST_WORKER_TRAIN_MODEL_ACTIVATION_CHECKPOINT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/attention.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

class Decoder;

// The attention mask from what autograd's saved data carries: cu_seqlens as
// a tensor, the kind and the block size as integers.
kernels::AttentionMask SavedAttentionMask(const at::Tensor& cu_seqlens, int64_t kind,
                                          int64_t block_size);

// decoder.LayerForward(layer, h, ...) with activations recomputed in backward.
// Gradients reach h and every trainable tensor of the layer in `params`.
at::Tensor CheckpointedLayer(const Decoder& decoder, const ParamStore& params, int64_t layer,
                             const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                             const kernels::AttentionMask& mask);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_ACTIVATION_CHECKPOINT_H_
