// FaultInjection: the faults a spec's guard.inject asks for, for tests and
// demos of the guard (README, "Guard"). With nothing asked for, every call
// is a no-op, and a real run never asks.
//
// What each fault imitates:
//   nan_grad_at_step     a kernel or a device that writes a NaN into one
//                        gradient (on rank on_rank)
//   inf_loss_at_step     an overflowing loss (on rank on_rank)
//   spike_at_step        a batch whose loss and gradient are 1000x the usual
//   zero_tokens_at_steps a step whose labels are all masked (every rank)
//   nan_weight_at_step   silent corruption of a weight after an update
// Each happens the first time the run reaches its step, not again when a
// rollback takes the run back before it. The first three repeat when the
// guard re-runs the step (a deterministic fault) unless
// guard.inject.transient is set.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_GUARD_FAULT_INJECTION_H_
#define BALLAST_WORKER_TRAIN_GUARD_FAULT_INJECTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ballast/v1/job_spec.pb.h"
#include "worker/train/data/packed_batch.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

class FaultInjection {
 public:
  FaultInjection(const v1::GuardInject& spec, int rank);

  // What the spec asks for, in words, for the run's log; empty when nothing.
  std::string Describe() const;

  // Called as step `step` begins (1-based), before the calls below.
  void BeginStep(int64_t step);

  // zero_tokens_at_steps: masks every target of the step's batches.
  void MaskTargets(int64_t step, std::vector<PackedBatch>* batches) const;
  // What the step's loss is multiplied by on this rank before its backward:
  // 1, +inf (inf_loss_at_step) or 1000 (spike_at_step). `rerun`: the guard's
  // re-run of the step.
  double LossFactor(int64_t step, bool rerun) const;
  // nan_grad_at_step: a NaN into the last non-empty gradient of `grads`.
  void PoisonGradient(int64_t step, bool rerun, const std::vector<at::Tensor>& grads) const;
  // nan_weight_at_step: a NaN into the last non-empty trainable tensor.
  void PoisonWeights(int64_t step, const ParamStore& trained) const;

 private:
  bool Fires(const google::protobuf::RepeatedField<int64_t>& steps, int64_t step, bool rerun,
             bool this_rank_only) const;

  const v1::GuardInject spec_;
  const int rank_;
  // The furthest step the run has begun, and whether the current step goes
  // past it (faults fire only then).
  int64_t furthest_ = 0;
  bool fresh_ = false;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_GUARD_FAULT_INJECTION_H_
