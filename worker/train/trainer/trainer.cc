#include "worker/train/trainer/trainer.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/record_function.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_config.h"
#include "common/spec_rules.h"
#include "kernels/grad_norm.h"
#include "worker/train/checkpoint/export.h"
#include "worker/train/collectives/step_phase.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/model/rng_state.h"
#include "worker/train/optim/lr_schedule.h"
#include "worker/train/trainer/held_out.h"
#include "worker/train/trainer/op_profile.h"
#include "worker/train/trainer/torch_status.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "model.visual.* (12), mtp.* (30)": names grouped by their first component
// (the first two under "model."), in order of first appearance.
std::string TensorGroups(const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, int64_t>> groups;
  for (const std::string& name : names) {
    size_t end = name.find('.');
    if (name.rfind("model.", 0) == 0) end = name.find('.', end + 1);
    const std::string group = name.substr(0, end) + ".*";
    if (groups.empty() || groups.back().first != group) {
      groups.emplace_back(group, 0);
    }
    ++groups.back().second;
  }
  std::string text;
  for (const auto& [group, count] : groups) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", group, " (", count, ")");
  }
  return text;
}

// The decoder indices of the model's sparse layers.
std::vector<int64_t> SparseLayersOf(const ModelConfig& config) {
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (config.moe.sparse(i)) layers.push_back(i);
  }
  return layers;
}

// moe.aux_free_rate, or its default.
double AuxFreeRate(const v1::MoeSpec& moe) {
  return moe.has_aux_free_rate() ? moe.aux_free_rate() : kDefaultAuxFreeRate;
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
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
    if (spec.moe().has_router_aux_loss_coef()) {
      config->moe.router_aux_loss_coef = spec.moe().router_aux_loss_coef();
    } else if (spec.moe().balance() == "aux_free") {
      // DeepSeek-V3 balances by the bias alone (its sequence-wise loss has
      // a coefficient of 1e-4): config.json's coefficient is the aux-loss
      // mode's. One set in the spec adds the aux loss as that complement.
      config->moe.router_aux_loss_coef = 0;
    }
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

    std::optional<LoraConfig> lora;
    if (spec.method() != "full") lora = LoraConfigFromSpec(spec.lora());
    absl::StatusOr<std::unique_ptr<TrainedState>> state =
        LoadTrainedState(spec, *config, lora, options.collectives, options.device);
    if (!state.ok()) return state.status();
    std::unique_ptr<RoutingBias> routing_bias;
    bool bias_from_model = false;
    if (config->has_experts() && spec.moe().balance() == "aux_free") {
      routing_bias = std::make_unique<RoutingBias>(SparseLayersOf(*config), config->moe.num_experts,
                                                   AuxFreeRate(spec.moe()), options.device);
      absl::StatusOr<bool> started = routing_bias->StartFrom(spec.model().path(), *config);
      if (!started.ok()) return started.status();
      bias_from_model = *started;
    }
    return std::unique_ptr<Trainer>(new Trainer(
        spec, out_dir, options, *std::move(config), *std::move(state), std::move(lora),
        *std::move(data), *std::move(objective), std::move(routing_bias), bias_from_model));
  });
}

