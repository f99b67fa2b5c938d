// Shared fixtures of the server tests: a temporary folder and a job spec
// whose model config and data file really exist, so submission validation
// passes on the same code path as in production.
#ifndef BALLAST_TESTS_UNIT_SERVER_TEST_UTIL_H_
#define BALLAST_TESTS_UNIT_SERVER_TEST_UTIL_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ballast/v1/job_spec.pb.h"

namespace ballast::server::testing {

// A fresh folder under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ballast-server-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes model/config.json (max_position_embeddings 2048) and data.jsonl
// under `dir`, and returns a small valid LoRA spec over them.
inline v1::JobSpec ValidSpec(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "model");
  std::ofstream(dir / "model" / "config.json")
      << R"({"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "model_type": "qwen3", "max_position_embeddings": 2048})";
  std::ofstream(dir / "data.jsonl") << R"({"input_ids": [1, 2, 3]})"
                                    << "\n";
  v1::JobSpec spec;
  spec.set_name("test");
  spec.mutable_model()->set_path((dir / "model").string());
  spec.mutable_data()->set_path((dir / "data.jsonl").string());
  spec.mutable_data()->set_seq_len(512);
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.set_max_steps(100);
  return spec;
}

}  // namespace ballast::server::testing

#endif  // BALLAST_TESTS_UNIT_SERVER_TEST_UTIL_H_
