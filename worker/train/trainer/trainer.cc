#include "worker/train/trainer/trainer.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model_config.h"
#include "kernels/grad_norm.h"
#include "worker/train/checkpoint/export.h"
#include "worker/train/checkpoint/sharded_checkpoint.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/model/rng_state.h"
#include "worker/train/objective/ranking_metrics.h"
#include "worker/train/optim/lr_schedule.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
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

// The index of the first non-finite value, or -1.
int64_t FirstNonFinite(const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

GuardOptions GuardOptionsFrom(const v1::GuardSpec& spec) {
  GuardOptions options;
  options.max_consecutive_bad = spec.max_consecutive_bad();
  options.max_rollbacks = spec.max_rollbacks();
  options.spike_window = spec.spike_window();
  options.loss_spike_zscore = spec.loss_spike_zscore();
  options.grad_norm_spike_zscore = spec.grad_norm_spike_zscore();
  options.collapse_window = spec.collapse_window();
  options.collapse_loss = spec.collapse_loss();
  options.lr_cut = spec.lr_cut();
  options.rewarm_steps = spec.rewarm_steps();
  return options;
}

}  // namespace

// ---------------------------------------------------------------------------
// Creation: everything that can fail on the spec, the model or the data fails
// here, before step 0.

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir,
                                                         TrainerOptions options) {
  return CatchTorch([&]() -> absl::StatusOr<std::unique_ptr<Trainer>> {
    if (!options.device.is_cpu() && !options.device.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", options.device.str(), ": the trainer runs on cpu or cuda"));
    }
    const int world_size = options.collectives != nullptr ? options.collectives->world_size() : 1;
    if (spec.data().grad_accum_steps() % world_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.grad_accum_steps ", spec.data().grad_accum_steps(),
          " is not a multiple of the world size ", world_size,
          ": each rank takes an equal share of a step's micro-batches (set it to a multiple of ",
          world_size, "; the step's batch stays micro_batch_size x grad_accum_steps)"));
    }
    absl::StatusOr<ModelConfig> config = LoadModelConfig(spec.model().path());
    if (!config.ok()) return config.status();
    // Tokenized once per job: restarts and the ranks of one machine read the
    // cache that the first one built.
    absl::StatusOr<TrainingData> data =
        OpenTrainingData(spec, {.cache_dir = options.data_cache_dir.empty()
                                                 ? (fs::path(out_dir) / "data-cache").string()
                                                 : options.data_cache_dir,
                                .vocab_size = config->vocab_size});
    if (!data.ok()) return data.status();
    absl::StatusOr<std::unique_ptr<Objective>> objective =
        MakeObjective(spec, data->encoder->tokenizer());
    if (!objective.ok()) return objective.status();

    const bool full = spec.method() == "full";
    absl::StatusOr<ParamStore> params =
        LoadPretrained(spec.model().path(), *config, full,
                       world_size > 1 ? PretrainedTensors::kMapped : PretrainedTensors::kOwnedFp32);
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
    // The model was built on the CPU, LoRA's initial draws included, so that
    // it starts from the same weights on any device.
    const at::ScalarType compute = spec.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat;
    std::unique_ptr<ShardedModel> sharded;
    if (world_size > 1) {
      // Every rank built the same whole model from the same seed; each keeps
      // its shard of it, and draws its own dropout masks from here on.
      sharded = std::make_unique<ShardedModel>(*std::move(params), options.collectives, compute,
                                               options.device);
      *params = ParamStore();
      torch::manual_seed(spec.seed() + options.collectives->rank());
    } else {
      params->MoveTo(options.device, compute);
    }
    return std::unique_ptr<Trainer>(
        new Trainer(spec, out_dir, options, *std::move(config), *std::move(params),
                    std::move(sharded), std::move(lora), *std::move(data), *std::move(objective)));
  });
}