Trainer::Trainer(v1::JobSpec spec, std::string out_dir, TrainerOptions options, ModelConfig config,
                 std::unique_ptr<TrainedState> state, std::optional<LoraConfig> lora,
                 TrainingData data, std::unique_ptr<Objective> objective,
                 std::unique_ptr<RoutingBias> routing_bias, bool bias_from_model)
    : spec_(std::move(spec)),
      out_dir_(std::move(out_dir)),
      device_(options.device),
      collectives_(options.collectives != nullptr ? options.collectives : &single_rank_),
      reports_(options.observer, collectives_->rank(), spec_.data().path()),
      config_(std::move(config)),
      state_(std::move(state)),
      lora_(std::move(lora)),
      data_(std::move(data)),
      batches_(data_.dataset.get(),
               StepBatchesOptions{spec_.data().micro_batch_size(), spec_.data().grad_accum_steps(),
                                  collectives_->rank(), collectives_->world_size(), device_}),
      decoder_(config_, &state_->weights(), lora_,
               spec_.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat,
               spec_.gradient_checkpointing()),
      objective_(std::move(objective)),
      optimizer_(AdamWConfig{spec_.optimizer().beta1(), spec_.optimizer().beta2(),
                             spec_.optimizer().eps(), spec_.optimizer().weight_decay()},
                 state_->trained()),
      global_balancing_(spec_.moe().aux_loss().empty() ? SpecDefaultText("moe.aux_loss") == "global"
                                                       : spec_.moe().aux_loss() == "global"),
      aux_loss_scope_(spec_.moe().aux_loss_scope() == "per_layer" ? AuxLossScope::kPerLayer
                                                                  : AuxLossScope::kAllLayers),
      routing_bias_(std::move(routing_bias)),
      guard_(GuardOptionsFromSpec(spec_.guard())),
      injection_(spec_.guard().inject(), collectives_->rank()),
      delays_(options.delays),
      // (A spec built without ApplyDefaults has the watchdog's zeros.)
      stragglers_(spec_.watchdog().straggler_factor() > 1
                      ? spec_.watchdog().straggler_factor()
                      : SpecDefaultNumber("watchdog.straggler_factor"),
                  spec_.watchdog().straggler_window() >= 1
                      ? spec_.watchdog().straggler_window()
                      : static_cast<int32_t>(SpecDefaultNumber("watchdog.straggler_window"))),
      recovery_(spec_,
                {.checkpoints_dir = (fs::path(out_dir_) / "checkpoints").string(),
                 .kept_checkpoints_dir = options.kept_checkpoints_dir,
                 .resume_at_or_before = options.resume_at_or_before,
                 .device = device_},
                state_.get(), &optimizer_, collectives_, routing_bias_.get()),
      early_stopping_([&]() -> std::optional<EarlyStopping> {
        std::optional<EarlyStoppingRule> rule = EarlyStoppingRule::FromSpec(spec_);
        if (!rule) return std::nullopt;
        return EarlyStopping(*std::move(rule));
      }()) {
  decoder_.set_layer_runner(state_->layer_runner());
  decoder_.set_expert_group(state_->expert_group());
  decoder_.set_routing_bias(routing_bias_.get());
  // AdamW keeps two fp32 moments per trainable element.
  const ResidentBytes bytes = state_->resident_bytes();
  // With hybrid sharding, where this rank sits in the mesh of replicas.
  std::string mesh;
  if (Collectives* replicas = collectives_->replica_group(); replicas != nullptr) {
    const Collectives& shards = collectives_->shard_group();
    mesh = absl::StrCat("as rank ", shards.rank(), " of shard group ", replicas->rank(), " (",
                        replicas->world_size(), " replicas of ", shards.world_size(), " ranks) ");
  }
  reports_.Log("info", absl::StrCat("rank ", collectives_->rank(), " of ",
                                    collectives_->world_size(), " on ", device_.str(), " (",
                                    spec_.precision(), ") ", mesh, "holds ", bytes.parameters,
                                    " parameter bytes, ", bytes.gradients, " gradient bytes, ",
                                    2 * bytes.gradients, " optimizer bytes, and gathers up to ",
                                    bytes.gathered, " bytes of whole units"));
  if (config_.has_experts()) {
    reports_.Log(
        "info",
        absl::StrCat(
            "load balancing: ",
            routing_bias_
                ? absl::StrCat("aux_free (a per-expert routing bias, rate ",
                               AuxFreeRate(spec_.moe()), ", updated after each applied step, from ",
                               bias_from_model ? "the model folder's biases" : "zero", "); ")
                : "aux_loss; ",
            global_balancing_ ? "global" : "micro_batch", " aux loss, ",
            aux_loss_scope_ == AuxLossScope::kPerLayer ? "per layer" : "all layers",
            ", coefficient ", config_.moe.router_aux_loss_coef,
            routing_bias_ && config_.moe.router_aux_loss_coef == 0
                ? " (measured and reported, not trained on)"
                : "",
            spec_.task() == "block_diffusion"
                ? "; it counts the noisy half x_t of each document only, as SDAR "
                  "routes and trains it"
                : "",
            global_balancing_ && config_.moe.router_aux_loss_coef > 0 &&
                    spec_.data().grad_accum_steps() > collectives_->world_size()
                ? (lora_ && lora_->lora_dropout > 0
                       ? "; each step runs a routing pre-pass (a forward without autograd "
                         "of each micro-batch in turn, as LoRA dropout draws its masks)"
                       : "; each step runs a routing pre-pass (the micro-batches through "
                         "the sparse layers without autograd, layer by layer)")
                : ""));
    if (const Collectives* experts = state_->expert_group()) {
      const int64_t n = experts->world_size();
      reports_.Log("info", absl::StrCat("experts: ", config_.moe.num_experts / n, " of ",
                                        config_.moe.num_experts, " per rank over ", n,
                                        " ranks (moe.expert_parallel); this rank's are ",
                                        experts->rank() * config_.moe.num_experts / n, "..",
                                        (experts->rank() + 1) * config_.moe.num_experts / n - 1));
    }
  }
  // A vision-language checkpoint (Qwen3.5) holds more than the text decoder
  // this job trains: say what happens to the rest.
  const std::vector<std::string> outside = TensorsOutsideDecoder(spec_.model().path(), config_);
  if (!outside.empty()) {
    reports_.Log("info",
                 absl::StrCat("the checkpoint's ", outside.size(),
                              " tensors outside the text "
                              "decoder (",
                              TensorGroups(outside), ") are not trained; ",
                              lora_ ? "the adapter leaves them out (the base model keeps them)"
                                    : "the exported model keeps them byte for byte"));
  }
}

Trainer::~Trainer() = default;

// ---------------------------------------------------------------------------
// The run: resume, steps, checkpoints, export.

absl::Status Trainer::Run() {
  return CatchTorch([&] { return RunSteps(); });
}

