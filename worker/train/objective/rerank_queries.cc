#include "worker/train/objective/rerank_queries.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "worker/train/data/data_format.h"
#include "worker/train/data/reranker_records.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/inference.h"
#include "worker/train/objective/objective.h"

namespace ballast::train {
namespace {

// One query's candidates as a batch: one document each, its own group.
PackedBatch CandidateBatch(const std::vector<std::vector<TokenId>>& candidates) {
  std::vector<int64_t> ids, positions, cu = {0};
  for (const std::vector<TokenId>& c : candidates) {
    for (size_t t = 0; t < c.size(); ++t) {
      ids.push_back(c[t]);
      positions.push_back(static_cast<int64_t>(t));
    }
    cu.push_back(cu.back() + static_cast<int64_t>(c.size()));
  }
  const int64_t n = static_cast<int64_t>(candidates.size());
  PackedBatch b;
  b.input_ids = torch::tensor(ids, torch::kLong);
  b.position_ids = torch::tensor(positions, torch::kLong);
  b.cu_seqlens = torch::tensor(cu, torch::kLong);
  b.targets = torch::full({static_cast<int64_t>(ids.size())}, -100, torch::kLong);
  b.group_offsets = torch::tensor(std::vector<int64_t>{0, n}, torch::kLong);
  b.relevance = torch::zeros({n}, torch::kFloat);
  return b;
}

}  // namespace

absl::StatusOr<RankingMetrics> RerankQueries(const RerankOptions& options, std::istream& in,
                                             std::ostream& out, int64_t* failed_lines) {
  v1::JobSpec spec = options.spec;
  spec.set_task("generative_reranker");
  ApplyDefaults(&spec);
  absl::StatusOr<InferenceModel> model = LoadInferenceModel(options.model_dir, options.adapter_dir);
  if (!model.ok()) return model.status();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(
      spec.data().tokenizer().empty() ? options.model_dir : spec.data().tokenizer());
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<std::unique_ptr<Objective>> objective = MakeObjective(spec, &*tokenizer);
  if (!objective.ok()) return objective.status();
  const RerankerPrompt prompt = {spec.reranker().prefix(), spec.reranker().instruction(),
                                 spec.reranker().suffix()};
  const int64_t max_tokens =
      spec.data().seq_len() > 0 ? spec.data().seq_len() : model->config.max_position_embeddings;
  Decoder decoder(model->config, &model->params, model->lora, torch::kFloat,
                  /*gradient_checkpointing=*/false);
  torch::NoGradGuard no_grad;

  RankingEvaluator evaluator;
  *failed_lines = 0;
  int64_t number = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++number;
    const auto fail = [&](absl::string_view what) {
      ++*failed_lines;
      out << nlohmann::json{{"error", absl::StrCat("line ", number, ": ", what)}}.dump() << "\n";
    };
    absl::StatusOr<nlohmann::json> parsed = ParseRecord(line);
    if (!parsed.ok()) {
      fail(parsed.status().message());
      continue;
    }
    const nlohmann::json& record = *parsed;
    RerankerRecord pairs;
    std::vector<float> relevance;
    if (record.contains("documents")) {
      if (!record.contains("query") || !record["query"].is_string() ||
          !record["documents"].is_array()) {
        fail("expected {\"query\": str, \"documents\": [str, ...]}");
        continue;
      }
      pairs.query = record["query"].get<std::string>();
      for (const nlohmann::json& d : record["documents"]) {
        pairs.negatives.push_back(d.is_string() ? d.get<std::string>() : d.dump());
      }
    } else {
      absl::StatusOr<RerankerRecord> parsed = ParseRerankerRecord(record);
      if (!parsed.ok()) {
        fail(parsed.status().message());
        continue;
      }
      pairs = *std::move(parsed);
      relevance.assign(pairs.positives.size(), 1.0f);
      relevance.resize(pairs.positives.size() + pairs.negatives.size(), 0.0f);
    }
    std::vector<std::string> documents = pairs.positives;
    documents.insert(documents.end(), pairs.negatives.begin(), pairs.negatives.end());
    if (documents.empty()) {
      fail("no documents to score");
      continue;
    }
    std::vector<std::vector<TokenId>> candidates;
    absl::Status status;
    for (const std::string& document : documents) {
      bool cut = false;
      absl::StatusOr<std::vector<TokenId>> ids =
          EncodeCandidate(*tokenizer, prompt, pairs.query, document, max_tokens, &cut);
      if (!ids.ok()) {
        status = ids.status();
        break;
      }
      candidates.push_back(*std::move(ids));
    }
    if (!status.ok()) {
      fail(status.message());
      continue;
    }
    const at::Tensor diff =
        (*objective)->CandidateScores(decoder, CandidateBatch(candidates))->to(torch::kDouble);
    const at::Tensor p_yes = torch::sigmoid(diff);
    std::vector<double> scores(p_yes.data_ptr<double>(), p_yes.data_ptr<double>() + p_yes.numel());
    out << nlohmann::json{{"query", pairs.query}, {"scores", scores}}.dump() << "\n";
    if (!relevance.empty()) {
      evaluator.AddGroup(
          std::vector<double>(diff.data_ptr<double>(), diff.data_ptr<double>() + diff.numel()),
          relevance);
    }
  }
  return evaluator.Metrics();
}

}  // namespace ballast::train