Trainer::Trainer(v1::JobSpec spec, std::string out_dir, TrainerOptions options, ModelConfig config,
                 ParamStore params, std::unique_ptr<ShardedModel> sharded,
                 std::optional<LoraConfig> lora, TrainingData data,
                 std::unique_ptr<Objective> objective)
    : spec_(std::move(spec)),
      out_dir_(std::move(out_dir)),
      checkpoints_dir_((fs::path(out_dir_) / "checkpoints").string()),
      kept_checkpoints_dir_(options.kept_checkpoints_dir.empty() ? checkpoints_dir_
                                                                 : options.kept_checkpoints_dir),
      resume_at_or_before_(options.resume_at_or_before),
      device_(options.device),
      collectives_(options.collectives != nullptr ? options.collectives : &single_rank_),
      observer_(options.observer != nullptr ? options.observer : &null_observer_),
      config_(std::move(config)),
      params_(std::move(params)),
      sharded_(std::move(sharded)),
      lora_(std::move(lora)),
      data_(std::move(data)),
      batches_(data_.dataset.get(),
               StepBatchesOptions{spec_.data().micro_batch_size(), spec_.data().grad_accum_steps(),
                                  collectives_->rank(), collectives_->world_size(), device_}),
      decoder_(config_, sharded_ ? &sharded_->gathered() : &params_, lora_,
               spec_.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat,
               spec_.gradient_checkpointing()),
      objective_(std::move(objective)),
      optimizer_(AdamWConfig{spec_.optimizer().beta1(), spec_.optimizer().beta2(),
                             spec_.optimizer().eps(), spec_.optimizer().weight_decay()},
                 trained()),
      guard_(GuardOptionsFrom(spec_.guard())),
      injection_(spec_.guard().inject(), collectives_->rank()),
      snapshots_(spec_.guard().snapshots()) {
  // Accounting: what this rank keeps resident for the whole run.
  int64_t parameter_bytes = 0, gradient_bytes = 0, gathered_bytes = 0;
  if (sharded_) {
    decoder_.set_layer_runner(sharded_.get());
    parameter_bytes = sharded_->parameter_bytes();
    gradient_bytes = sharded_->gradient_bytes();
    gathered_bytes = sharded_->gathered_buffer_bytes();
  } else {
    for (const std::string& name : params_.names()) parameter_bytes += params_.get(name).nbytes();
    gradient_bytes = params_.TrainableNumel() * static_cast<int64_t>(sizeof(float));
  }
  // AdamW keeps two fp32 moments per trainable element.
  Log("info", absl::StrCat(
                  "rank ", collectives_->rank(), " of ", collectives_->world_size(), " on ",
                  device_.str(), " (", spec_.precision(), ") holds ", parameter_bytes,
                  " parameter bytes, ", gradient_bytes, " gradient bytes, ", 2 * gradient_bytes,
                  " optimizer bytes, and gathers up to ", gathered_bytes, " bytes of whole units"));
}

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

  // Rank 0 alone applies a rollback to the shared checkpoints folder; the
  // others look once it has.
  absl::StatusOr<std::optional<std::string>> resume_from;
  if (collectives_->rank() == 0) resume_from = ResumeCheckpoint();
  collectives_->Barrier();
  if (collectives_->rank() != 0) resume_from = ResumeCheckpoint();
  if (!resume_from.ok()) return resume_from.status();
  TrainPosition pos;
  if (*resume_from) {
    absl::StatusOr<TrainPosition> loaded = LoadState(**resume_from);
    if (!loaded.ok()) return loaded.status();
    pos = *loaded;
    Log("info", absl::StrCat("resuming from checkpoint step ", pos.step, " (", **resume_from,
                             ") to step ", spec_.max_steps()));
  } else {
    Log("info", absl::StrCat("starting at step 0 of ", spec_.max_steps()));
  }
  if (const std::string faults = injection_.Describe(); !faults.empty()) Log("warning", faults);
  const v1::DataReport& data = data_.report;
  Log("info",
      absl::StrCat("data: ", spec_.data().path(), " as ", data.format(),
                   spec_.data().format().empty() ? " (detected from its first record)" : "",
                   data.template_().empty() ? "" : absl::StrCat(", template ", data.template_()),
                   spec_.data().template_().empty() && !data.template_().empty()
                       ? " (from the tokenizer_config.json)"
                       : "",
                   data.tokenized() ? "; tokenized into the job's token cache"
                                    : "; read from the job's token cache"));
  // The state the run starts from is good (the initial weights, or a good
  // checkpoint): the first snapshot to go back to.
  snapshots_.Take(pos, trained(), optimizer_, device_);
  snapshots_.MarkGood(pos.step, 0, 0);
  // One metrics.jsonl per job: every rank computes the same step records.
  std::optional<MetricsLog> metrics;
  if (writes_shared_files()) {
    absl::StatusOr<MetricsLog> opened =
        MetricsLog::Open((fs::path(out_dir_) / "metrics.jsonl").string(), pos.step);
    if (!opened.ok()) return opened.status();
    metrics = *std::move(opened);
  }

  // The baseline a reranker's evaluations rise from.
  if (pos.step == 0) Evaluate(0);
  bool traffic_logged = false;
  int64_t reported_epoch = -1;
  while (pos.step < spec_.max_steps()) {
    if (const int64_t epoch = pos.data_cursor / data_.dataset->rows_per_epoch();
        epoch != reported_epoch) {
      ReportData(epoch);
      reported_epoch = epoch;
    }
    GuardVerdict verdict;
    const StepRecord record = Step(&pos, &verdict);
    if (collectives_->world_size() > 1 && !traffic_logged) {
      // Every step moves the same bytes; events carry each step's figure.
      Log("info", absl::StrCat("rank ", collectives_->rank(), " sent ", record.communicated_bytes,
                               " bytes in collectives in step ", record.step));
      traffic_logged = true;
    }
    if (metrics) {
      if (absl::Status s = metrics->Append(record); !s.ok()) return s;
    }
    Report(record, verdict);
    if (verdict.action == GuardAction::kRollback) {
      if (absl::Status s = Rollback(verdict, record.step, &pos, metrics ? &*metrics : nullptr);
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (verdict.action == GuardAction::kApply) {
      if (absl::Status s = AfterAppliedStep(pos); !s.ok()) return s;
      const int64_t eval_every = spec_.reranker().eval_every();
      if (eval_every > 0 && pos.step % eval_every == 0) Evaluate(pos.step);
    }
    // Agreed: a SIGTERM or a cancel reaches the ranks at different moments,
    // and a rank that stopped alone would leave the others in the next
    // step's collectives, failing them with "lost rank".
    if (collectives_->Max(observer_->StopRequested() ? 1 : 0) != 0) {
      Log("info", absl::StrCat("cancelled after step ", pos.step));
      return absl::CancelledError(absl::StrCat("cancelled after step ", pos.step));
    }
    const int64_t every = spec_.checkpoint_every();
    if (every > 0 && pos.step % every == 0 && pos.step < spec_.max_steps()) {
      // Good once guard.good_after_steps clean steps have followed it. A
      // refusal (a non-finite state) was reported; the run goes on, and the
      // guard meets the same values in the next step.
      const CheckpointHealth health = spec_.guard().good_after_steps() > 0
                                          ? CheckpointHealth::kUnverified
                                          : CheckpointHealth::kGood;
      absl::Status s = SaveCheckpointAt(pos, health);
      if (!s.ok() && !absl::IsFailedPrecondition(s)) return s;
    }
  }
  if (data_.eval != nullptr &&
      (spec_.reranker().eval_every() == 0 || pos.step % spec_.reranker().eval_every() != 0)) {
    Evaluate(pos.step);
  }
  // The run is over and its last step was applied: nothing follows to judge
  // this checkpoint by, and the export holds the same state.
  if (absl::Status s = SaveCheckpointAt(pos, CheckpointHealth::kGood); !s.ok()) {
    if (!absl::IsFailedPrecondition(s)) return s;
    anomaly_ = v1::GuardEvent();
    anomaly_.set_step(pos.step);
    anomaly_.set_trigger(TriggerName(GuardTrigger::kNonFinite));
    anomaly_.set_rank(-1);
    return Diagnose(anomaly_, absl::StrCat(s.message(), "; the trained weights are not exported"));
  }
  return Export();
}

// ---------------------------------------------------------------------------
// The step.

StepRecord Trainer::Step(TrainPosition* pos, GuardVerdict* verdict) {
  const auto start = std::chrono::steady_clock::now();
  StepRecord m;
  m.step = pos->step + 1;
  m.lr = ScheduledLearningRate(spec_.schedule().kind(), spec_.optimizer().lr(), pos->step,
                               spec_.schedule().warmup_steps(), spec_.max_steps()) *
         guard_.LrScale();
  *verdict = GuardVerdict{};
  anomaly_ = v1::GuardEvent();

  // Batch: this rank's micro-batches of the step, packed during the last one.
  const int64_t communicated_before = collectives_->communicated_bytes();
  std::vector<PackedBatch> micro_batches = batches_.Take(pos->data_cursor);
  const int64_t first_document = pos->data_cursor;
  pos->data_cursor += batches_.rows_per_step();
  pos->step += 1;
  injection_.BeginStep(m.step);
  injection_.MaskTargets(m.step, &micro_batches);
  // What a re-run starts from besides the weights, which only an applied
  // update changes: the generators (dropout) as the step found them.
  const bool rerun_allowed = spec_.guard().rerun_bad_step();
  std::map<std::string, at::Tensor> generators;
  if (rerun_allowed) generators = GeneratorStates(device_);

  StepNumbers numbers = Compute(micro_batches, m.step, /*rerun=*/false);
  TensorNorms norms;
  StepHealth health = Measure(numbers, &m, &norms);
  // Guard: a step the ranks do not all find healthy never reaches the weights.
  *verdict = Judge(health);
  if (verdict->action != GuardAction::kApply) {
    DescribeAnomaly(norms, health, *verdict, first_document);
    const bool one_step_fault =
        verdict->trigger == GuardTrigger::kNonFinite || verdict->trigger == GuardTrigger::kSpike;
    if (rerun_allowed && one_step_fault) {
      // Before anything changes: the same weights, generators and batch
      // again. Healthy now means the fault was not in the numbers.
      ClearGradients();
      SetGeneratorStates(generators, device_);
      StepRecord again = m;
      const StepNumbers rerun_numbers = Compute(micro_batches, m.step, /*rerun=*/true);
      TensorNorms rerun_norms;
      const StepHealth rerun_health = Measure(rerun_numbers, &again, &rerun_norms);
      const GuardVerdict rerun_verdict = Judge(rerun_health);
      if (rerun_verdict.action == GuardAction::kApply) {
        anomaly_.set_kind(v1::GuardEvent::KIND_RECOVERED);
        anomaly_.set_verdict(v1::GuardEvent::VERDICT_TRANSIENT);
        anomaly_.set_message(absl::StrCat(verdict->reason,
                                          "; the re-run on the same state was healthy (a "
                                          "transient fault), and its update was applied"));
        anomaly_.set_documents_skipped(0);
        *verdict = rerun_verdict;
        verdict->rerun = RerunVerdict::kTransient;
        m = again;
        health = rerun_health;
      } else {
        verdict->rerun = RerunVerdict::kDeterministic;
        anomaly_.set_verdict(v1::GuardEvent::VERDICT_DETERMINISTIC);
        absl::StrAppend(&verdict->reason, "; the re-run on the same state was as bad");
      }
    }
  }
  guard_.Acted(verdict->action, health);

  if (verdict->action == GuardAction::kApply) {
    // Clip as torch.nn.utils.clip_grad_norm_ does, then update.
    ParamStore& trained = this->trained();
    const double max_norm = spec_.optimizer().max_grad_norm();
    if (max_norm > 0) {
      const double coef = std::min(1.0, max_norm / (m.grad_norm + 1e-6));
      if (coef < 1.0) {
        torch::NoGradGuard no_grad;
        for (const std::string& name : trained.TrainableNames()) {
          at::Tensor g = trained.get(name).grad();
          if (g.defined()) g.mul_(coef);
        }
      }
    }
    optimizer_.Step(trained, m.lr);
    injection_.PoisonWeights(m.step, trained);
  } else {
    m.skipped = true;
    m.skip_reason = verdict->reason;
    if (anomaly_.kind() != v1::GuardEvent::KIND_RECOVERED) anomaly_.set_message(verdict->reason);
  }
  ClearGradients();
  FinishRecord(start, communicated_before, &m);
  return m;
}

Trainer::StepNumbers Trainer::Compute(const std::vector<PackedBatch>& micro_batches, int64_t step,
                                      bool rerun) {
  // The step's token counts over all ranks, so that the loss scale is known
  // before the first backward. On a GPU the counts, the scale and the sums
  // below stay on the device until the one read at the end, so the host
  // queues the whole step without waiting for it.
  StepNumbers out;
  int64_t tokens = 0, supervised = 0;
  for (const PackedBatch& batch : micro_batches) {
    tokens += batch.input_ids.numel();
    supervised += objective_->Targets(batch);
  }
  at::Tensor counts = torch::empty({2}, torch::TensorOptions().dtype(torch::kLong).device(device_));
  counts[0].fill_(tokens);
  counts[1].fill_(supervised);
  collectives_->SumInPlace(counts);  // (tokens, supervised tokens) of the step
  if (counts.is_cpu() && counts[1].item<int64_t>() == 0) {
    // No loss to learn from: no forward, and a bad step for the guard. (On a
    // GPU the step runs and the same verdict comes at its end.)
    out.tokens = counts[0].item<int64_t>();
    return out;
  }

  // Forward and backward, each micro-batch's loss sum (fp32) scaled by the
  // step's global count, in fp32.
  const at::Tensor n = counts[1].clamp_min(1).to(torch::kFloat);
  const double injected = injection_.LossFactor(step, rerun);
  at::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (const PackedBatch& batch : micro_batches) {
    if (sharded_) sharded_->GatherRoots();
    kernels::LossSum ls = objective_->Loss(decoder_, batch, /*training=*/true);
    const at::Tensor sum = injected == 1 ? ls.sum : ls.sum * injected;
    (sum / n).backward();
    if (sharded_) sharded_->FinishBackward();
    loss_sum += sum.detach();
  }

  // Reduce: the loss sum and the gradient's per-tensor sums of squares over
  // ranks, in one call.
  ParamStore& trained = this->trained();
  std::vector<at::Tensor> grads;
  for (const std::string& name : trained.TrainableNames())
    grads.push_back(trained.get(name).grad());
  injection_.PoisonGradient(step, rerun, grads);
  kernels::GradNormResult gn = kernels::grad_norm(grads, /*locate_nonfinite=*/false);
  at::Tensor sums = torch::cat({loss_sum.reshape({1}), gn.sum_squares});  // fp64
  collectives_->SumInPlace(sums);                                         // (1 + tensors)
  // The step's one read from the device: the counts and the sums.
  const at::Tensor read = torch::cat({counts.to(torch::kDouble), sums}).cpu();
  const double* r = read.const_data_ptr<double>();
  out.tokens = static_cast<int64_t>(r[0]);
  out.supervised_tokens = static_cast<int64_t>(r[1]);
  out.loss_sum = r[2];
  out.sum_squares.assign(r + 3, r + 3 + grads.size());
  return out;
}

StepHealth Trainer::Measure(const StepNumbers& numbers, StepRecord* m, TensorNorms* norms) {
  m->tokens = numbers.tokens;
  m->supervised_tokens = numbers.supervised_tokens;
  StepHealth health;
  health.step = m->step;
  health.supervised_tokens = numbers.supervised_tokens;
  if (numbers.supervised_tokens == 0) {
    m->loss.reset();
    m->grad_norm = 0;
    return health;
  }
  m->loss = numbers.loss_sum / static_cast<double>(numbers.supervised_tokens);
  double sum_squares = 0;
  for (double s : numbers.sum_squares) sum_squares += s;
  // grad_norm is the fp32 global L2 norm.
  m->grad_norm = static_cast<float>(std::sqrt(sum_squares));
  health.loss = *m->loss;
  health.grad_norm = m->grad_norm;
  if (std::isfinite(m->grad_norm)) return health;
  // Only on an anomaly (the global grad_norm, which every rank sees, is not
  // finite): each tensor's global norm, the first tensor whose gradient went
  // non-finite, and the lowest rank whose own part of it did.
  int64_t first_rank = 0;
  if (sharded_) {
    auto [names, partial] = sharded_->GradSumSquaresByTensor();
    // A copy: on the CPU .cpu() is the same tensor, which the sum overwrites.
    const at::Tensor own = partial.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    collectives_->SumInPlace(partial);
    const at::Tensor global = partial.cpu();
    norms->names = std::move(names);
    norms->sum_squares.assign(global.const_data_ptr<double>(),
                              global.const_data_ptr<double>() + global.numel());
    const int64_t first = FirstNonFinite(norms->sum_squares);
    const int n_ranks = collectives_->world_size();
    const bool mine = first >= 0 && !std::isfinite(own.const_data_ptr<double>()[first]);
    first_rank = n_ranks - collectives_->Max(mine ? n_ranks - collectives_->rank() : 0);
  } else {
    norms->names = params_.TrainableNames();
    norms->sum_squares = numbers.sum_squares;
  }
  if (const int64_t first = FirstNonFinite(norms->sum_squares); first >= 0) {
    health.first_nonfinite = norms->names[first];
    health.nonfinite_rank = static_cast<int>(first_rank);
  }
  return health;
}

GuardVerdict Trainer::Judge(const StepHealth& health) {
  GuardVerdict verdict = guard_.Judge(health);
  if (verdict.action == GuardAction::kRollback && verdict.trigger == GuardTrigger::kSpike &&
      !verdict.budget_spent && !HasGoodStateBefore(verdict.episode_start)) {
    // Nothing to go back to yet: the spike is kept from the weights, and the
    // run goes on.
    verdict.action = GuardAction::kSkip;
    absl::StrAppend(&verdict.reason, "; no good state to roll back to yet, so it is skipped");
  }
  const auto agreed =
      static_cast<GuardAction>(collectives_->Max(static_cast<int64_t>(verdict.action)));
  if (agreed != verdict.action) {
    verdict.action = agreed;
    verdict.reason = "another rank's gradient or loss is not finite";
  }
  return verdict;
}

void Trainer::ClearGradients() {
  ParamStore& trained = this->trained();
  for (const std::string& name : trained.TrainableNames()) {
    at::Tensor p = trained.get(name);
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

void Trainer::DescribeAnomaly(const TensorNorms& norms, const StepHealth& health,
                              const GuardVerdict& verdict, int64_t first_document) {
  anomaly_.set_kind(v1::GuardEvent::KIND_SKIP);
  anomaly_.set_step(health.step);
  anomaly_.set_trigger(TriggerName(verdict.trigger));
  anomaly_.set_verdict(v1::GuardEvent::VERDICT_NOT_RERUN);
  anomaly_.set_rank(health.nonfinite_rank);
  anomaly_.set_module(health.first_nonfinite);
  if (health.supervised_tokens > 0) anomaly_.set_loss(health.loss);
  anomaly_.set_grad_norm(health.grad_norm);
  // The step's own documents: a skipped step's data is not retried.
  SetSkippedDocuments(first_document, batches_.rows_per_step(), &anomaly_);
  // Where it went wrong: the global norms of the non-finite tensors, then of
  // the largest finite ones (an exploding neighbour is often the cause).
  std::vector<size_t> order(norms.names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto key = [&](size_t i) {
    const double s = norms.sum_squares[i];
    return std::isfinite(s) ? s : std::numeric_limits<double>::infinity();
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  for (size_t k = 0; k < order.size() && k < 16; ++k) {
    v1::ModuleGradNorm* norm = anomaly_.add_module_grad_norms();
    norm->set_module(norms.names[order[k]]);
    norm->set_grad_norm(std::sqrt(norms.sum_squares[order[k]]));
  }
}

void Trainer::FinishRecord(std::chrono::steady_clock::time_point start, int64_t communicated_before,
                           StepRecord* m) const {
  m->step_time_s = SecondsSince(start);
  m->communicated_bytes = collectives_->communicated_bytes() - communicated_before;
  // On a GPU, the device memory the caching allocator has handed out at
  // most: what decides whether the job fits.
  m->peak_memory_bytes =
      device_.is_cuda()
          ? at::accelerator::getDeviceStats(device_.index())
                .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                .peak
          : PeakRssBytes();
}

// ---------------------------------------------------------------------------
// Checkpoints, snapshots, rollback, export and reports.

absl::StatusOr<std::optional<std::string>> Trainer::ResumeCheckpoint() const {
  // A rollback deletes the newer checkpoints, so that a later restart cannot
  // jump forward again.
  if (resume_at_or_before_) {
    return KeepCheckpointsAtOrBefore(checkpoints_dir_, *resume_at_or_before_);
  }
  return LatestCheckpoint(checkpoints_dir_);
}

absl::StatusOr<TrainPosition> Trainer::LoadState(const std::string& dir) {
  if (sharded_) return LoadShardedCheckpoint(dir, sharded_.get(), &optimizer_, collectives_);
  return LoadCheckpoint(dir, &params_, &optimizer_);
}

absl::Status Trainer::SaveCheckpointAt(const TrainPosition& pos, CheckpointHealth health) {
  absl::StatusOr<std::string> dir =
      sharded_ ? SaveShardedCheckpoint(checkpoints_dir_, pos, *sharded_, optimizer_, collectives_,
                                       health)
               : SaveCheckpoint(checkpoints_dir_, pos, params_, optimizer_, health);
  if (absl::IsFailedPrecondition(dir.status())) {
    // A non-finite value in the state: nothing was written, and the newest
    // good checkpoint stays the one to go back to.
    v1::GuardEvent refused;
    refused.set_kind(v1::GuardEvent::KIND_CHECKPOINT_REFUSED);
    refused.set_step(pos.step);
    refused.set_trigger(TriggerName(GuardTrigger::kNonFinite));
    refused.set_rank(-1);
    refused.set_message(std::string(dir.status().message()));
    ReportGuard(refused);
    return dir.status();
  }
  if (!dir.ok()) return dir.status();
  if (health == CheckpointHealth::kUnverified) unverified_checkpoints_.push_back(pos.step);
  if (!writes_shared_files()) return absl::OkStatus();
  v1::CheckpointSaved saved;
  saved.set_step(pos.step);
  saved.set_path(*dir);
  observer_->OnCheckpointSaved(saved);
  // Only while this run's commits are accepted: a superseded attempt keeps
  // its hands off the job's checkpoints.
  if (spec_.keep_checkpoints() > 0 && !observer_->StopRequested()) {
    return RotateCheckpoints(kept_checkpoints_dir_, spec_.keep_checkpoints());
  }
  return absl::OkStatus();
}

absl::Status Trainer::AfterAppliedStep(const TrainPosition& pos) {
  const int64_t good_after = spec_.guard().good_after_steps();
  const int64_t clean = guard_.clean_steps();
  snapshots_.MarkGood(pos.step, clean, good_after);
  for (auto it = unverified_checkpoints_.begin(); it != unverified_checkpoints_.end();) {
    const int64_t after = pos.step - *it;
    if (clean < after) {
      // A bad step came between: it can never be good.
      it = unverified_checkpoints_.erase(it);
    } else if (after >= good_after) {
      if (writes_shared_files()) {
        absl::Status s =
            MarkCheckpointGood(CheckpointFolderFor(kept_checkpoints_dir_, *it).final_dir);
        if (!s.ok()) return s;
      }
      it = unverified_checkpoints_.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t every = spec_.guard().snapshot_every();
  if (every > 0 && pos.step % every == 0) snapshots_.Take(pos, trained(), optimizer_, device_);
  return absl::OkStatus();
}

bool Trainer::HasGoodStateBefore(int64_t step) const {
  return snapshots_.NewestGoodBefore(step) != nullptr ||
         LatestCheckpoint(kept_checkpoints_dir_, step - 1).has_value();
}

absl::Status Trainer::Rollback(const GuardVerdict& verdict, int64_t step, TrainPosition* pos,
                               MetricsLog* metrics) {
  v1::GuardEvent event = anomaly_;  // the bad step's trigger, verdict, rank, module, documents
  event.set_step(step);
  if (verdict.budget_spent) return Diagnose(event, verdict.reason);
  // The newest good state from before the trouble began: a snapshot in
  // memory, or a checkpoint on disk when that is newer.
  const TrainSnapshot* snapshot = snapshots_.NewestGoodBefore(verdict.episode_start);
  const std::optional<std::string> checkpoint =
      LatestCheckpoint(kept_checkpoints_dir_, verdict.episode_start - 1);
  const int64_t checkpoint_step = checkpoint ? CheckpointStepOf(*checkpoint).value_or(-1) : -1;
  const int64_t skip_to = pos->data_cursor;
  if (snapshot != nullptr && snapshot->position.step >= checkpoint_step) {
    if (absl::Status s = SnapshotRing::Restore(*snapshot, &trained(), &optimizer_, device_);
        !s.ok()) {
      return s;
    }
    *pos = snapshot->position;
    event.set_restored_from("snapshot");
  } else if (checkpoint) {
    absl::StatusOr<TrainPosition> loaded = LoadState(*checkpoint);
    if (!loaded.ok()) return loaded.status();
    *pos = *loaded;
    event.set_restored_from(*checkpoint);
  } else {
    return Diagnose(event, absl::StrCat(verdict.reason,
                                        "; there is no good snapshot or checkpoint from before "
                                        "step ",
                                        verdict.episode_start, ", where the trouble began"));
  }
  // The weights, optimizer and RNG go back; the data does not: the documents
  // between that state and the bad step, which led there, are skipped (as
  // PaLM's and OPT's operators did by hand). The step counter and the LR
  // schedule go back with the weights.
  SetSkippedDocuments(pos->data_cursor, std::max<int64_t>(0, skip_to - pos->data_cursor), &event);
  pos->data_cursor = std::max(pos->data_cursor, skip_to);
  // What came after the state gone back to belongs to the abandoned run.
  snapshots_.DropAfter(pos->step);
  std::erase_if(unverified_checkpoints_, [&](int64_t s) { return s > pos->step; });
  if (writes_shared_files()) {
    absl::StatusOr<std::optional<std::string>> kept =
        KeepCheckpointsAtOrBefore(kept_checkpoints_dir_, pos->step);
    if (!kept.ok()) return kept.status();
  }
  if (metrics != nullptr) {
    if (absl::Status s = metrics->TruncateAfter(pos->step); !s.ok()) return s;
  }
  event.set_kind(v1::GuardEvent::KIND_ROLLBACK);
  event.set_to_step(pos->step);
  event.set_steps_lost(step - pos->step);
  event.set_message(absl::StrCat(
      verdict.reason, "; rolled back to step ", pos->step, " (", event.restored_from(),
      "), skipping the ", event.documents_skipped(), " documents read since it",
      spec_.guard().lr_cut() < 1
          ? absl::StrCat("; the LR is cut to ", spec_.guard().lr_cut(), " of the schedule's")
          : ""));
  ReportGuard(event);
  return absl::OkStatus();
}

void Trainer::SetSkippedDocuments(int64_t cursor, int64_t rows, v1::GuardEvent* event) {
  const std::vector<int64_t> lines = batches_.DocumentLines(cursor, rows);
  event->set_first_document(cursor);
  event->set_documents_skipped(static_cast<int64_t>(lines.size()));
  event->clear_document_ids();
  for (size_t i = 0; i < lines.size() && i < 64; ++i) event->add_document_ids(lines[i]);
}

void Trainer::Evaluate(int64_t step) {
  if (data_.eval == nullptr) return;
  // Every rank ranks every held-out group: a sharded model's layers are
  // gathered by all ranks together. Rank 0 reports.
  torch::NoGradGuard no_grad;
  RankingEvaluator evaluator;
  TokenizedDataset& eval = *data_.eval;
  const int64_t rows = eval.rows_per_epoch();
  const int64_t per_batch = spec_.data().micro_batch_size();
  for (int64_t row = 0; row < rows; row += per_batch) {
    PackedBatch batch = eval.Pack(row, std::min(per_batch, rows - row));
    const at::Tensor relevance = batch.relevance.clone();
    MoveToDevice(device_, &batch);
    if (sharded_) sharded_->GatherRoots();
    const std::optional<at::Tensor> scores = objective_->CandidateScores(decoder_, batch);
    if (sharded_) sharded_->ReleaseRoots();
    if (!scores) return;
    const at::Tensor host = scores->to(torch::kCPU, torch::kDouble).contiguous();
    const double* s = host.const_data_ptr<double>();
    const float* r = relevance.const_data_ptr<float>();
    const at::Tensor offsets = batch.group_offsets;
    const int64_t* o = offsets.const_data_ptr<int64_t>();
    for (int64_t g = 0; g + 1 < offsets.numel(); ++g) {
      evaluator.AddGroup(std::vector<double>(s + o[g], s + o[g + 1]),
                         std::vector<float>(r + o[g], r + o[g + 1]));
    }
  }
  const RankingMetrics m = evaluator.Metrics();
  Log("info", absl::StrFormat("eval step %d: MRR@10 %.4f, NDCG@10 %.4f over %d held-out groups",
                              step, m.mrr_at_10, m.ndcg_at_10, m.groups));
  if (collectives_->rank() != 0) return;
  v1::EvalReport report;
  report.set_step(step);
  report.set_groups(m.groups);
  report.set_mrr_at_10(m.mrr_at_10);
  report.set_ndcg_at_10(m.ndcg_at_10);
  observer_->OnEval(report);
}

void Trainer::ReportData(int64_t epoch) {
  if (collectives_->rank() != 0) return;
  v1::DataReport report = data_.report;
  report.set_epoch(epoch);
  observer_->OnData(report);
}

absl::Status Trainer::Diagnose(v1::GuardEvent event, const std::string& reason) {
  event.set_kind(v1::GuardEvent::KIND_DIAGNOSIS);
  std::string diagnosis = absl::StrCat("guard: step ", event.step(), ": ", reason);
  if (!event.module().empty()) {
    absl::StrAppend(&diagnosis, "; first non-finite gradient: ", event.module(), " on rank ",
                    event.rank());
  }
  switch (event.verdict()) {
    case v1::GuardEvent::VERDICT_DETERMINISTIC:
      absl::StrAppend(&diagnosis,
                      "; deterministic: a re-run on the same state and batch was as bad, so the "
                      "weights or the data cause it");
      break;
    case v1::GuardEvent::VERDICT_TRANSIENT:
      absl::StrAppend(&diagnosis, "; transient: a re-run was healthy");
      break;
    default:
      break;
  }
  if (event.document_ids_size() > 0) {
    absl::StrAppend(&diagnosis, "; the step's documents (lines of ", spec_.data().path(),
                    ", from 0): ", absl::StrJoin(event.document_ids(), ","));
  }
  event.set_message(diagnosis);
  ReportGuard(event);
  return absl::FailedPreconditionError(diagnosis);
}

absl::Status Trainer::Export() {
  // A sharded model is gathered one bucket at a time, on every rank; rank 0
  // writes. The whole model exists once, in fp32, on each rank meanwhile.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  if (sharded_) {
    tensors = sharded_->GatherFullTensors(/*trainable_only=*/lora_.has_value());
  } else {
    for (const std::string& name : params_.names()) tensors.emplace_back(name, params_.get(name));
  }
  if (!writes_shared_files()) return absl::OkStatus();
  absl::Status s;
  fs::path dir;
  if (lora_) {
    dir = fs::path(out_dir_) / "adapter";
    ParamStore adapters;
    if (sharded_) {
      for (auto& [name, t] : tensors) adapters.Add(name, t, ParamStore::kNoLayer, true);
    }
    s = SavePeftAdapter(dir.string(), spec_.model().path(), *lora_, sharded_ ? adapters : params_);
  } else {
    dir = fs::path(out_dir_) / "model";
    s = ExportHfModel(spec_.model().path(), dir.string(), tensors);
  }
  if (s.ok()) Log("info", absl::StrCat("exported ", dir.string()));
  return s;
}

// One step's metrics to the observer; a skipped or recovered step is also a
// guard event.
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
  out.set_peak_memory_bytes(m.peak_memory_bytes);
  out.set_communicated_bytes(m.communicated_bytes);
  observer_->OnStep(out);
  // A rollback reports itself (Rollback).
  if (verdict.action == GuardAction::kSkip || verdict.rerun == RerunVerdict::kTransient) {
    ReportGuard(anomaly_);
  }
}

// The event to the job's stream (where `ballast watch` prints it), and a line
// to the rank's log (stderr) for a standalone run.
void Trainer::ReportGuard(const v1::GuardEvent& event) {
  observer_->OnGuard(event);
  std::string kind = v1::GuardEvent::Kind_Name(event.kind());
  kind = absl::AsciiStrToLower(absl::StripPrefix(kind, "KIND_"));
  std::cerr << "ballast-train: guard " << kind << " at step " << event.step() << ": "
            << event.message() << std::endl;
}

// A line for the rank log (stderr) and the job's event stream.
void Trainer::Log(const std::string& level, const std::string& text) {
  std::cerr << "ballast-train: " << text << std::endl;
  observer_->OnLog(level, text);
}

}  // namespace ballast::train
