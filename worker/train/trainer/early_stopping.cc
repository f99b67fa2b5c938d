#include "worker/train/trainer/early_stopping.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::train {

std::optional<EarlyStoppingRule> EarlyStoppingRule::FromSpec(const v1::JobSpec& spec) {
  EarlyStoppingRule rule;
  if (spec.has_early_stopping()) {
    const v1::EarlyStoppingSpec& es = spec.early_stopping();
    if (!es.metric().empty()) rule.metric = es.metric();
    rule.patience = es.patience();
    rule.min_delta = es.min_delta();
    rule.warmup_evals = es.warmup_evals();
    return rule;
  }
  if (spec.export_() == "best") return rule;
  return std::nullopt;
}

std::optional<double> EarlyStopping::MetricOf(const v1::EvalReport& report) const {
  // A reranker's report without a group ranked none.
  if (rule_.metric == "mrr_at_10" || rule_.metric == "ndcg_at_10") {
    if (report.groups() == 0) return std::nullopt;
    return rule_.metric == "mrr_at_10" ? report.mrr_at_10() : report.ndcg_at_10();
  }
  if (!report.has_loss()) return std::nullopt;
  return report.loss();
}

bool EarlyStopping::Improves(const EvalProgress& progress, double value) const {
  if (std::isnan(value) || progress.evaluations < rule_.warmup_evals) return false;
  if (progress.best_step < 0) return true;
  const double gain =
      higher_is_better() ? value - progress.best_value : progress.best_value - value;
  return gain > rule_.min_delta;
}

EvalProgress EarlyStopping::Record(EvalProgress progress, int64_t step, double value,
                                   bool best) const {
  const bool warmup = progress.evaluations < rule_.warmup_evals;
  ++progress.evaluations;
  if (warmup) return progress;
  if (best) {
    progress.best_step = step;
    progress.best_value = value;
    progress.since_best = 0;
  } else {
    ++progress.since_best;
  }
  return progress;
}

bool EarlyStopping::ShouldStop(const EvalProgress& progress) const {
  return rule_.patience > 0 && progress.since_best >= rule_.patience;
}

std::string EarlyStopping::StopReason(const EvalProgress& progress, int64_t step) const {
  return absl::StrCat("stopped early at step ", step, ": ", rule_.metric, " did not improve by ",
                      absl::StrFormat("%g", rule_.min_delta), " for ", progress.since_best,
                      " evaluations ",
                      progress.best_step >= 0 ? absl::StrCat("since step ", progress.best_step)
                                              : std::string("after the warmup"));
}

std::string EarlyStopping::BestReason(const EvalProgress& progress) const {
  return absl::StrCat("the best ", rule_.metric, ", ", absl::StrFormat("%.6g", progress.best_value),
                      " at step ", progress.best_step);
}

}  // namespace ballast::train
