#include "common/job_spec_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/data_files.h"
#include "common/job_spec.h"
#include "common/job_spec_paths.h"
#include "common/model_config.h"
#include "common/model_types.h"
#include "common/regular_file.h"
#include "common/sdar_checkpoint.h"

namespace ballast {

namespace {

// The model folder's config.json, parsed; INVALID_ARGUMENT naming model.path
// when it is missing, unreadable or not a JSON object.
absl::StatusOr<nlohmann::json> ReadModelConfig(const v1::JobSpec& spec,
                                               const std::string& config_name) {
  // Read with a bound and without blocking: ballastd reads it at submission,
  // where a FIFO or a 1.5 GB file once held a request (and memory) for long.
  absl::StatusOr<std::string> text = ReadRegularFile(config_name, kMaxConfigJsonBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_name,
                     " does not exist; model.path must be an HF model folder with config.json"));
  }
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model.path: ", text.status().message()));
  }
  // Without exceptions, a malformed file parses to a "discarded" value.
  nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_name, " is not valid JSON (expected a JSON object)"));
  }
  return config;
}

std::string ConfigName(const v1::JobSpec& spec) {
  return (std::filesystem::path(spec.model().path()) / "config.json").string();
}

// OK when the data `path`, the spec's `field`, is a file or a data folder
// (common/data_files.h) whose files all open as regular files (not a FIFO,
// a directory or a file of /proc or /sys).
absl::Status CheckDataFile(absl::string_view field, const std::string& path) {
  absl::StatusOr<std::vector<std::string>> files = ListDataFiles(path);
  absl::Status s = files.status();
  for (size_t i = 0; s.ok() && i < files->size(); ++i) s = CheckRegularFile((*files)[i]);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", s.message(),
      absl::IsNotFound(s) ? "; expected a JSONL or parquet file, or a folder of parquet shards or "
                            "a datasets.save_to_disk folder"
                          : ""));
}

// OK when every weights file and JSON file of the model folder is a regular
// file: a rank opens them all, and a FIFO among them once held one in
// open() for good.
absl::Status CheckModelFiles(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int entries = 0;
  for (fs::directory_iterator it(model_path, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxFolderEntries) {
      return absl::InvalidArgumentError(absl::StrCat("model.path: ", model_path,
                                                     " holds more than ", kMaxFolderEntries,
                                                     " entries; a model folder has a few dozen"));
    }
    const std::string ext = it->path().extension().string();
    if (ext != ".safetensors" && ext != ".json") continue;
    if (absl::Status s = CheckRegularFile(it->path().string()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.path: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// OK when `dir` is a PEFT adapter folder: adapter_config.json (a JSON
// object) and adapter_model.safetensors, both regular files.
absl::Status CheckPeftAdapter(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_name = (fs::path(dir) / "adapter_config.json").string();
  absl::StatusOr<std::string> text = ReadRegularFile(config_name, kMaxConfigJsonBytes);
  const std::string weights_name = (fs::path(dir) / "adapter_model.safetensors").string();
  absl::Status weights = text.ok() ? CheckRegularFile(weights_name) : text.status();
  if (!weights.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.init_adapter: ", dir,
        " must be a PEFT adapter folder (adapter_config.json and adapter_model.safetensors): ",
        weights.message()));
  }
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("lora.init_adapter: ", config_name,
                                                   " is not valid JSON (expected an object)"));
  }
  return absl::OkStatus();
}

// The object that holds the decoder's keys: config.json itself, or its
// text_config for a vision-language wrapper.
const nlohmann::json& DecoderKeys(const nlohmann::json& config) {
  const auto model_type = config.find("model_type");
  if (model_type == config.end() || !model_type->is_string()) return config;
  const std::string text_key(TextConfigKey(model_type->get<std::string>()));
  if (text_key.empty() || !config.contains(text_key) || !config.at(text_key).is_object()) {
    return config;
  }
  return config.at(text_key);
}

// A Mixture-of-Experts model: its decoder keys state a positive num_experts
// (the name in Qwen3-MoE, Qwen3.5-MoE and SDAR's MoE configs).
bool HasExperts(const nlohmann::json& config) {
  const auto experts = DecoderKeys(config).find("num_experts");
  return experts != DecoderKeys(config).end() && experts->is_number_integer() &&
         experts->get<int64_t>() > 0;
}

// A moe section is for a model with experts; on a dense one it would be
// ignored, so it is refused, naming the keys it sets.
absl::Status CheckMoeSection(const v1::JobSpec& spec, const nlohmann::json& config,
                             const std::string& config_name) {
  if (!spec.has_moe()) return absl::OkStatus();
  if (HasExperts(config)) {
    // Each rank holds num_experts / N whole experts.
    const int64_t experts = DecoderKeys(config).at("num_experts").get<int64_t>();
    const int32_t n = spec.moe().expert_parallel();
    if (n > 1 && experts % n != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moe.expert_parallel = ", n, " does not divide num_experts ", experts, " of ",
          config_name, ": each rank holds num_experts / ", n, " whole experts"));
    }
    return absl::OkStatus();
  }
  std::vector<const google::protobuf::FieldDescriptor*> set;
  spec.moe().GetReflection()->ListFields(spec.moe(), &set);
  std::vector<std::string> keys;
  for (const google::protobuf::FieldDescriptor* f : set) keys.push_back("moe." + f->name());
  if (keys.empty()) keys.push_back("moe");
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(keys, ", "), keys.size() == 1 ? " is" : " are", " set, but ", config_name,
      " is a dense model (no num_experts); the moe section is for Mixture-of-Experts models"));
}

}  // namespace

