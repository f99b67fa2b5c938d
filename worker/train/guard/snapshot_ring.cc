#include "worker/train/guard/snapshot_ring.h"

#include <torch/torch.h>

#include "worker/train/model/rng_state.h"

namespace ballast::train {
namespace {

// A copy on the host that no later in-place update of `t` can reach.
at::Tensor HostCopy(const at::Tensor& t) {
  return t.device().is_cpu() ? t.detach().clone() : t.detach().to(torch::kCPU);
}

}  // namespace

void SnapshotRing::Take(const TrainPosition& position, const ParamStore& trained,
                        const AdamW& optimizer, c10::Device device,
                        std::map<std::string, at::Tensor> buffers) {
  TrainSnapshot snapshot;
  snapshot.position = position;
  for (const std::string& name : trained.TrainableNames()) {
    snapshot.trained.emplace(name, HostCopy(trained.get(name)));
  }
  for (const auto& [name, t] : optimizer.StateDict()) snapshot.optimizer.emplace(name, HostCopy(t));
  snapshot.generators = GeneratorStates(device);
  snapshot.buffers = std::move(buffers);
  ring_.push_back(std::move(snapshot));
  while (static_cast<int64_t>(ring_.size()) > capacity_) ring_.pop_front();
}

void SnapshotRing::MarkGood(int64_t step, int64_t clean_steps, int64_t good_after) {
  for (TrainSnapshot& s : ring_) {
    const int64_t after = step - s.position.step;
    if (!s.good && after >= good_after && clean_steps >= after) s.good = true;
  }
}

const TrainSnapshot* SnapshotRing::NewestGoodBefore(int64_t before_step) const {
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it) {
    if (it->good && it->position.step < before_step) return &*it;
  }
  return nullptr;
}

absl::Status SnapshotRing::Restore(const TrainSnapshot& snapshot, ParamStore* trained,
                                   AdamW* optimizer, c10::Device device) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : snapshot.trained) trained->get(name).copy_(t);
  if (absl::Status s = optimizer->LoadStateDict(snapshot.optimizer); !s.ok()) return s;
  SetGeneratorStates(snapshot.generators, device);
  return absl::OkStatus();
}

void SnapshotRing::DropAfter(int64_t step) {
  while (!ring_.empty() && ring_.back().position.step > step) ring_.pop_back();
}

std::vector<int64_t> SnapshotRing::BestEvaluationSteps() const {
  std::vector<int64_t> steps;
  for (const TrainSnapshot& snapshot : ring_) {
    if (snapshot.position.eval.best_step >= 0) steps.push_back(snapshot.position.eval.best_step);
  }
  return steps;
}

}  // namespace ballast::train
