#include "worker/train/trainer/trainer.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <new>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/grad_norm.h"
#include "worker/train/checkpoint/export.h"
#include "worker/train/model/model_config.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/optim/lr_schedule.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// LibTorch reports through exceptions; they stop at the Trainer's API, where
// an allocation failure keeps its own code so that the caller can tell it
// from a bug.
template <typename F>
auto CatchTorch(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory: ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory: an allocation failed; lower data.micro_batch_size or data.seq_len");
  } catch (const c10::Error& e) {
    // The CPU allocator reports a failed allocation as a plain c10::Error
    // (an enforce in c10/core/impl/alloc_cpu.cpp), not as OutOfMemoryError:
    // its message is the only sign.
    if (absl::StrContains(e.what_without_backtrace(), "can't allocate memory")) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory: ", e.what_without_backtrace(),
                       "; lower data.micro_batch_size or data.seq_len"));
    }
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Creation: everything that can fail on the spec, the model or the data fails
// here, before step 0.

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir,
                                                         TrainerOptions options) {
  return CatchTorch([&]() -> absl::StatusOr<std::unique_ptr<Trainer>> {
    if (!options.device.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", options.device.str(), " is not supported yet; the trainer runs on cpu"));
    }
    absl::StatusOr<std::unique_ptr<Objective>> objective = MakeObjective(spec);
    if (!objective.ok()) return objective.status();
    absl::StatusOr<ModelConfig> config = LoadModelConfig(spec.model().path());
    if (!config.ok()) return config.status();
    absl::StatusOr<TokenizedDataset> data =
        TokenizedDataset::Load(spec.data().path(), config->vocab_size, spec.data().seq_len());
    if (!data.ok()) return data.status();

    const bool full = spec.method() == "full";
    absl::StatusOr<ParamStore> params = LoadPretrained(spec.model().path(), *config, full);
    if (!params.ok()) return params.status();
    // Seeds LoRA init and dropout; checkpoints carry the generator onward.
    torch::manual_seed(spec.seed());
    std::optional<LoraConfig> lora;
    if (!full) {
      lora = LoraConfigFromSpec(spec.lora());
      if (absl::Status s = AddLoraAdapters(*config, *lora, &*params); !s.ok()) return s;
      if (!spec.lora().init_adapter().empty()) {
        absl::Status s = LoadPeftAdapter(spec.lora().init_adapter(), *lora, &*params);
        if (!s.ok()) return s;
      }
    }
    return std::unique_ptr<Trainer>(new Trainer(spec, out_dir, options, *std::move(config),
                                                *std::move(params), std::move(lora),
                                                *std::move(data), *std::move(objective)));
  });
}

Trainer::Trainer(v1::JobSpec spec, std::string out_dir, TrainerOptions options, ModelConfig config,
                 ParamStore params, std::optional<LoraConfig> lora, TokenizedDataset data,
                 std::unique_ptr<Objective> objective)
    : spec_(std::move(spec)),
      out_dir_(std::move(out_dir)),
      checkpoints_dir_((fs::path(out_dir_) / "checkpoints").string()),
      resume_at_or_before_(options.resume_at_or_before),
      device_(options.device),
      collectives_(options.collectives != nullptr ? options.collectives : &single_rank_),
      observer_(options.observer != nullptr ? options.observer : &null_observer_),
      config_(std::move(config)),
      params_(std::move(params)),
      lora_(std::move(lora)),
      data_(std::move(data)),
      decoder_(config_, &params_, lora_,
               spec_.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat,
               spec_.gradient_checkpointing()),
      objective_(std::move(objective)),
      optimizer_(AdamWConfig{spec_.optimizer().beta1(), spec_.optimizer().beta2(),
                             spec_.optimizer().eps(), spec_.optimizer().weight_decay()},
                 params_),
      guard_(options.guard) {}

Trainer::~Trainer() = default;

// ---------------------------------------------------------------------------
// The run: resume, steps, checkpoints, export.

absl::Status Trainer::Run() {
  return CatchTorch([&] { return RunSteps(); });
}

