#include "worker/train/trainer/held_out.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "worker/train/data/step_batches.h"

namespace ballast::train {

int64_t HeldOutRows(TokenizedDataset& eval, int64_t max_tokens) {
  const int64_t rows = eval.rows_per_epoch();
  if (max_tokens <= 0) return rows;
  // A block-diffusion document is packed twice, [x_t ; x_0].
  const int64_t copies = eval.order().diffusion.block_length > 0 ? 2 : 1;
  int64_t tokens = 0;
  for (int64_t row = 0; row < rows; ++row) {
    for (const int64_t d : eval.RowDocuments(row)) tokens += copies * eval.cache().length(d);
    if (tokens > max_tokens) return std::max<int64_t>(row, 1);
  }
  return rows;
}

HeldOutSums HeldOutLoss(TokenizedDataset& eval, int64_t rows, int64_t per_batch,
                        const Objective& objective, const Decoder& decoder, TrainedState* state,
                        Collectives* collectives, c10::Device device) {
  torch::NoGradGuard no_grad;
  const int rank = collectives->rank();
  const int world_size = collectives->world_size();
  const int64_t micro_batches = (rows + per_batch - 1) / per_batch;
  // The same number of forwards on every rank, whose gathers pair up: a rank
  // left without a micro-batch in the last round forwards a one-row filler
  // and drops it.
  const int64_t rounds = (micro_batches + world_size - 1) / world_size;
  at::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  int64_t tokens = 0, supervised = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t m = round * world_size + rank;
    const bool filler = m >= micro_batches;
    const int64_t first = filler ? 0 : m * per_batch;
    PackedBatch batch = eval.Pack(first, filler ? 1 : std::min(per_batch, rows - first));
    MoveToDevice(device, &batch);
    state->BeginForward();
    const kernels::LossSum ls = objective.Loss(decoder, batch, /*training=*/false);
    state->EndForward();
    if (filler) continue;
    loss_sum += ls.sum;
    tokens += batch.input_ids.numel();
    supervised += objective.Targets(batch);
  }
  // Counts in fp64 are exact up to 2^53 tokens.
  at::Tensor sums =
      torch::stack({loss_sum, torch::full({}, static_cast<double>(tokens), loss_sum.options()),
                    torch::full({}, static_cast<double>(supervised), loss_sum.options())});
  collectives->SumInPlace(sums);
  const at::Tensor host = sums.cpu();
  const double* s = host.const_data_ptr<double>();
  return {.loss_sum = s[0],
          .tokens = static_cast<int64_t>(s[1]),
          .supervised_tokens = static_cast<int64_t>(s[2])};
}

std::optional<RankingMetrics> RankHeldOut(TokenizedDataset& eval, int64_t per_batch,
                                          const Objective& objective, const Decoder& decoder,
                                          TrainedState* state, c10::Device device) {
  torch::NoGradGuard no_grad;
  RankingEvaluator evaluator;
  const int64_t rows = eval.rows_per_epoch();
  for (int64_t row = 0; row < rows; row += per_batch) {
    PackedBatch batch = eval.Pack(row, std::min(per_batch, rows - row));
    const at::Tensor relevance = batch.relevance.clone();
    MoveToDevice(device, &batch);
    state->BeginForward();
    const std::optional<at::Tensor> scores = objective.CandidateScores(decoder, batch);
    state->EndForward();
    if (!scores) return std::nullopt;
    const at::Tensor host = scores->to(torch::kCPU, torch::kDouble).contiguous();
    const double* s = host.const_data_ptr<double>();
    const float* r = relevance.const_data_ptr<float>();
    const at::Tensor offsets = batch.group_offsets;
    const int64_t* o = offsets.const_data_ptr<int64_t>();
    for (int64_t g = 0; g + 1 < offsets.numel(); ++g) {
      evaluator.AddGroup(std::vector<double>(s + o[g], s + o[g + 1]),
                         std::vector<float>(r + o[g], r + o[g + 1]));
    }
  }
  return evaluator.Metrics();
}

}  // namespace ballast::train
