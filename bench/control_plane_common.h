// What control_plane_bench and control_plane_soak share as gRPC clients of
// ballastd: a deadline on every call, and a folder holding the inputs their
// jobs name. Bench-only: header-only, no error handling beyond what a
// benchmark that exits on failure needs.
#ifndef BALLAST_BENCH_CONTROL_PLANE_COMMON_H_
#define BALLAST_BENCH_CONTROL_PLANE_COMMON_H_

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "ballast/v1/job_spec.pb.h"

namespace ballast::bench {

// A context for one call (or one stream) that ends `seconds` from now.
inline std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return c;
}

// A fresh folder under the system's temporary folder, removed with the
// object, holding what a job's spec must name to be accepted: a model folder
// with a small Qwen3 config.json (no weights) and a one-row data file.
// Enough to submit and schedule jobs, never to train them. Not thread-safe
// to construct; Spec() may be called from any thread.
class SpecFolder {
 public:
  // The folder is named prefix-XXXXXX.
  explicit SpecFolder(const std::string& prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    dir_ = mkdtemp(tmpl.data());
    std::filesystem::create_directories(dir_ / "model");
    std::ofstream(dir_ / "model" / "config.json")
        << R"({"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "model_type": "qwen3", "max_position_embeddings": 4096})";
    std::ofstream(dir_ / "data.jsonl") << "{\"input_ids\": [1, 2]}\n";
  }
  ~SpecFolder() { std::filesystem::remove_all(dir_); }
  SpecFolder(const SpecFolder&) = delete;
  SpecFolder& operator=(const SpecFolder&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

  // A job on the folder's model and data: seq_len 1024, lr 1e-4, max_steps.
  ballast::v1::JobSpec Spec(int64_t max_steps) const {
    ballast::v1::JobSpec spec;
    spec.mutable_model()->set_path((dir_ / "model").string());
    spec.mutable_data()->set_path((dir_ / "data.jsonl").string());
    spec.mutable_data()->set_seq_len(1024);
    spec.mutable_optimizer()->set_lr(1e-4);
    spec.set_max_steps(max_steps);
    return spec;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace ballast::bench

#endif  // BALLAST_BENCH_CONTROL_PLANE_COMMON_H_