absl::Status Trainer::RunSteps() {
  absl::StatusOr<Recovery::Start> start = recovery_.Resume();
  if (!start.ok()) return start.status();
  TrainPosition pos = start->position;
  std::string injected = injection_.Describe();
  if (const std::string delays = delays_.Describe(); !delays.empty()) {
    absl::StrAppend(&injected, injected.empty() ? "" : "; ", delays);
  }
  reports_.RunStarts(spec_, pos.step, start->checkpoint, injected, data_.report);
  if (absl::Status s = reports_.OpenMetrics(out_dir_, spec_, pos.step); !s.ok()) return s;

  // The baseline the evaluations move from.
  if (pos.step == 0) {
    bool checkpointed = false;
    if (absl::Status s = EvaluateAndJudge(&pos, &checkpointed); !s.ok()) return s;
  }
  // Whether early stopping ended training before max_steps; a run resumed
  // from the checkpoint of the evaluation that decided it ends at once.
  const auto stopped_early = [&] {
    return early_stopping_ && pos.step < spec_.max_steps() && early_stopping_->ShouldStop(pos.eval);
  };
  int64_t reported_epoch = -1;
  while (pos.step < spec_.max_steps() && !stopped_early()) {
    if (const int64_t epoch = pos.data_cursor / data_.dataset->rows_per_epoch();
        epoch != reported_epoch) {
      reports_.Data(data_.report, epoch);
      reported_epoch = epoch;
    }
    GuardVerdict verdict;
    const v1::StepMetrics metrics = Step(&pos, &verdict);
    // The rank's own time in the step: its compute, without what it waited
    // for its peers (and without rank 0's reports, which are not the step).
    const double own_s = metrics.step_time_s() - metrics.collective_wait_s();
    // Here, before Checkpoint and before Export's write: a rank stopped past
    // the collective timeout, whose peers gave up on it, writes nothing.
    collectives_->FenceIfStalled();
    if (absl::Status s = reports_.Step(metrics, verdict, anomaly_); !s.ok()) return s;
    if (verdict.action == GuardAction::kRollback) {
      if (absl::Status s = Rollback(verdict, metrics.step(), &pos); !s.ok()) return s;
      continue;
    }
    // Whether checkpoint pos.step is written already (the best evaluation's).
    bool checkpointed = false;
    if (verdict.action == GuardAction::kApply) {
      // Before the snapshot AfterAppliedStep may take: it holds the
      // evaluation's progress, as the checkpoint of this step does.
      if (EvalEvery() > 0 && pos.step % EvalEvery() == 0) {
        if (absl::Status s = EvaluateAndJudge(&pos, &checkpointed); !s.ok()) return s;
      }
      if (absl::Status s = recovery_.AfterAppliedStep(pos, guard_.clean_steps()); !s.ok()) {
        return s;
      }
    }
    // Agreed: a SIGTERM or a cancel reaches the ranks at different moments,
    // and a rank that stopped alone would leave the others in the next
    // step's collectives, failing them with "lost rank".
    if (AgreeAfterStep(pos.step, own_s)) {
      reports_.Log("info", absl::StrCat("cancelled after step ", pos.step));
      return absl::CancelledError(absl::StrCat("cancelled after step ", pos.step));
    }
    if (!checkpointed && recovery_.CheckpointDue(pos)) {
      // A refusal (a non-finite state) was reported; the run goes on, and
      // the guard meets the same values in the next step.
      absl::Status s = Checkpoint(pos, /*last=*/false);
      if (!s.ok() && !absl::IsFailedPrecondition(s)) return s;
    }
  }
  const std::string stop_reason =
      stopped_early() ? early_stopping_->StopReason(pos.eval, pos.step) : std::string();
  // Applied steps over the job, not this attempt: the optimizer's step
  // counter counts the updates of the run that counts, goes into every
  // checkpoint and snapshot and back with a rollback, so a job is judged
  // alike however often it restarted (one that resumes at step 95 of 100 and
  // meets 5 bad steps is judged by its 95 applied ones). Every rank holds the
  // same counter, since the ranks agree on each step's action, so every rank
  // fails alike here, with no collective to wait in.
  // A run stopped early is judged by the steps it went to.
  if (std::string why = guard_.TooFewApplied(optimizer_.steps(), pos.step); !why.empty()) {
    if (const int64_t bad = data_.report.skipped_records(); bad > 0) {
      absl::StrAppend(&why, "; the data lost ", bad, " of its ", data_.report.records(),
                      " records as bad (data.on_bad_record: skip)");
    }
    return FailRun(guard_.MostSkippedBy(), pos.step, why);
  }
  if (stop_reason.empty()) {
    if (EvalEvery() == 0 || pos.step % EvalEvery() != 0) {
      bool checkpointed = false;  // never at the last step
      if (absl::Status s = EvaluateAndJudge(&pos, &checkpointed); !s.ok()) return s;
    }
    // The run is over and its last step was applied: nothing follows to
    // judge this checkpoint by, and the export holds the same state. (A run
    // stopped early exports the best evaluation's checkpoint, written when
    // it was evaluated.)
    if (absl::Status s = Checkpoint(pos, /*last=*/true); !s.ok()) {
      if (!absl::IsFailedPrecondition(s)) return s;
      return FailRun(GuardTrigger::kNonFinite, pos.step, std::string(s.message()));
    }
  }
  v1::TrainingEnd end;
  end.set_step(pos.step);
  end.set_stop_reason(stop_reason);
  end.set_exported_step(pos.step);
  end.set_export_reason("the last step");
  if (early_stopping_ && pos.eval.best_step >= 0) {
    end.set_exported_step(pos.eval.best_step);
    end.set_export_reason(early_stopping_->BestReason(pos.eval));
    // The weights of the best evaluation, unless they are the ones in hand.
    if (pos.eval.best_step != pos.step) {
      if (absl::Status s = recovery_.Restore(pos.eval.best_step); !s.ok()) return s;
    }
  } else if (early_stopping_) {
    end.set_export_reason(absl::StrCat("the last step (no evaluation of ",
                                       early_stopping_->rule().metric,
                                       " after the first step could be the best)"));
  }
  reports_.End(end);
  return Export();
}

