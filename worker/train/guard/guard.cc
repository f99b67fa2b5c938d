#include "worker/train/guard/guard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast::train {
namespace {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  return (v[mid] + *std::max_element(v.begin(), v.begin() + mid)) / 2;
}

// Within 1e-4 relative: a grad_norm that repeats to 4 digits step after step.
bool Pinned(double value, double at) {
  return std::abs(value - at) <= 1e-4 * std::max(std::abs(at), 1e-12);
}

// What a step skipped for `trigger` had, after "every step" or a count.
const char* SkipCause(GuardTrigger trigger) {
  switch (trigger) {
    case GuardTrigger::kNoSupervision:
      return "had no supervised tokens";
    case GuardTrigger::kNonFinite:
      return "had a non-finite loss or grad_norm";
    case GuardTrigger::kSpike:
      return "was a spike with no good state to roll back to";
    default:
      return "was bad";  // the other triggers roll back, never skip
  }
}

}  // namespace

GuardOptions GuardOptionsFromSpec(const v1::GuardSpec& spec) {
  GuardOptions options;
  options.max_consecutive_bad = spec.max_consecutive_bad();
  options.max_rollbacks = spec.max_rollbacks();
  options.spike_window = spec.spike_window();
  options.loss_spike_zscore = spec.loss_spike_zscore();
  options.grad_norm_spike_zscore = spec.grad_norm_spike_zscore();
  options.collapse_window = spec.collapse_window();
  options.collapse_loss = spec.collapse_loss();
  options.moe_collapse_share = spec.moe_collapse_share();
  options.lr_cut = spec.lr_cut();
  options.rewarm_steps = spec.rewarm_steps();
  options.min_applied_fraction = spec.min_applied_fraction();
  return options;
}

const char* TriggerName(GuardTrigger trigger) {
  switch (trigger) {
    case GuardTrigger::kNonFinite:
      return "non_finite";
    case GuardTrigger::kNoSupervision:
      return "no_supervision";
    case GuardTrigger::kSpike:
      return "spike";
    case GuardTrigger::kCollapse:
      return "collapse";
    case GuardTrigger::kRouterCollapse:
      return "router_collapse";
    case GuardTrigger::kNone:
      break;
  }
  return "";
}

Guard::Guard(GuardOptions options) : options_(options) {}

std::string Guard::Spike(const std::deque<double>& window, double value, double zscore,
                         const char* what) const {
  if (zscore <= 0 || static_cast<int64_t>(window.size()) < options_.spike_window) return "";
  const std::vector<double> values(window.begin(), window.end());
  const double median = Median(values);
  std::vector<double> deviations;
  for (double v : values) deviations.push_back(std::abs(v - median));
  // 1.4826 MAD estimates the standard deviation of a normal sample. A flat
  // window (MAD 0) still needs a 1% rise to count, so rounding is no spike.
  const double sigma = std::max(1.4826 * Median(deviations), 0.01 * std::abs(median) / zscore);
  if (sigma <= 0) return "";
  const double z = (value - median) / sigma;
  if (z <= zscore) return "";
  return absl::StrCat(what, " spike: ", value, " is ", absl::SixDigits(z),
                      " robust standard deviations above the median ", median, " of the last ",
                      window.size(), " healthy steps (threshold ", zscore, ")");
}

const MoeLayerStats* Guard::CollapsedLayer(const StepHealth& health) const {
  const double share = options_.moe_collapse_share;
  // With k >= E every token reaches every expert: there is no choice to
  // collapse.
  if (!health.moe || share <= 0 || health.moe->top_k >= health.moe->num_experts) return nullptr;
  for (const MoeLayerStats& layer : health.moe->layers) {
    if (layer.top_k_share > share) return &layer;
  }
  return nullptr;
}

