#include "common/model_types.h"

#include <algorithm>

#include "absl/strings/str_join.h"

namespace ballast {

bool IsSupportedModelType(absl::string_view model_type) {
  return std::find(kSupportedModelTypes.begin(), kSupportedModelTypes.end(), model_type) !=
         kSupportedModelTypes.end();
}

std::string SupportedModelTypesText() { return absl::StrJoin(kSupportedModelTypes, ", "); }

absl::string_view TextConfigKey(absl::string_view model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_moe" ? "text_config" : "";
}

}  // namespace ballast