absl::Status Trainer::FailRun(GuardTrigger trigger, int64_t step, const std::string& reason) {
  anomaly_ = v1::GuardEvent();
  anomaly_.set_step(step);
  anomaly_.set_trigger(TriggerName(trigger));
  anomaly_.set_rank(-1);
  return reports_.Diagnose(anomaly_,
                           absl::StrCat(reason, "; the trained weights are not exported"));
}

// ---------------------------------------------------------------------------
// The step.

v1::StepMetrics Trainer::Step(TrainPosition* pos, GuardVerdict* verdict) {
  RECORD_USER_SCOPE(kStepScope);  // for --profile (op_profile.h); free without it
  const StepStart start = MarkStepStart();
  v1::StepMetrics m;
  m.set_step(pos->step + 1);
  m.set_max_steps(spec_.max_steps());
  m.set_lr(ScheduledLearningRate(spec_.schedule().kind(), spec_.optimizer().lr(), pos->step,
                                 spec_.schedule().warmup_steps(), spec_.max_steps()) *
           guard_.LrScale());
  *verdict = GuardVerdict{};
  anomaly_ = v1::GuardEvent();

  // Batch: this rank's micro-batches of the step, packed during the last one.
  StepPhase::OfThisRank().BeginStep(m.step());
  delays_.InStep(m.step());
  std::vector<PackedBatch> micro_batches = batches_.Take(pos->data_cursor);
  const int64_t first_document = pos->data_cursor;
  pos->data_cursor += batches_.rows_per_step();
  pos->step += 1;
  injection_.BeginStep(m.step());
  injection_.MaskTargets(m.step(), &micro_batches);
  // What a re-run starts from besides the weights, which only an applied
  // update changes: the generators (dropout) as the step found them.
  const bool rerun_allowed = spec_.guard().rerun_bad_step();
  std::map<std::string, at::Tensor> generators;
  if (rerun_allowed) generators = GeneratorStates(device_);

  StepNumbers numbers = Compute(micro_batches, m.step(), /*rerun=*/false);
  TensorNorms norms;
  StepHealth health = Measure(numbers, &m, &norms);
  // Guard: a step the ranks do not all find healthy never reaches the weights.
  *verdict = Judge(health);
  if (verdict->action != GuardAction::kApply) {
    anomaly_ = DescribeAnomaly(norms, health, *verdict);
    // The step's own documents: a skipped step's data is not retried.
    SetSkippedDocuments(first_document,
                        batches_.DocumentLines(first_document, batches_.rows_per_step()),
                        &anomaly_);
    const bool one_step_fault =
        verdict->trigger == GuardTrigger::kNonFinite || verdict->trigger == GuardTrigger::kSpike;
    if (rerun_allowed && one_step_fault) {
      // Before anything changes: the same weights, generators and batch
      // again. Healthy now means the fault was not in the numbers.
      ClearGradients();
      SetGeneratorStates(generators, device_);
      v1::StepMetrics again = m;
      StepNumbers rerun_numbers = Compute(micro_batches, m.step(), /*rerun=*/true);
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
        numbers = std::move(rerun_numbers);
      } else {
        verdict->rerun = RerunVerdict::kDeterministic;
        anomaly_.set_verdict(v1::GuardEvent::VERDICT_DETERMINISTIC);
        absl::StrAppend(&verdict->reason, "; the re-run on the same state was as bad");
      }
    }
  }
  guard_.Acted(*verdict, health);

  if (verdict->action == GuardAction::kApply) {
    // Clip as torch.nn.utils.clip_grad_norm_ does, then update.
    ParamStore& trained = state_->trained();
    const double max_norm = spec_.optimizer().max_grad_norm();
    if (max_norm > 0) {
      const double coef = std::min(1.0, max_norm / (m.grad_norm() + 1e-6));
      if (coef < 1.0) {
        torch::NoGradGuard no_grad;
        for (const std::string& name : trained.TrainableNames()) {
          at::Tensor g = trained.get(name).grad();
          if (g.defined()) g.mul_(coef);
        }
      }
    }
    StepPhase::OfThisRank().Enter(StepPhase::Kind::kOptimizer);
    optimizer_.Step(trained, m.lr());
    // With the weights: only an applied step moves the bias.
    if (routing_bias_ && numbers.routing) routing_bias_->Update(*numbers.routing);
    injection_.PoisonWeights(m.step(), trained);
  } else {
    m.set_skipped(true);
    if (anomaly_.kind() != v1::GuardEvent::KIND_RECOVERED) anomaly_.set_message(verdict->reason);
  }
  ClearGradients();
  FinishMetrics(start, &m);
  return m;
}

std::vector<int64_t> Trainer::SparseLayers() const { return SparseLayersOf(config_); }

std::shared_ptr<RoutingStats> Trainer::NewRoutingStats(const PackedBatch& batch,
                                                       double weight) const {
  auto stats = std::make_shared<RoutingStats>(config_.num_hidden_layers, config_.moe.num_experts,
                                              config_.moe.top_k, weight);
  stats->set_scope(aux_loss_scope_);
  if (const at::Tensor counted = objective_->BalancedTokens(batch); counted.defined()) {
    stats->set_counted(counted.to(device_), counted.sum().item<int64_t>());
  }
  return stats;
}

