// The held-out set evaluated by the model as it is now, without gradients:
// HeldOutLoss, the validation loss of eval.path under the training
// objective's own definition; RankHeldOut, a reranker's held-out groups
// (reranker.eval_path) ranked as MTEB's RerankingEvaluator ranks them
// (objective/ranking_metrics.h).
#ifndef BALLAST_WORKER_TRAIN_TRAINER_HELD_OUT_H_
#define BALLAST_WORKER_TRAIN_TRAINER_HELD_OUT_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "worker/train/collectives/collectives.h"
#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/model/decoder.h"
#include "worker/train/objective/objective.h"
#include "worker/train/objective/ranking_metrics.h"
#include "worker/train/recovery/trained_state.h"

namespace ballast::train {

// The rows of `eval` one evaluation reads: from the first, in order, while
// their tokens add up to at most `max_tokens` (the first always); every row
// when `max_tokens` is 0.
int64_t HeldOutRows(TokenizedDataset& eval, int64_t max_tokens);

// The objective's sums over rows [0, rows) of `eval`, over all ranks.
struct HeldOutSums {
  double loss_sum = 0;
  int64_t tokens = 0;
  int64_t supervised_tokens = 0;
};

// The loss sum and the counts of rows [0, rows) of `eval` in micro-batches
// of `per_batch` rows, exactly as a training step sums them (the
// objective's Loss and Targets, each micro-batch's fp32 sum added in fp64),
// but without gradients or dropout: rank r of `collectives` takes
// micro-batches r, r + N, ..., and the sums are reduced over the ranks, so
// every world size sees the same micro-batches. Every rank must call it: a
// sharded `state` gathers its layers with all ranks together. May throw
// c10::Error from LibTorch.
HeldOutSums HeldOutLoss(TokenizedDataset& eval, int64_t rows, int64_t per_batch,
                        const Objective& objective, const Decoder& decoder, TrainedState* state,
                        Collectives* collectives, c10::Device device);

// Scores every group of `eval`, `per_batch` rows at a time on `device`,
// without gradients, and returns MRR@10 and NDCG@10 over them; nullopt when
// the objective scores no candidates. Every rank of a job must call it: a
// sharded `state` gathers its layers with all ranks together. May throw
// c10::Error from LibTorch.
std::optional<RankingMetrics> RankHeldOut(TokenizedDataset& eval, int64_t per_batch,
                                          const Objective& objective, const Decoder& decoder,
                                          TrainedState* state, c10::Device device);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_HELD_OUT_H_