void Guard::Escalate(GuardVerdict* verdict, bool roll_back_now, int64_t episode_start) const {
  verdict->action = GuardAction::kSkip;
  const bool streak =
      options_.max_consecutive_bad > 0 && consecutive_bad_ + 1 >= options_.max_consecutive_bad;
  if (!roll_back_now && !streak) return;
  verdict->action = GuardAction::kRollback;
  verdict->episode_start = episode_start;
  if (streak && !roll_back_now) {
    absl::StrAppend(&verdict->reason, "; ", consecutive_bad_ + 1, " bad steps in a row");
  }
  verdict->budget_spent = rollbacks_ >= options_.max_rollbacks;
  if (verdict->budget_spent) {
    absl::StrAppend(&verdict->reason, "; the rollback budget (", options_.max_rollbacks,
                    ") is spent");
  }
}

GuardVerdict Guard::Judge(const StepHealth& health) {
  GuardVerdict verdict;
  if (health.supervised_tokens == 0) {
    verdict.trigger = GuardTrigger::kNoSupervision;
    verdict.reason = "no supervised tokens";
  } else if (!std::isfinite(health.loss) || !health.first_nonfinite.empty()) {
    // A non-finite loss first: it makes the whole gradient so.
    verdict.trigger = GuardTrigger::kNonFinite;
    std::vector<std::string> parts;
    if (!std::isfinite(health.loss)) {
      parts.push_back(absl::StrCat("non-finite loss (", health.loss, ")"));
    }
    if (!health.first_nonfinite.empty()) {
      parts.push_back(absl::StrCat("non-finite gradient in ", health.first_nonfinite));
      if (health.nonfinite_rank >= 0) {
        absl::StrAppend(&parts.back(), " on rank ", health.nonfinite_rank);
      }
    }
    verdict.reason = absl::StrJoin(parts, ", ");
  } else if (!std::isfinite(health.grad_norm)) {
    // Finite on this rank, non-finite after the reduction: another rank's
    // gradient, or an overflow of the sum of squares.
    verdict.trigger = GuardTrigger::kNonFinite;
    verdict.reason = absl::StrCat("non-finite grad_norm (", health.grad_norm, ")");
  }
  if (verdict.trigger != GuardTrigger::kNone) {
    Escalate(&verdict, /*roll_back_now=*/false, health.step - consecutive_bad_);
    return verdict;
  }

  std::string spike = Spike(losses_, health.loss, options_.loss_spike_zscore, "loss");
  if (spike.empty()) {
    spike = Spike(grad_norms_, health.grad_norm, options_.grad_norm_spike_zscore, "grad_norm");
  }
  if (!spike.empty()) {
    verdict.trigger = GuardTrigger::kSpike;
    verdict.reason = spike;
    Escalate(&verdict, /*roll_back_now=*/true, health.step);
    return verdict;
  }
  const int64_t window = options_.collapse_window;
  if (window > 0) {
    int64_t run = 0;
    if (health.loss < options_.collapse_loss && low_loss_run_ + 1 >= window) {
      run = low_loss_run_;
      verdict.reason = absl::StrCat("collapse: the loss stayed below ", options_.collapse_loss,
                                    " for ", window, " steps (now ", health.loss, ")");
    } else if (pinned_run_ > 0 && Pinned(health.grad_norm, pinned_grad_norm_) &&
               pinned_run_ + 1 >= window) {
      run = pinned_run_;
      verdict.reason = absl::StrCat("collapse: grad_norm stayed at ", pinned_grad_norm_, " for ",
                                    window, " steps: the gradient no longer changes");
    }
    if (!verdict.reason.empty()) {
      verdict.trigger = GuardTrigger::kCollapse;
      Escalate(&verdict, /*roll_back_now=*/true, health.step - run);
      return verdict;
    }
    const MoeLayerStats* collapsed = CollapsedLayer(health);
    if (collapsed != nullptr && router_collapse_run_ + 1 >= window) {
      verdict.trigger = GuardTrigger::kRouterCollapse;
      verdict.reason =
          absl::StrCat("router collapse: for ", window, " steps a MoE layer's ", health.moe->top_k,
                       " busiest experts took more than ", options_.moe_collapse_share,
                       " of its routed (token, choice) pairs (now layer ", collapsed->layer,
                       ", experts ", absl::StrJoin(collapsed->busiest_experts, ", "), ": ",
                       absl::SixDigits(collapsed->top_k_share), ", ",
                       absl::SixDigits(collapsed->idle_expert_fraction * 100), "% of the ",
                       health.moe->num_experts, " experts idle)");
      Escalate(&verdict, /*roll_back_now=*/true, health.step - router_collapse_run_);
    }
  }
  return verdict;
}

