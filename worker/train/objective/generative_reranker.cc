#include "worker/train/objective/generative_reranker.h"

#include <ATen/ATen.h>

namespace ballast::train {

at::Tensor GenerativeReranker::LogitDiff(const Decoder& decoder, const PackedBatch& batch,
                                         bool training) const {
  TORCH_CHECK(batch.group_offsets.defined() && batch.relevance.defined(),
              "a generative_reranker batch needs reranker candidates (data.format reranker)");
  const at::Tensor hidden = decoder.HiddenStates(batch, training);  // (T, H)
  // Each candidate's last token: the end of its document, one before the
  // next one's start.
  const at::Tensor last =
      (batch.cu_seqlens.slice(0, 1) - 1).to(hidden.device(), /*non_blocking=*/true);
  const at::Tensor head = decoder.lm_head_weight().to(decoder.compute_dtype());  // (V, H)
  const at::Tensor yes_no =
      head.index_select(0, at::tensor({loss_.yes_id, loss_.no_id}, at::kLong).to(head.device()));
  return kernels::reranker_logit_diff(hidden.index_select(0, last), yes_no);
}

kernels::LossSum GenerativeReranker::Loss(const Decoder& decoder, const PackedBatch& batch,
                                          bool training) const {
  const at::Tensor diff = LogitDiff(decoder, batch, training);
  if (loss_.listwise) {
    return kernels::listwise_reranker_loss(diff, batch.group_offsets, loss_.temperature,
                                           loss_.score);
  }
  return kernels::pointwise_reranker_loss(diff, batch.relevance);
}

int64_t GenerativeReranker::Targets(const PackedBatch& batch) const {
  if (!batch.group_offsets.defined()) return 0;
  if (!loss_.listwise) return batch.group_offsets.numel() > 0 ? batch.relevance.numel() : 0;
  // The listwise loss counts the groups with a negative: size >= 2.
  const at::Tensor offsets = batch.group_offsets;
  const int64_t* o = offsets.data_ptr<int64_t>();
  int64_t groups = 0;
  for (int64_t g = 0; g + 1 < offsets.numel(); ++g) groups += o[g + 1] - o[g] >= 2;
  return groups;
}

}  // namespace ballast::train