StepRouting Trainer::RoutingPrePass(const std::vector<PackedBatch>& micro_batches) {
  // From the generator state the training forwards start from, so that
  // dropout draws the same masks and the routing is theirs.
  const std::map<std::string, at::Tensor> generators = GeneratorStates(device_);
  std::vector<const PackedBatch*> batches;
  std::vector<std::shared_ptr<RoutingStats>> stats;
  for (const PackedBatch& batch : micro_batches) {
    batches.push_back(&batch);
    stats.push_back(NewRoutingStats(batch, /*weight=*/0));
  }
  // Without dropout a layer's routing depends on the layers before it alone:
  // every micro-batch goes through a layer before the next one, which a
  // sharded model then gathers once for them all rather than once each, and
  // the pass ends at the last sparse layer. With dropout, a micro-batch's
  // masks start where the previous one's whole forward left the generator,
  // so each goes through every layer in turn, as the training forwards will.
  const std::vector<int64_t> sparse = SparseLayers();
  if (lora_ && lora_->lora_dropout > 0) {
    for (size_t i = 0; i < batches.size(); ++i) {
      state_->BeginForward();
      decoder_.Route({batches[i]}, {stats[i]}, config_.num_hidden_layers - 1, /*training=*/true);
      state_->EndForward();
    }
  } else {
    state_->BeginForward();
    decoder_.Route(batches, stats, sparse.back(), /*training=*/true);
    state_->EndForward();
  }
  SetGeneratorStates(generators, device_);
  StepRouting counts(sparse, config_.moe.num_experts, config_.moe.top_k);
  for (const std::shared_ptr<RoutingStats>& s : stats) s->AddTo(&counts);
  at::Tensor flat = counts.Flat().to(device_);
  collectives_->SumInPlace(flat);
  counts.SetFlat(flat);
  return counts;
}

void Trainer::CheckPrePass(const StepRouting& pre_pass, const StepRouting& forwards, int64_t step) {
  // The aux loss's gradient used the pre-pass's f, which is the step's only
  // if the pre-pass routed every token as the training forwards then did.
  // Said once a run: on a GPU a near tie may go the other way in a kernel
  // that does not sum in one order, and then every step may say it.
  if (pre_pass_differed_ || collectives_->rank() != 0) return;
  const std::vector<int64_t> layers = forwards.LayersRoutedOtherwise(pre_pass);
  if (layers.empty()) return;
  pre_pass_differed_ = true;
  reports_.Log("warning",
               absl::StrCat("step ", step,
                            ": the routing pre-pass chose other experts than the "
                            "step's forwards in layers ",
                            absl::StrJoin(layers, ", "),
                            "; the load-balancing loss's gradient used the pre-pass's counts "
                            "(said once a run)"));
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
  at::Tensor aux_loss_sum = torch::zeros_like(loss_sum);
  // A mixture of experts' routing over the step (model/step_routing.h). With
  // global balancing (moe.aux_loss global) every forward's aux-loss gradient
  // needs f of the whole step before its backward: a rank with more than one
  // micro-batch counts it in a routing pre-pass (docs/moe-balancing.md), a
  // rank with one between its forward and its backward.
  // Without a coefficient (aux_free's default) the aux loss has no gradient
  // and needs no f before the backward: the step's counts come with the sums.
  std::optional<StepRouting> routing;
  std::optional<StepRouting> step_counts;
  const bool aux_gradient = global_balancing_ && config_.moe.router_aux_loss_coef > 0;
  if (config_.has_experts()) {
    routing.emplace(SparseLayers(), config_.moe.num_experts, config_.moe.top_k);
    if (aux_gradient && micro_batches.size() > 1) step_counts = RoutingPrePass(micro_batches);
  }
  for (const PackedBatch& batch : micro_batches) {
    state_->BeginForward();
    std::shared_ptr<RoutingStats> stats;
    if (routing) {
      // Global: the step's one loss, coef * aux. micro_batch: as transformers
      // per forward, averaged over the step's micro-batches (grad_accum_steps
      // of them over all ranks, so the mean does not depend on the world size).
      const double coef = config_.moe.router_aux_loss_coef;
      stats = NewRoutingStats(
          batch,
          global_balancing_ ? coef : coef / static_cast<double>(spec_.data().grad_accum_steps()));
      if (step_counts) stats->UseStepCounts(*step_counts);
      decoder_.set_routing(stats);
    }
    StepPhase::OfThisRank().Enter(StepPhase::Kind::kForward);
    kernels::LossSum ls = objective_->Loss(decoder_, batch, /*training=*/true);
    if (routing && aux_gradient && !step_counts) {
      StepRouting own(SparseLayers(), config_.moe.num_experts, config_.moe.top_k);
      stats->AddTo(&own);
      at::Tensor flat = own.Flat().to(device_);
      collectives_->SumInPlace(flat);
      own.SetFlat(flat);
      stats->UseStepCounts(own);
    }
    const at::Tensor sum = injected == 1 ? ls.sum : ls.sum * injected;
    StepPhase::OfThisRank().Enter(StepPhase::Kind::kBackward);
    (sum / n).backward();
    state_->FinishBackward();
    loss_sum += sum.detach();
    if (stats) {
      stats->AddTo(&*routing);
      if (!global_balancing_) aux_loss_sum += stats->AuxLoss().to(aux_loss_sum.device());
    }
    decoder_.set_routing(nullptr);
  }

  // Reduce: with hybrid sharding the gradients across the replicas first;
  // then the loss sum and the gradient's per-tensor sums of squares over
  // ranks, in one call (a replica's copies of the first's gradients add 0).
  state_->FinishGradients();
  ParamStore& trained = state_->trained();
  std::vector<at::Tensor> grads;
  for (const std::string& name : trained.TrainableNames())
    grads.push_back(trained.get(name).grad());
  injection_.PoisonGradient(step, rerun, grads);
  kernels::GradNormResult gn = kernels::grad_norm(grads, /*locate_nonfinite=*/false);
  if (state_->grad_norm_share() != 1) gn.sum_squares.mul_(state_->grad_norm_share());
  at::Tensor sums =
      torch::cat({loss_sum.reshape({1}), aux_loss_sum.reshape({1}),
                  routing ? routing->Flat().to(device_) : torch::empty({0}, loss_sum.options()),
                  gn.sum_squares});  // fp64
  collectives_->SumInPlace(sums);    // (2 + routing + tensors)
  // The step's one read from the device: the counts and the sums.
  const at::Tensor read = torch::cat({counts.to(torch::kDouble), sums}).cpu();
  const double* r = read.const_data_ptr<double>();
  out.tokens = static_cast<int64_t>(r[0]);
  out.supervised_tokens = static_cast<int64_t>(r[1]);
  out.loss_sum = r[2];
  out.aux_loss_sum = r[3];
  int64_t next = 4;
  if (routing) {
    const int64_t width = routing->Flat().numel();
    routing->SetFlat(read.narrow(0, next, width));
    next += width;
    if (step_counts) CheckPrePass(*step_counts, *routing, step);
    // The step's aux loss: the global one of the reduced totals, or the mean
    // of the micro-batches' own.
    const double aux =
        global_balancing_ ? routing->AuxLoss(aux_loss_scope_)
                          : out.aux_loss_sum / static_cast<double>(spec_.data().grad_accum_steps());
    out.moe = SummarizeStepRouting(routing->Layers(), config_.moe.top_k, aux);
    out.routing = std::move(routing);
  }
  out.sum_squares.assign(r + next, r + next + grads.size());
  return out;
}

