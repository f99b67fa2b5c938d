#include "worker/train/guard/guard.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ballast::train {

Guard::Guard(GuardOptions options) : options_(options) {}

GuardVerdict Guard::Judge(const StepHealth& health) {
  GuardVerdict verdict;
  if (!health.first_nonfinite.empty()) {
    verdict.reason = absl::StrCat("non-finite gradient in ", health.first_nonfinite);
  } else if (!std::isfinite(health.loss)) {
    verdict.reason = absl::StrCat("non-finite loss (", health.loss, ")");
  } else if (!std::isfinite(health.grad_norm)) {
    // Finite on this rank, non-finite after the reduction: another rank's
    // gradient, or an overflow of the sum of squares.
    verdict.reason = absl::StrCat("non-finite grad_norm (", health.grad_norm, ")");
  } else {
    return verdict;
  }
  verdict.action = GuardAction::kSkip;
  if (options_.max_consecutive_bad > 0 && consecutive_bad_ + 1 >= options_.max_consecutive_bad) {
    verdict.action = GuardAction::kRollback;
    verdict.budget_spent = rollbacks_ >= options_.max_rollbacks;
    absl::StrAppend(&verdict.reason, "; ", consecutive_bad_ + 1, " bad steps in a row");
    if (verdict.budget_spent) {
      absl::StrAppend(&verdict.reason, "; the rollback budget (", options_.max_rollbacks,
                      ") is spent");
    }
  }
  return verdict;
}

void Guard::Acted(GuardAction action) {
  switch (action) {
    case GuardAction::kApply:
      consecutive_bad_ = 0;
      break;
    case GuardAction::kSkip:
      ++consecutive_bad_;
      break;
    case GuardAction::kRollback:
      consecutive_bad_ = 0;
      ++rollbacks_;
      break;
  }
}

}  // namespace ballast::train
