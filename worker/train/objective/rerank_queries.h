// RerankQueries: `ballast-train rerank`, a trained reranker scoring
// (query, document) pairs, so that a user can check what it learned.
//
// Each input line is {"query": str, "documents": [str, ...]}, or a reranker
// training record (data.format reranker), whose positives then negatives
// are scored; each output line is {"query": str, "scores": [P(yes), ...]}
// in that order, with P(yes) = σ(logit(yes) − logit(no)), or
// {"error": "line N: ..."}. Lines with positives also add to MRR@10 and
// NDCG@10, returned at the end.
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_RERANK_QUERIES_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_RERANK_QUERIES_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/objective/ranking_metrics.h"

namespace ballast::train {

struct RerankOptions {
  std::string model_dir;
  std::string adapter_dir;  // may be empty
  // The prompt, the yes/no tokens and the tokenizer (data.tokenizer) of a
  // job spec, so that pairs are rendered as the job trained on them; with
  // no reranker keys, Qwen3-Reranker's own. data.seq_len bounds a pair
  // (default: the model's max_position_embeddings).
  v1::JobSpec spec;
};

// The metrics of the lines that had positives (groups 0 without any).
// NOT_FOUND / INVALID_ARGUMENT when the model, adapter or tokenizer does not
// load, or a yes/no token is not one token; a bad line is answered in place.
absl::StatusOr<RankingMetrics> RerankQueries(const RerankOptions& options, std::istream& in,
                                             std::ostream& out, int64_t* failed_lines);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_RERANK_QUERIES_H_
