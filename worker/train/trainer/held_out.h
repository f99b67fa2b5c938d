// RankHeldOut: a reranker's held-out groups (reranker.eval_path) ranked by
// the model as it is now, as MTEB's RerankingEvaluator ranks them
// (objective/ranking_metrics.h).
#ifndef BALLAST_WORKER_TRAIN_TRAINER_HELD_OUT_H_
#define BALLAST_WORKER_TRAIN_TRAINER_HELD_OUT_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/model/decoder.h"
#include "worker/train/objective/objective.h"
#include "worker/train/objective/ranking_metrics.h"
#include "worker/train/recovery/trained_state.h"

namespace ballast::train {

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
