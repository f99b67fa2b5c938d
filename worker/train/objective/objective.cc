#include "worker/train/objective/objective.h"

#include "absl/strings/str_cat.h"
#include "worker/train/objective/block_diffusion.h"
#include "worker/train/objective/causal_lm.h"
#include "worker/train/objective/generative_reranker.h"

namespace ballast::train {
namespace {

// The id of an answer token, which must be exactly one token.
absl::StatusOr<int64_t> AnswerId(const Tokenizer* tokenizer, const std::string& field,
                                 const std::string& token) {
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "task generative_reranker needs a tokenizer (data.tokenizer or model.path)");
  }
  absl::StatusOr<std::vector<TokenId>> ids = tokenizer->Encode(token, /*allow_special=*/true);
  if (!ids.ok()) return ids.status();
  if (ids->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = \"", token, "\" is ", ids->size(),
                                                   " tokens of the tokenizer; it must be one"));
  }
  return (*ids)[0];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(const v1::JobSpec& spec,
                                                         const Tokenizer* tokenizer) {
  if (spec.task() == "causal_lm" || spec.task().empty()) return std::make_unique<CausalLm>();
  if (spec.task() == "block_diffusion") return std::make_unique<BlockDiffusion>();
  if (spec.task() == "generative_reranker") {
    const v1::RerankerSpec& r = spec.reranker();
    absl::StatusOr<int64_t> yes = AnswerId(tokenizer, "reranker.yes_token", r.yes_token());
    if (!yes.ok()) return yes.status();
    absl::StatusOr<int64_t> no = AnswerId(tokenizer, "reranker.no_token", r.no_token());
    if (!no.ok()) return no.status();
    return std::make_unique<GenerativeReranker>(
        RerankerLoss{.yes_id = *yes,
                     .no_id = *no,
                     .listwise = r.loss() != "pointwise",
                     .score = r.score() == "logsigmoid" ? kernels::RerankerScore::kLogSigmoid
                                                        : kernels::RerankerScore::kLogitDiff,
                     .temperature = r.temperature()});
  }
  return absl::InvalidArgumentError(
      absl::StrCat("task = '", spec.task(),
                   "' is not supported; allowed: causal_lm, generative_reranker, block_diffusion"));
}

}  // namespace ballast::train
