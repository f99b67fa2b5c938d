#include "worker/train/trainer/held_out.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "worker/train/data/step_batches.h"

namespace ballast::train {

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