StepHealth Trainer::Measure(const StepNumbers& numbers, v1::StepMetrics* m, TensorNorms* norms) {
  m->set_tokens(numbers.tokens);
  m->set_supervised_tokens(numbers.supervised_tokens);
  StepHealth health;
  health.step = m->step();
  health.supervised_tokens = numbers.supervised_tokens;
  if (numbers.supervised_tokens == 0) {
    m->clear_loss();
    m->set_grad_norm(0);
    return health;
  }
  m->set_loss(numbers.loss_sum / static_cast<double>(numbers.supervised_tokens));
  if (numbers.moe) {
    // transformers' loss: the task's plus coef * aux.
    m->set_aux_loss(numbers.moe->aux_loss);
    m->set_loss(m->loss() + config_.moe.router_aux_loss_coef * m->aux_loss());
    v1::MoeStepMetrics* moe = m->mutable_moe();
    moe->set_expert_load_max_ratio(MaxLoadRatio(*numbers.moe));
    for (const MoeLayerStats& layer : numbers.moe->layers) {
      v1::MoeLayerMetrics* l = moe->add_layers();
      l->set_layer(static_cast<int32_t>(layer.layer));
      l->set_expert_load_max_ratio(layer.max_load_ratio);
      l->set_idle_expert_fraction(layer.idle_expert_fraction);
      l->set_router_entropy(layer.router_entropy);
      l->set_top_k_share(layer.top_k_share);
    }
    health.moe = numbers.moe;
  }
  double sum_squares = 0;
  for (double s : numbers.sum_squares) sum_squares += s;
  // grad_norm is the fp32 global L2 norm.
  m->set_grad_norm(static_cast<float>(std::sqrt(sum_squares)));
  health.loss = m->loss();
  health.grad_norm = m->grad_norm();
  if (std::isfinite(m->grad_norm())) return health;
  // Only on an anomaly (the global grad_norm, which every rank sees, is not
  // finite): each tensor's global norm, the first tensor whose gradient went
  // non-finite, and the lowest rank whose own part of it did.
  *norms = state_->GradNormsByTensor(numbers.sum_squares);
  if (norms->first_nonfinite >= 0) {
    health.first_nonfinite = norms->names[norms->first_nonfinite];
    health.nonfinite_rank = norms->first_nonfinite_rank;
  }
  return health;
}

GuardVerdict Trainer::Judge(const StepHealth& health) {
  GuardVerdict verdict = guard_.Judge(health);
  if (verdict.action == GuardAction::kRollback && verdict.trigger == GuardTrigger::kSpike &&
      !verdict.budget_spent && !recovery_.HasGoodStateBefore(verdict.episode_start)) {
    // Nothing to go back to yet: the spike is kept from the weights, and the
    // run goes on.
    verdict.action = GuardAction::kSkip;
    absl::StrAppend(&verdict.reason, "; no good state to roll back to yet, so it is skipped");
  }
  const auto agreed =
      static_cast<GuardAction>(collectives_->Max(static_cast<int64_t>(verdict.action)));
  if (agreed != verdict.action) {
    verdict.action = agreed;
    verdict.trigger = GuardTrigger::kNonFinite;
    verdict.reason = "another rank's gradient or loss is not finite";
  }
  return verdict;
}

