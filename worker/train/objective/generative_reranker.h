// GenerativeReranker: task generative_reranker. Each document of the batch
// is one (query, document) candidate; its score comes from the yes and no
// rows of the lm_head at its last token (kernels/reranker_loss.h), so the
// (candidates, vocabulary) logits are never formed. Listwise: cross-entropy
// over each group's scores / τ, the positive (first) the target, normalised
// by the groups of two or more candidates. Pointwise: BCE on Δ against the
// candidate's relevance, normalised by the candidates.
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_GENERATIVE_RERANKER_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_GENERATIVE_RERANKER_H_

#include <cstdint>

#include "kernels/reranker_loss.h"
#include "worker/train/objective/objective.h"

namespace ballast::train {

struct RerankerLoss {
  int64_t yes_id = 0;
  int64_t no_id = 0;
  bool listwise = true;
  kernels::RerankerScore score = kernels::RerankerScore::kLogitDiff;
  double temperature = 1.0;
};

class GenerativeReranker : public Objective {
 public:
  explicit GenerativeReranker(RerankerLoss loss) : loss_(loss) {}

  kernels::LossSum Loss(const Decoder& decoder, const PackedBatch& batch,
                        bool training) const override;
  int64_t Targets(const PackedBatch& batch) const override;
  // Δ, the score Qwen3-Reranker ranks by (σ(Δ) = P(yes)).
  std::optional<at::Tensor> CandidateScores(const Decoder& decoder,
                                            const PackedBatch& batch) const override {
    return LogitDiff(decoder, batch, /*training=*/false);
  }

  // Δ = logit(yes) − logit(no) at each candidate's last token, fp32 (N).
  at::Tensor LogitDiff(const Decoder& decoder, const PackedBatch& batch, bool training) const;

 private:
  RerankerLoss loss_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_GENERATIVE_RERANKER_H_
