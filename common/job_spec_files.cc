#include "common/job_spec_files.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ballast {

absl::Status ValidateJobSpecFiles(const v1::JobSpec& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path config_path = fs::path(spec.model().path()) / "config.json";
  if (!fs::is_regular_file(config_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_path.string(),
                     " does not exist; model.path must be an HF model folder with config.json"));
  }
  std::ifstream in(config_path);
  // Without exceptions, a malformed file parses to a "discarded" value.
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("model.path: ", config_path.string(),
                                                   " is not valid JSON (expected a JSON object)"));
  }

  if (!fs::is_regular_file(spec.data().path(), ec)) {
    return absl::InvalidArgumentError(absl::StrCat("data.path: ", spec.data().path(),
                                                   " does not exist or is not a file; expected "
                                                   "a tokenized JSONL file"));
  }

  const auto max_pos = config.find("max_position_embeddings");
  if (max_pos != config.end() && max_pos->is_number_integer()) {
    const int64_t limit = max_pos->get<int64_t>();
    if (spec.data().seq_len() > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.seq_len: ", spec.data().seq_len(), " is out of range; allowed 1..",
                       limit, " (max_position_embeddings of ", spec.model().path(), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ballast
