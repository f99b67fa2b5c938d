// PackedBatch: one micro-batch as the model and the objectives read it.
//
// Documents are packed along one token axis without padding; cu_seqlens marks
// their boundaries, so attention never crosses a document. What the data
// pipeline knows about each token and document travels here, and nothing
// here depends on the model: the data component produces it, the decoder
// reads the tokens and the mask, the objective the targets, weights and
// groups, and the guard the document ids.
#ifndef BALLAST_WORKER_TRAIN_DATA_PACKED_BATCH_H_
#define BALLAST_WORKER_TRAIN_DATA_PACKED_BATCH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace ballast::train {

// The attention mask's structure for every document of the batch (see
// kernels/attention.h): causal, or block diffusion with its block size.
struct BatchMask {
  kernels::MaskKind kind = kernels::MaskKind::kCausal;
  int64_t block_size = 0;  // kBlockDiffusion only, >= 1
};

struct PackedBatch {
  at::Tensor input_ids;     // (T) int64
  at::Tensor position_ids;  // (T) int64, restarting at 0 in each document
  at::Tensor cu_seqlens;    // (docs + 1) int64, document boundaries, on the CPU
  // (T) int64: the token position t is trained to predict, or -100
  // (unsupervised, or a document's last position).
  at::Tensor targets;
  // (T) fp32 multiplier of each target's loss, or undefined: weight 1 for
  // every supervised target. Block diffusion puts 1/p_mask here.
  at::Tensor loss_weights;
  // (groups + 1) int64 offsets into the documents, or undefined. Group g is
  // documents [group_offsets[g], group_offsets[g+1]): a reranker query's
  // candidates, which packing never splits.
  at::Tensor group_offsets;
  // (docs) fp32, or undefined: each reranker candidate's relevance, 1 for
  // the positive (first in its group), 0 for a negative.
  at::Tensor relevance;
  // (docs): each document's index in its dataset (its line among the
  // examples), so that the guard can name the samples of a bad step and a
  // rollback can skip them.
  std::vector<int64_t> document_ids;
  BatchMask mask;
  // targets != -100; for block diffusion the answer tokens, which its loss
  // is normalised by (never the masked count).
  int64_t supervised_tokens = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_PACKED_BATCH_H_
