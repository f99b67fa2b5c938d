#include "worker/train/collectives/step_phase.h"

#include <chrono>

namespace ballast::train {
namespace {

// Unix ms: RankPhase.since_ms is read by people and by the coordinator,
// which compares it with its own clock.
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::string_view StepPhase::Name(Kind kind) {
  switch (kind) {
    case Kind::kIdle:
      return "idle";
    case Kind::kData:
      return "data";
    case Kind::kForward:
      return "forward";
    case Kind::kBackward:
      return "backward";
    case Kind::kCollective:
      return "collective";
    case Kind::kOptimizer:
      return "optimizer";
    case Kind::kCheckpoint:
      return "checkpoint";
    case Kind::kEval:
      return "eval";
    case Kind::kExport:
      return "export";
  }
  return "idle";
}

StepPhase& StepPhase::OfThisRank() {
  static StepPhase* const phase = new StepPhase();
  return *phase;
}

void StepPhase::SetLocked(Kind kind, int32_t layer, absl::string_view collective, int64_t seq,
                          int64_t since_ms) {
  now_.kind = kind;
  now_.layer = layer;
  now_.collective = collective;
  now_.collective_seq = seq;
  now_.since_ms = since_ms;
  ++now_.version;
}

void StepPhase::BeginStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  now_.step = step;
  SetLocked(Kind::kData, -1, {}, 0, NowMs());
}

void StepPhase::Enter(Kind kind, int32_t layer) {
  absl::MutexLock lock(&mu_);
  SetLocked(kind, layer, {}, 0, NowMs());
}

StepPhase::Snapshot StepPhase::EnterCollective(absl::string_view name, int64_t seq) {
  absl::MutexLock lock(&mu_);
  const Snapshot left = now_;
  collective_start_ = std::chrono::steady_clock::now();
  SetLocked(Kind::kCollective, now_.layer, name, seq, NowMs());
  return left;
}

void StepPhase::LeaveCollective(const Snapshot& left) {
  absl::MutexLock lock(&mu_);
  collective_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              collective_start_)
                        .count();
  SetLocked(left.kind, left.layer, left.collective, left.collective_seq, left.since_ms);
}

StepPhase::Snapshot StepPhase::Read() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

double StepPhase::collective_ms() const {
  absl::MutexLock lock(&mu_);
  return collective_ms_;
}

}  // namespace ballast::train
