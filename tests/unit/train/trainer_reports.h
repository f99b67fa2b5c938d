// What a Trainer reports, for the trainer's tests: its observer calls, and
// the lines of its metrics.jsonl.
#ifndef BALLAST_TESTS_UNIT_TRAIN_TRAINER_REPORTS_H_
#define BALLAST_TESTS_UNIT_TRAIN_TRAINER_REPORTS_H_

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/train/trainer/training_observer.h"

namespace ballast::train {

// Records every report, and asks the run to stop after `stop_after` steps
// (0: never).
class RecordingObserver : public TrainingObserver {
 public:
  void OnEvent(const v1::TrainingEvent& e) override {
    if (e.has_step_metrics()) steps.push_back(e.step_metrics());
    if (e.has_guard()) guards.push_back(e.guard());
    if (e.has_checkpoint_saved()) checkpoints.push_back(e.checkpoint_saved());
    if (e.has_data()) data.push_back(e.data());
    if (e.has_eval()) evals.push_back(e.eval());
    if (e.has_log()) logs.push_back(e.log().text());
  }
  bool StopRequested() override { return stop_after > 0 && steps.size() >= stop_after; }

  // The guard events of one kind, in order.
  std::vector<v1::GuardEvent> Of(v1::GuardEvent::Kind kind) const {
    std::vector<v1::GuardEvent> out;
    for (const v1::GuardEvent& e : guards) {
      if (e.kind() == kind) out.push_back(e);
    }
    return out;
  }

  std::vector<v1::StepMetrics> steps;
  std::vector<v1::GuardEvent> guards;
  std::vector<v1::CheckpointSaved> checkpoints;
  std::vector<v1::DataReport> data;
  std::vector<v1::EvalReport> evals;
  std::vector<std::string> logs;
  size_t stop_after = 0;
};

// The lines of out_dir/metrics.jsonl.
inline std::vector<nlohmann::json> ReadMetricsLines(const std::string& out_dir) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(std::filesystem::path(out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace ballast::train

#endif  // BALLAST_TESTS_UNIT_TRAIN_TRAINER_REPORTS_H_