absl::Status ValidateJobSpecFiles(const v1::JobSpec& spec, const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  // First, so that nothing outside the roots is opened, or its existence told.
  if (absl::Status s = CheckSpecPaths(spec, roots); !s.ok()) return s;
  std::error_code ec;
  const std::string config_name = ConfigName(spec);
  absl::StatusOr<nlohmann::json> read = ReadModelConfig(spec, config_name);
  if (!read.ok()) return read.status();
  const nlohmann::json& config = *read;

  const auto model_type = config.find("model_type");
  if (model_type == config.end() || !model_type->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_name,
                     " has no model_type string; allowed: ", SupportedModelTypesText()));
  }
  if (!IsSupportedModelType(model_type->get<std::string>())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.path: ", config_name, " has model_type '", model_type->get<std::string>(),
        "', which is not supported; allowed: ", SupportedModelTypesText()));
  }

  if (IsSdarModelType(model_type->get<std::string>())) {
    if (absl::Status s = CheckSdarConfig(config, spec, config_name); !s.ok()) return s;
  }

  // The trainer cannot build rotary embeddings without it, so a config that
  // lacks it is refused here rather than after the job is queued. A
  // vision-language wrapper keeps it with the decoder's keys, in text_config.
  const nlohmann::json* decoder_keys = &DecoderKeys(config);
  const std::string max_pos_key =
      decoder_keys == &config
          ? "max_position_embeddings"
          : absl::StrCat(TextConfigKey(model_type->get<std::string>()), ".max_position_embeddings");
  const auto max_pos = decoder_keys->find("max_position_embeddings");
  if (max_pos == decoder_keys->end() || !max_pos->is_number_integer() ||
      max_pos->get<int64_t>() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_name, " needs ", max_pos_key,
                     ", a positive integer that bounds data.seq_len"));
  }
  const int64_t limit = max_pos->get<int64_t>();
  if (spec.data().seq_len() > limit) {
    return absl::InvalidArgumentError(absl::StrCat("data.seq_len = ", spec.data().seq_len(),
                                                   " is out of range; allowed: 1..", limit, " (",
                                                   max_pos_key, " in ", config_name, ")"));
  }
  // The trainer's own reading of config.json: a setting the decoder cannot
  // run (a missing key, a shape out of range, another activation) fails the
  // submission, not the job after it waited in the queue.
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(config.dump());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path: ", config_name, ": ", parsed.status().message()));
  }
  // Block diffusion attends bidirectionally within a block; a recurrence
  // (Gated DeltaNet) reads its tokens in order, and "the rest of the block"
  // has no meaning for it, so the pair is refused rather than given one.
  if (spec.task() == "block_diffusion" && parsed->has_linear_attention()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task = 'block_diffusion' cannot train ", config_name,
        ": its layer_types include linear_attention (Gated DeltaNet), a causal recurrence, and "
        "block diffusion's bidirectional-within-block mask has no defined meaning for it; use "
        "task causal_lm or generative_reranker, or a model of full_attention layers only"));
  }

  if (absl::Status s = CheckMoeSection(spec, config, config_name); !s.ok()) return s;
  if (absl::Status s = CheckModelFiles(spec.model().path()); !s.ok()) return s;
  if (const std::string& adapter = spec.lora().init_adapter(); !adapter.empty()) {
    if (absl::Status s = CheckPeftAdapter(adapter); !s.ok()) return s;
  }

  if (absl::Status s = CheckDataFile("data.path", spec.data().path()); !s.ok()) return s;
  if (const std::string& eval = spec.reranker().eval_path(); !eval.empty()) {
    if (absl::Status s = CheckDataFile("reranker.eval_path", eval); !s.ok()) return s;
  }
  if (const std::string& eval = spec.eval().path(); !eval.empty()) {
    if (absl::Status s = CheckDataFile("eval.path", eval); !s.ok()) return s;
  }
  if (const std::string& tokenizer = spec.data().tokenizer();
      !tokenizer.empty() && !fs::is_regular_file(tokenizer, ec) &&
      !fs::is_regular_file(fs::path(tokenizer) / "tokenizer.json", ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.tokenizer: ", tokenizer, " is neither a tokenizer.json nor a folder that holds one"));
  }
  return absl::OkStatus();
}

absl::Status PrepareJobSpec(v1::JobSpec* spec, const std::vector<std::string>& roots) {
  // The model's config.json supplies defaults: a model with experts gets a
  // moe section (which ApplyDefaults fills), and an SDAR checkpoint
  // block-diffusion keys. An unreadable one (or one past the roots) is
  // reported by ValidateJobSpecFiles, after the ranges.
  absl::StatusOr<nlohmann::json> config = absl::NotFoundError("model.path not read");
  if (!spec->model().path().empty() && CheckSpecPaths(*spec, roots).ok()) {
    config = ReadModelConfig(*spec, ConfigName(*spec));
  }
  if (config.ok()) {
    // Before the defaults fill the section, so that the error names the keys
    // the user wrote.
    if (absl::Status s = CheckMoeSection(*spec, *config, ConfigName(*spec)); !s.ok()) return s;
    if (HasExperts(*config)) spec->mutable_moe();
  }
  ApplyDefaults(spec);
  if (config.ok() && spec->task() == "block_diffusion") ApplySdarDefaults(*config, spec);
  if (absl::Status s = ValidateJobSpec(*spec); !s.ok()) return s;
  return ValidateJobSpecFiles(*spec, roots);
}

}  // namespace ballast