absl::Status Trainer::RunSteps() {
  std::error_code ec;
  fs::create_directories(checkpoints_dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", checkpoints_dir_));

  absl::StatusOr<std::optional<std::string>> resume_from = ResumeCheckpoint();
  if (!resume_from.ok()) return resume_from.status();
  TrainPosition pos;
  if (*resume_from) {
    absl::StatusOr<TrainPosition> loaded = LoadCheckpoint(**resume_from, &params_, &optimizer_);
    if (!loaded.ok()) return loaded.status();
    pos = *loaded;
    Log("info", absl::StrCat("resuming from checkpoint step ", pos.step, " (", **resume_from,
                             ") to step ", spec_.max_steps()));
  } else {
    Log("info", absl::StrCat("starting at step 0 of ", spec_.max_steps()));
  }
  absl::StatusOr<MetricsLog> metrics =
      MetricsLog::Open((fs::path(out_dir_) / "metrics.jsonl").string(), pos.step);
  if (!metrics.ok()) return metrics.status();

  while (pos.step < spec_.max_steps()) {
    GuardVerdict verdict;
    const StepRecord record = Step(&pos, &verdict);
    if (absl::Status s = metrics->Append(record); !s.ok()) return s;
    Report(record, verdict);
    if (verdict.action == GuardAction::kRollback) {
      if (absl::Status s = Rollback(verdict, record.step, &pos, &*metrics); !s.ok()) return s;
      continue;
    }
    if (observer_->StopRequested()) {
      Log("info", absl::StrCat("cancelled after step ", pos.step));
      return absl::CancelledError(absl::StrCat("cancelled after step ", pos.step));
    }
    const int64_t every = spec_.checkpoint_every();
    if (every > 0 && pos.step % every == 0 && pos.step < spec_.max_steps()) {
      if (absl::Status s = SaveCheckpointAt(pos); !s.ok()) return s;
    }
  }
  if (absl::Status s = SaveCheckpointAt(pos); !s.ok()) return s;
  return Export();
}

// ---------------------------------------------------------------------------
// The step.

StepRecord Trainer::Step(TrainPosition* pos, GuardVerdict* verdict) {
  const auto start = std::chrono::steady_clock::now();
  const v1::DataSpec& d = spec_.data();
  StepRecord m;
  m.step = pos->step + 1;
  m.lr = ScheduledLearningRate(spec_.schedule().kind(), spec_.optimizer().lr(), pos->step,
                               spec_.schedule().warmup_steps(), spec_.max_steps());
  *verdict = GuardVerdict{};

  // Batch: every micro-batch of the step, and the step's token counts over
  // all ranks, so that the loss scale is known before the first backward.
  std::vector<PackedBatch> micro_batches;
  at::Tensor counts = torch::zeros({2}, torch::kLong);  // (tokens, supervised tokens)
  for (int64_t i = 0; i < d.grad_accum_steps(); ++i) {
    micro_batches.push_back(
        data_.Pack(pos->data_cursor, d.micro_batch_size(), d.shuffle(), spec_.seed()));
    pos->data_cursor += d.micro_batch_size();
    counts[0] += micro_batches.back().input_ids.numel();
    counts[1] += micro_batches.back().supervised_tokens;
  }
  pos->step += 1;
  collectives_->SumInPlace(counts);
  m.tokens = counts[0].item<int64_t>();
  m.supervised_tokens = counts[1].item<int64_t>();
  if (m.supervised_tokens == 0) {
    // No loss to learn from or to judge: skipped on every rank alike.
    verdict->action = GuardAction::kSkip;
    verdict->reason = "no supervised tokens";
    m.skipped = true;
    m.skip_reason = verdict->reason;
    m.step_time_s = SecondsSince(start);
    return m;
  }

  // Forward and backward, each micro-batch's loss sum scaled by the step's
  // global count.
  const double n = static_cast<double>(m.supervised_tokens);
  double loss_sum = 0;
  for (const PackedBatch& batch : micro_batches) {
    kernels::LossSum ls = objective_->Loss(decoder_, batch, /*training=*/true);
    (ls.sum / n).backward();
    loss_sum += ls.sum.item<double>();
  }

  // Reduce: the loss sum and the gradient's per-tensor sums of squares over
  // ranks, in one call; grad_norm is the fp32 global L2 norm.
  std::vector<std::string> names = params_.TrainableNames();
  std::vector<at::Tensor> grads;
  for (const std::string& name : names) grads.push_back(params_.get(name).grad());
  kernels::GradNormResult gn = kernels::grad_norm(grads);
  at::Tensor sums = torch::cat({torch::tensor({loss_sum}, torch::kDouble),
                                gn.sum_squares.to(torch::kDouble)});  // (1 + tensors)
  collectives_->SumInPlace(sums);
  m.loss = sums[0].item<double>() / n;
  m.grad_norm = static_cast<float>(std::sqrt(sums.narrow(0, 1, grads.size()).sum().item<double>()));

  // Guard: a step the ranks do not all find healthy never reaches the weights.
  StepHealth health;
  health.step = m.step;
  health.loss = *m.loss;
  health.grad_norm = m.grad_norm;
  if (gn.first_nonfinite >= 0) health.first_nonfinite = names[gn.first_nonfinite];
  *verdict = guard_.Judge(health);
  const auto agreed =
      static_cast<GuardAction>(collectives_->Max(static_cast<int64_t>(verdict->action)));
  if (agreed != verdict->action) {
    verdict->action = agreed;
    verdict->reason = "another rank's gradient or loss is not finite";
  }
  guard_.Acted(agreed);

  if (agreed == GuardAction::kApply) {
    // Clip as torch.nn.utils.clip_grad_norm_ does, then update.
    const double max_norm = spec_.optimizer().max_grad_norm();
    if (max_norm > 0) {
      const double coef = std::min(1.0, max_norm / (m.grad_norm + 1e-6));
      if (coef < 1.0) {
        torch::NoGradGuard no_grad;
        for (at::Tensor& g : grads) {
          if (g.defined()) g.mul_(coef);
        }
      }
    }
    optimizer_.Step(params_, m.lr);
  } else {
    m.skipped = true;
    m.skip_reason = verdict->reason;
  }
  for (const std::string& name : names) {
    at::Tensor p = params_.get(name);
    if (p.grad().defined()) p.mutable_grad().reset();
  }
  m.step_time_s = SecondsSince(start);
  return m;
}

// ---------------------------------------------------------------------------
// Checkpoints, rollback, export and reports.

absl::StatusOr<std::optional<std::string>> Trainer::ResumeCheckpoint() const {
  // A rollback deletes the newer checkpoints, so that a later restart cannot
  // jump forward again.
  if (resume_at_or_before_ > 0) {
    return KeepCheckpointsAtOrBefore(checkpoints_dir_, resume_at_or_before_);
  }
  return LatestCheckpoint(checkpoints_dir_);
}

absl::Status Trainer::SaveCheckpointAt(const TrainPosition& pos) {
  absl::StatusOr<std::string> dir = SaveCheckpoint(checkpoints_dir_, pos, params_, optimizer_);
  if (!dir.ok()) return dir.status();
  v1::CheckpointSaved saved;
  saved.set_step(pos.step);
  saved.set_path(*dir);
  observer_->OnCheckpointSaved(saved);
  return absl::OkStatus();
}

absl::Status Trainer::Rollback(const GuardVerdict& verdict, int64_t step, TrainPosition* pos,
                               MetricsLog* metrics) {
  std::optional<std::string> checkpoint =
      verdict.budget_spent ? std::nullopt : LatestCheckpoint(checkpoints_dir_);
  if (!checkpoint) {
    const std::string diagnosis = absl::StrCat(
        "guard: step ", step, ": ", verdict.reason,
        verdict.budget_spent ? ""
                             : "; there is no checkpoint to roll back to (set checkpoint_every)");
    v1::GuardEvent event;
    event.set_kind(v1::GuardEvent::KIND_DIAGNOSIS);
    event.set_step(step);
    event.set_message(diagnosis);
    observer_->OnGuard(event);
    Log("error", diagnosis);
    return absl::FailedPreconditionError(diagnosis);
  }
  absl::StatusOr<TrainPosition> loaded = LoadCheckpoint(*checkpoint, &params_, &optimizer_);
  if (!loaded.ok()) return loaded.status();
  *pos = *loaded;
  if (absl::Status s = metrics->TruncateAfter(pos->step); !s.ok()) return s;
  v1::GuardEvent event;
  event.set_kind(v1::GuardEvent::KIND_ROLLBACK);
  event.set_step(step);
  event.set_to_step(pos->step);
  event.set_message(absl::StrCat(verdict.reason, "; rolled back to step ", pos->step));
  observer_->OnGuard(event);
  Log("warning", event.message());
  return absl::OkStatus();
}

absl::Status Trainer::Export() {
  absl::Status s;
  fs::path dir;
  if (lora_) {
    dir = fs::path(out_dir_) / "adapter";
    s = SavePeftAdapter(dir.string(), spec_.model().path(), *lora_, params_);
  } else {
    dir = fs::path(out_dir_) / "model";
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const std::string& name : params_.names()) tensors.emplace_back(name, params_.get(name));
    s = ExportHfModel(spec_.model().path(), dir.string(), tensors);
  }
  if (s.ok()) Log("info", absl::StrCat("exported ", dir.string()));
  return s;
}

