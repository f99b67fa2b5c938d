#include "worker/train/objective/objective.h"

#include "absl/strings/str_cat.h"
#include "worker/train/objective/causal_lm.h"

namespace ballast::train {

absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(const v1::JobSpec& spec) {
  if (spec.task() == "causal_lm" || spec.task().empty()) return std::make_unique<CausalLm>();
  return absl::InvalidArgumentError(
      absl::StrCat("task = '", spec.task(), "' is not supported; allowed: causal_lm"));
}

}  // namespace ballast::train