void Trainer::ClearGradients() {
  ParamStore& trained = state_->trained();
  for (const std::string& name : trained.TrainableNames()) {
    at::Tensor p = trained.get(name);
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

bool Trainer::AgreeAfterStep(int64_t step, double own_s) {
  const int world = collectives_->world_size();
  std::vector<double> values(1 + world, 0.0);
  values[0] = reports_.StopRequested() ? 1 : 0;
  values[1 + collectives_->rank()] = own_s;
  at::Tensor agreed = torch::tensor(values, torch::kDouble).to(device_);
  collectives_->SumInPlace(agreed);
  agreed = agreed.cpu();
  const double* a = agreed.const_data_ptr<double>();
  if (reports_.writes_shared_files()) {
    for (const v1::StragglerReport& report :
         stragglers_.Observe(step, std::vector<double>(a + 1, a + 1 + world))) {
      reports_.Straggler(report);
    }
  }
  return a[0] > 0;
}

Trainer::StepStart Trainer::MarkStepStart() const {
  return {.time = std::chrono::steady_clock::now(),
          .communicated_bytes = collectives_->communicated_bytes(),
          .replica_communicated_bytes = collectives_->replica_communicated_bytes(),
          .collective_ms = StepPhase::OfThisRank().collective_ms()};
}

void Trainer::FinishMetrics(const StepStart& start, v1::StepMetrics* m) const {
  m->set_step_time_s(SecondsSince(start.time));
  m->set_tokens_per_s(m->step_time_s() > 0 ? m->tokens() / m->step_time_s() : 0);
  m->set_communicated_bytes(collectives_->communicated_bytes() - start.communicated_bytes);
  m->set_replica_communicated_bytes(collectives_->replica_communicated_bytes() -
                                    start.replica_communicated_bytes);
  // StepPhase times each collective's Wait() alone: for one issued ahead (a
  // prefetched gather, a reduce-scatter behind the backward) that is the
  // communication compute did not hide. On a GPU a wait only orders the
  // compute stream after NCCL's, so the host barely waits and this stays
  // near 0; the device's own stalls are a profiler's to show.
  m->set_collective_wait_s((StepPhase::OfThisRank().collective_ms() - start.collective_ms) / 1000);
  // On a GPU, the device memory the caching allocator has handed out at
  // most: what decides whether the job fits.
  m->set_peak_memory_bytes(
      device_.is_cuda()
          ? at::accelerator::getDeviceStats(device_.index())
                .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                .peak
          : PeakRssBytes());
}

// ---------------------------------------------------------------------------
// Checkpoints, rollback, evaluation and export.

absl::Status Trainer::Checkpoint(const TrainPosition& pos, bool last) {
  StepPhase::OfThisRank().Enter(StepPhase::Kind::kCheckpoint);
  collectives_->FenceIfStalled();
  absl::StatusOr<std::string> dir = recovery_.SaveCheckpoint(pos, last);
  if (absl::IsFailedPrecondition(dir.status())) {
    reports_.CheckpointRefused(pos.step, dir.status().message());
  }
  if (!dir.ok()) return dir.status();
  if (!reports_.writes_shared_files()) return absl::OkStatus();
  reports_.CheckpointSaved(pos.step, *dir);
  // Only while this run's commits are accepted: a superseded attempt keeps
  // its hands off the job's checkpoints.
  if (reports_.StopRequested()) return absl::OkStatus();
  return recovery_.RotateCheckpoints(pos.eval.best_step);
}

absl::Status Trainer::Rollback(const GuardVerdict& verdict, int64_t step, TrainPosition* pos) {
  v1::GuardEvent event = anomaly_;  // the bad step's trigger, verdict, rank, module, documents
  event.set_step(step);
  if (verdict.budget_spent) return reports_.Diagnose(event, verdict.reason);
  const int64_t skip_to = pos->data_cursor;
  absl::StatusOr<std::optional<std::string>> restored =
      recovery_.RollBack(verdict.episode_start, pos);
  if (!restored.ok()) return restored.status();
  if (!*restored) {
    return reports_.Diagnose(
        event,
        absl::StrCat(verdict.reason, "; there is no good snapshot or checkpoint from before step ",
                     verdict.episode_start, ", where the trouble began"));
  }
  event.set_restored_from(**restored);
  // The weights, optimizer and RNG went back; the data does not: the
  // documents between that state and the bad step, which led there, are
  // skipped (as PaLM's and OPT's operators did by hand). The step counter
  // and the LR schedule went back with the weights.
  const int64_t rows = std::max<int64_t>(0, skip_to - pos->data_cursor);
  SetSkippedDocuments(pos->data_cursor, batches_.DocumentLines(pos->data_cursor, rows), &event);
  pos->data_cursor = std::max(pos->data_cursor, skip_to);
  if (absl::Status s = reports_.TruncateMetricsAfter(pos->step); !s.ok()) return s;
  reports_.RolledBack(event, verdict.reason, pos->step, spec_.guard().lr_cut());
  return absl::OkStatus();
}

int64_t Trainer::EvalEvery() const {
  return spec_.has_eval() ? spec_.eval().every() : spec_.reranker().eval_every();
}

std::optional<v1::EvalReport> Trainer::Evaluate(int64_t step) {
  if (data_.eval == nullptr) return std::nullopt;
  StepPhase::OfThisRank().Enter(StepPhase::Kind::kEval);
  const int64_t per_batch = spec_.data().micro_batch_size();
  const auto start = std::chrono::steady_clock::now();
  v1::EvalReport report;
  report.set_step(step);
  if (!spec_.has_eval()) {
    // Every rank ranks every held-out group: a sharded model's layers are
    // gathered by all ranks together.
    const std::optional<RankingMetrics> metrics =
        RankHeldOut(*data_.eval, per_batch, *objective_, decoder_, state_.get(), device_);
    if (!metrics) return std::nullopt;
    report.set_groups(metrics->groups);
    report.set_mrr_at_10(metrics->mrr_at_10);
    report.set_ndcg_at_10(metrics->ndcg_at_10);
    report.set_time_s(SecondsSince(start));
    return report;
  }
  const HeldOutSums sums =
      HeldOutLoss(*data_.eval, HeldOutRows(*data_.eval, spec_.eval().max_tokens()), per_batch,
                  *objective_, decoder_, state_.get(), collectives_, device_);
  // OpenTrainingData refused an eval set without a supervised token, but
  // max_tokens may keep only rows without one.
  if (sums.supervised_tokens > 0) {
    report.set_loss(sums.loss_sum / static_cast<double>(sums.supervised_tokens));
  }
  report.set_tokens(sums.tokens);
  report.set_supervised_tokens(sums.supervised_tokens);
  report.set_time_s(SecondsSince(start));
  return report;
}

absl::Status Trainer::EvaluateAndJudge(TrainPosition* pos, bool* checkpointed) {
  std::optional<v1::EvalReport> report = Evaluate(pos->step);
  if (!report) return absl::OkStatus();
  // The evaluation before the first step is the baseline: its weights are
  // the ones training starts from, never an export.
  if (early_stopping_ && pos->step > 0) {
    if (std::optional<double> value = early_stopping_->MetricOf(*report)) {
      // Rank 0's value on every rank, so that the ranks' decisions (and the
      // collective checkpoint saves they lead to) cannot part over a bit.
      at::Tensor agreed = torch::full({1}, collectives_->rank() == 0 ? *value : 0.0,
                                      torch::TensorOptions().dtype(torch::kDouble).device(device_));
      collectives_->SumInPlace(agreed);
      *value = agreed.cpu().item<double>();
      const EvalProgress before = pos->eval;
      bool best = early_stopping_->Improves(before, *value);
      pos->eval = early_stopping_->Record(before, pos->step, *value, best);
      // The last step's checkpoint is the run's last (RunSteps), which holds
      // this progress.
      if (best && pos->step < spec_.max_steps()) {
        absl::Status s = Checkpoint(*pos, /*last=*/false);
        if (absl::IsFailedPrecondition(s)) {
          // The health gate refused these weights: they are never exported.
          best = false;
          pos->eval = early_stopping_->Record(before, pos->step, *value, false);
        } else if (!s.ok()) {
          return s;
        } else {
          *checkpointed = true;
        }
      }
      report->set_best(best);
      if (best) report->set_checkpoint(recovery_.KeptCheckpoint(pos->step));
    }
  }
  return reports_.Eval(*report);
}

absl::Status Trainer::Export() {
  StepPhase::OfThisRank().Enter(StepPhase::Kind::kExport);
  // A sharded model is gathered one bucket at a time, on every rank; rank 0
  // writes. The whole model exists once, in fp32, on each rank meanwhile.
  std::vector<std::pair<std::string, at::Tensor>> tensors =
      state_->FullTensors(/*trainable_only=*/lora_.has_value());
  if (!reports_.writes_shared_files()) return absl::OkStatus();
  collectives_->FenceIfStalled();
  const std::map<std::string, at::Tensor> bias =
      routing_bias_ ? routing_bias_->Tensors() : std::map<std::string, at::Tensor>();
  absl::Status s;
  fs::path dir;
  if (lora_) {
    dir = fs::path(out_dir_) / "adapter";
    ParamStore adapters;
    for (const auto& [name, t] : tensors) adapters.Add(name, t, ParamStore::kNoLayer, true);
    s = SavePeftAdapter(dir.string(), spec_.model().path(), config_, *lora_, adapters);
    // Not an adapter tensor (PEFT would refuse it): a file of its own, which
    // `ballast-train merge` folds into the merged model.
    if (s.ok() && !bias.empty()) {
      absl::StatusOr<std::string> path = SaveRoutingBiasBesideAdapter(dir.string(), bias);
      s = path.status();
      if (s.ok()) {
        reports_.Log("info",
                     absl::StrCat("wrote the ", bias.size(),
                                  " aux_free routing biases (*.mlp.gate."
                                  "e_score_correction_bias) to ",
                                  *path, ", beside the adapter; merge folds them into the model"));
      }
    }
  } else {
    dir = fs::path(out_dir_) / "model";
    tensors.insert(tensors.end(), bias.begin(), bias.end());
    s = ExportHfModel(spec_.model().path(), dir.string(), config_, tensors);
    if (s.ok() && !bias.empty()) {
      reports_.Log("info",
                   absl::StrCat("the exported model holds the ", bias.size(),
                                " aux_free routing biases as model.layers.*.mlp.gate."
                                "e_score_correction_bias (DeepSeek-V3's name; transformers' "
                                "Qwen3-MoE ignores them with a warning and routes without them)"));
    }
  }
  if (s.ok()) reports_.Log("info", absl::StrCat("exported ", dir.string()));
  return s;
}

}  // namespace ballast::train
