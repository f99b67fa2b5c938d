// Objective: what a job trains the model to do, as a loss on the decoder's
// hidden states. The job spec's `task` picks one; the trainer calls it once
// per micro-batch and never knows which it is.
//
// Every objective returns (sum, count), never a mean: the trainer divides the
// sum of every micro-batch by the count of the whole optimizer step, over all
// micro-batches and ranks (shared/DESIGN.md, numerics contract 2).
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "kernels/loss.h"
#include "worker/train/data/packed_batch.h"
#include "worker/train/model/decoder.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {

class Objective {
 public:
  virtual ~Objective() = default;

  // The loss of `batch` under `decoder`: sum differentiable in the trainable
  // tensors, count the number of targets it is normalised by. `training`
  // turns dropout on. Throws c10::Error (from LibTorch) on a malformed batch.
  // It runs the decoder once, on `batch` as it is (decoder.HiddenStates):
  // the trainer's routing pre-pass of a mixture of experts (Decoder::Route)
  // replays that forward without the objective.
  virtual kernels::LossSum Loss(const Decoder& decoder, const PackedBatch& batch,
                                bool training) const = 0;

  // What Loss() will count for `batch`, known before the forward so that the
  // step's global count, and with it the loss scale, is too: supervised
  // targets for a language model, groups or candidates for a reranker.
  virtual int64_t Targets(const PackedBatch& batch) const { return batch.supervised_tokens; }

  // The tokens of `batch` whose routing a mixture of experts balances: the
  // load-balancing loss counts them alone and gives them alone its
  // gradient. (T) bool on the CPU, or undefined: every token.
  virtual at::Tensor BalancedTokens(const PackedBatch& batch) const { return at::Tensor(); }

  // A ranker's score of each document of `batch` (its candidates), for
  // evaluation; nullopt for an objective that does not rank.
  virtual std::optional<at::Tensor> CandidateScores(const Decoder& decoder,
                                                    const PackedBatch& batch) const {
    return std::nullopt;
  }
};

// The objective of spec.task(); `tokenizer` (the data's, null for a tokens
// file) gives the reranker its yes and no ids. INVALID_ARGUMENT names a task
// this build does not train, or a yes/no token that is not one token.
absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(const v1::JobSpec& spec,
                                                         const Tokenizer* tokenizer);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_
