#include "worker/train/trainer/delay_injection.h"

#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ballast::train {
namespace {

// NAME's colon-separated numbers, `count` of them; empty when unset.
absl::StatusOr<std::vector<double>> Numbers(const char* name, size_t count,
                                            absl::string_view form) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::vector<double>();
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(value, ':')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !std::isfinite(v) || v < 0) {
      out.clear();
      break;
    }
    out.push_back(v);
  }
  if (out.size() != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " = '", value, "' does not parse; allowed: ", form, " (non-negative numbers)"));
  }
  return out;
}

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

}  // namespace

absl::StatusOr<DelayInjection> DelayInjection::FromEnvironment(int rank, int32_t attempt) {
  DelayInjection out;
  absl::StatusOr<std::vector<double>> hang = Numbers("BALLAST_INJECT_HANG", 3, "RANK:STEP:SECONDS");
  if (!hang.ok()) return hang.status();
  if (!hang->empty() && static_cast<int>((*hang)[0]) == rank && attempt <= 1) {
    out.hang_step_ = static_cast<int64_t>((*hang)[1]);
    out.hang_ = Ms((*hang)[2]);
  }
  absl::StatusOr<std::vector<double>> slow = Numbers("BALLAST_INJECT_SLOW", 2, "RANK:SECONDS");
  if (!slow.ok()) return slow.status();
  if (!slow->empty() && static_cast<int>((*slow)[0]) == rank) out.slow_ = Ms((*slow)[1]);
  return out;
}

std::string DelayInjection::Describe() const {
  std::string out;
  if (hang_step_ > 0)
    absl::StrAppend(&out, "a hang of ", hang_.count(), " ms in step ", hang_step_);
  if (slow_.count() > 0) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", slow_.count(), " ms more in every step");
  }
  return out;
}

void DelayInjection::InStep(int64_t step) const {
  std::chrono::milliseconds sleep = slow_;
  if (step == hang_step_) sleep += hang_;
  if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
}

}  // namespace ballast::train