// One step's metrics to the observer; a skipped step is also a guard event.
void Trainer::Report(const StepRecord& m, const GuardVerdict& verdict) {
  v1::StepMetrics out;
  out.set_step(m.step);
  out.set_max_steps(spec_.max_steps());
  if (m.loss) out.set_loss(*m.loss);  // absent: the step had no supervised tokens
  out.set_grad_norm(m.grad_norm);
  out.set_lr(m.lr);
  out.set_tokens(m.tokens);
  out.set_supervised_tokens(m.supervised_tokens);
  out.set_tokens_per_s(m.step_time_s > 0 ? m.tokens / m.step_time_s : 0);
  out.set_step_time_s(m.step_time_s);
  out.set_skipped(m.skipped);
  observer_->OnStep(out);
  if (verdict.action == GuardAction::kSkip) {
    v1::GuardEvent guard;
    guard.set_kind(v1::GuardEvent::KIND_SKIP);
    guard.set_step(m.step);
    guard.set_message(m.skip_reason);
    observer_->OnGuard(guard);
  }
}

// A line for the rank log (stderr) and the job's event stream.
void Trainer::Log(const std::string& level, const std::string& text) {
  std::cerr << "ballast-train: " << text << std::endl;
  observer_->OnLog(level, text);
}

}  // namespace ballast::train