void Guard::Acted(const GuardVerdict& verdict, const StepHealth& health) {
  switch (verdict.action) {
    case GuardAction::kApply: {
      consecutive_bad_ = 0;
      ++clean_steps_;
      ++applied_since_rollback_;
      const auto push = [&](std::deque<double>& window, double value) {
        window.push_back(value);
        if (static_cast<int64_t>(window.size()) > options_.spike_window) window.pop_front();
      };
      push(losses_, health.loss);
      push(grad_norms_, health.grad_norm);
      low_loss_run_ = health.loss < options_.collapse_loss ? low_loss_run_ + 1 : 0;
      router_collapse_run_ = CollapsedLayer(health) != nullptr ? router_collapse_run_ + 1 : 0;
      if (pinned_run_ > 0 && Pinned(health.grad_norm, pinned_grad_norm_)) {
        ++pinned_run_;
      } else {
        pinned_run_ = 1;
        pinned_grad_norm_ = health.grad_norm;
      }
      break;
    }
    case GuardAction::kSkip:
      ++consecutive_bad_;
      clean_steps_ = 0;
      ++skipped_[static_cast<size_t>(verdict.trigger)];
      break;
    case GuardAction::kRollback:
      // The run goes back to before the streak: the collapse runs start over.
      consecutive_bad_ = 0;
      clean_steps_ = 0;
      low_loss_run_ = 0;
      pinned_run_ = 0;
      router_collapse_run_ = 0;
      applied_since_rollback_ = 0;
      ++rollbacks_;
      break;
  }
}

std::string Guard::TooFewApplied(int64_t applied, int64_t steps) const {
  if (applied > 0 && static_cast<double>(applied) >= options_.min_applied_fraction * steps) {
    return "";
  }
  std::string head = applied == 0 ? "no step was applied"
                                  : absl::StrCat("only ", applied, " of ", steps,
                                                 " steps were applied, fewer than "
                                                 "guard.min_applied_fraction (",
                                                 options_.min_applied_fraction, ") of them");
  std::vector<std::string> causes;
  int64_t seen = 0;
  for (size_t t = 0; t < skipped_.size(); ++t) {
    if (skipped_[t] == 0) continue;
    causes.push_back(absl::StrCat(skipped_[t], " ", SkipCause(static_cast<GuardTrigger>(t))));
    seen += skipped_[t];
  }
  // A run that resumed, or rolled back, saw other skipped steps than the
  // ones its applied steps are counted against.
  if (causes.size() == 1 && seen == steps - applied) {
    return absl::StrCat(head, ": every ", applied == 0 ? "step " : "skipped step ",
                        SkipCause(MostSkippedBy()));
  }
  if (causes.empty()) return head;
  return absl::StrCat(head, "; of the steps this run skipped, ", absl::StrJoin(causes, ", "));
}

GuardTrigger Guard::MostSkippedBy() const {
  const auto most = std::max_element(skipped_.begin(), skipped_.end());
  return *most == 0 ? GuardTrigger::kNone
                    : static_cast<GuardTrigger>(std::distance(skipped_.begin(), most));
}

double Guard::LrScale() const {
  if (rollbacks_ == 0 || options_.lr_cut >= 1) return 1;
  if (options_.rewarm_steps <= 0) return options_.lr_cut;
  const double progress = std::min(1.0, static_cast<double>(applied_since_rollback_) /
                                            static_cast<double>(options_.rewarm_steps));
  return options_.lr_cut + (1 - options_.lr_cut) * progress;
}

}  // namespace ballast::train
