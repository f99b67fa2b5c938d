#include "worker/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "kernels/grad_norm.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data.h"
#include "worker/train/export.h"
#include "worker/train/lora.h"
#include "worker/train/model.h"
#include "worker/train/optimizer.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

struct StepMetrics {
  int64_t step = 0;  // 1-based: optimizer steps completed after this one
  double loss = 0;   // sum of token CE / supervised tokens of the step
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;
  int64_t supervised_tokens = 0;
  double step_time_s = 0;
  bool skipped = false;
  std::string skip_reason;
};

// Keeps the metrics log consistent with the checkpoint a run resumes from:
// lines past `step` came from steps that will run again.
absl::Status TruncateMetrics(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return absl::OkStatus();
  std::string kept, line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step") || j["step"].get<int64_t>() > step) break;
    kept += line + "\n";
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  return out ? absl::OkStatus()
             : absl::InternalError(absl::StrCat("cannot rewrite ", path.string()));
}

// Reports nowhere: what a standalone run without a worker uses.
class NullObserver : public TrainingObserver {
 public:
  void OnStep(const v1::StepMetrics&) override {}
  void OnGuard(const v1::GuardEvent&) override {}
  void OnCheckpointSaved(const v1::CheckpointSaved&) override {}
  void OnLog(const std::string&, const std::string&) override {}
  bool StopRequested() override { return false; }
};

class StandaloneTrainer : public Trainer {
 public:
  StandaloneTrainer(v1::JobSpec spec, std::string out_dir, TrainerOptions options,
                    ModelConfig config, ParamStore params, std::optional<LoraConfig> lora,
                    TokenizedDataset data)
      : spec_(std::move(spec)),
        out_dir_(std::move(out_dir)),
        resume_at_or_before_(options.resume_at_or_before),
        observer_(options.observer != nullptr ? options.observer : &null_observer_),
        config_(std::move(config)),
        params_(std::move(params)),
        lora_(std::move(lora)),
        data_(std::move(data)),
        decoder_(config_, &params_, lora_,
                 spec_.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat,
                 spec_.gradient_checkpointing()),
        optimizer_(AdamWConfig{spec_.optimizer().beta1(), spec_.optimizer().beta2(),
                               spec_.optimizer().eps(), spec_.optimizer().weight_decay()},
                   params_) {}

  absl::Status Run() override {
    const fs::path checkpoints = fs::path(out_dir_) / "checkpoints";
    const fs::path metrics_path = fs::path(out_dir_) / "metrics.jsonl";
    std::error_code ec;
    fs::create_directories(checkpoints, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", checkpoints.string()));

    absl::StatusOr<std::optional<std::string>> resume_from = resume_checkpoint(checkpoints);
    if (!resume_from.ok()) return resume_from.status();
    TrainPosition pos;
    if (*resume_from) {
      absl::StatusOr<TrainPosition> loaded = LoadCheckpoint(**resume_from, &params_, &optimizer_);
      if (!loaded.ok()) return loaded.status();
      pos = *loaded;
      log_line("info", absl::StrCat("resuming from checkpoint step ", pos.step, " (", **resume_from,
                                    ") to step ", spec_.max_steps()));
    } else {
      log_line("info", absl::StrCat("starting at step 0 of ", spec_.max_steps()));
    }
    if (absl::Status s = TruncateMetrics(metrics_path, pos.step); !s.ok()) return s;
    std::ofstream metrics(metrics_path, std::ios::app);

    while (pos.step < spec_.max_steps()) {
      StepMetrics m = train_step(&pos);
      metrics << ToJson(m).dump() << "\n";
      metrics.flush();
      report(m);
      if (observer_->StopRequested()) {
        log_line("info", absl::StrCat("cancelled after step ", pos.step));
        return absl::CancelledError(absl::StrCat("cancelled after step ", pos.step));
      }
      const int64_t every = spec_.checkpoint_every();
      if (every > 0 && pos.step % every == 0 && pos.step < spec_.max_steps()) {
        if (absl::Status s = save_checkpoint(checkpoints, pos); !s.ok()) return s;
      }
    }
    if (absl::Status s = save_checkpoint(checkpoints, pos); !s.ok()) return s;
    return export_result();
  }

 private:
  // The checkpoint to resume from: the newest, or for a rollback the newest
  // at or before the requested step (newer ones are deleted, so a later
  // restart cannot jump forward again).
  absl::StatusOr<std::optional<std::string>> resume_checkpoint(const fs::path& checkpoints) {
    if (resume_at_or_before_ > 0) {
      return KeepCheckpointsAtOrBefore(checkpoints.string(), resume_at_or_before_);
    }
    return LatestCheckpoint(checkpoints.string());
  }

  absl::Status save_checkpoint(const fs::path& checkpoints, const TrainPosition& pos) {
    absl::StatusOr<std::string> dir =
        SaveCheckpoint(checkpoints.string(), pos, params_, optimizer_);
    if (!dir.ok()) return dir.status();
    v1::CheckpointSaved saved;
    saved.set_step(pos.step);
    saved.set_path(*dir);
    observer_->OnCheckpointSaved(saved);
    return absl::OkStatus();
  }

  // One step's metrics to the observer; a skipped step is also a guard event.
  void report(const StepMetrics& m) {
    v1::StepMetrics out;
    out.set_step(m.step);
    out.set_max_steps(spec_.max_steps());
    out.set_loss(m.supervised_tokens > 0 ? m.loss : std::numeric_limits<double>::quiet_NaN());
    out.set_grad_norm(m.grad_norm);
    out.set_lr(m.lr);
    out.set_tokens(m.tokens);
    out.set_supervised_tokens(m.supervised_tokens);
    out.set_tokens_per_s(m.step_time_s > 0 ? m.tokens / m.step_time_s : 0);
    out.set_step_time_s(m.step_time_s);
    out.set_skipped(m.skipped);
    observer_->OnStep(out);
    if (m.skipped) {
      v1::GuardEvent guard;
      guard.set_kind(v1::GuardEvent::KIND_SKIP);
      guard.set_step(m.step);
      guard.set_message(m.skip_reason);
      observer_->OnGuard(guard);
    }
  }

  // A line for the rank log (stderr) and the job's event stream.
  void log_line(const std::string& level, const std::string& text) {
    std::cerr << "ballast-train: " << text << std::endl;
    observer_->OnLog(level, text);
  }

  StepMetrics train_step(TrainPosition* pos) {
    const auto start = std::chrono::steady_clock::now();
    const v1::DataSpec& d = spec_.data();
    const int64_t mbs = d.micro_batch_size();
    StepMetrics m;
    m.step = pos->step + 1;
    m.lr = ScheduledLearningRate(spec_.schedule().kind(), spec_.optimizer().lr(), pos->step,
                                 spec_.schedule().warmup_steps(), spec_.max_steps());

    // Batch: every micro-batch of the step, so the global count is known
    // before the first backward.
    std::vector<PackedBatch> micro_batches;
    for (int64_t i = 0; i < d.grad_accum_steps(); ++i) {
      micro_batches.push_back(data_.pack(pos->data_cursor, mbs, d.shuffle(), spec_.seed()));
      pos->data_cursor += mbs;
      m.tokens += micro_batches.back().input_ids.numel();
      m.supervised_tokens += micro_batches.back().supervised_tokens;
    }
    pos->step += 1;
    if (m.supervised_tokens == 0) {
      m.skipped = true;
      m.skip_reason = "no supervised tokens";
      m.step_time_s = Seconds(start);
      return m;
    }

    // Forward and backward, each micro-batch scaled by the step's count.
    const double n = static_cast<double>(m.supervised_tokens);
    double loss_sum = 0;
    for (const PackedBatch& batch : micro_batches) {
      kernels::LossSum ls = decoder_.loss(batch, /*training=*/true);
      (ls.sum / n).backward();
      loss_sum += ls.sum.item<double>();
    }
    m.loss = loss_sum / n;

    // grad_norm over every trainable tensor, then the guard: a non-finite
    // step never reaches the weights.
    std::vector<std::string> names = params_.trainable_names();
    std::vector<at::Tensor> grads;
    for (const std::string& name : names) grads.push_back(params_.get(name).grad());
    kernels::GradNormResult gn = kernels::grad_norm(grads);
    m.grad_norm = gn.norm.item<double>();
    if (gn.first_nonfinite >= 0 || !std::isfinite(m.loss)) {
      m.skipped = true;
      m.skip_reason = gn.first_nonfinite >= 0
                          ? absl::StrCat("non-finite gradient in ", names[gn.first_nonfinite])
                          : "non-finite loss";
    } else {
      // Clip as torch.nn.utils.clip_grad_norm_ does.
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
      optimizer_.step(params_, m.lr);
    }
    for (const std::string& name : names) {
      at::Tensor p = params_.get(name);
      if (p.grad().defined()) p.mutable_grad().reset();
    }
    m.step_time_s = Seconds(start);
    return m;
  }

  absl::Status export_result() {
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
    if (s.ok()) log_line("info", absl::StrCat("exported ", dir.string()));
    return s;
  }

  static double Seconds(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  static nlohmann::json ToJson(const StepMetrics& m) {
    nlohmann::json j = {{"step", m.step},
                        {"grad_norm", std::isfinite(m.grad_norm) ? nlohmann::json(m.grad_norm)
                                                                 : nlohmann::json(nullptr)},
                        {"lr", m.lr},
                        {"tokens", m.tokens},
                        {"supervised_tokens", m.supervised_tokens},
                        {"step_time_s", m.step_time_s},
                        {"skipped", m.skipped}};
    // A step without supervised tokens has no loss: null, never 0 or NaN.
    j["loss"] = m.supervised_tokens > 0 && std::isfinite(m.loss) ? nlohmann::json(m.loss)
                                                                 : nlohmann::json(nullptr);
    if (!m.skip_reason.empty()) j["skip_reason"] = m.skip_reason;
    return j;
  }

  v1::JobSpec spec_;
  std::string out_dir_;
  const int64_t resume_at_or_before_;
  NullObserver null_observer_;
  TrainingObserver* const observer_;
  ModelConfig config_;
  ParamStore params_;
  std::optional<LoraConfig> lora_;
  TokenizedDataset data_;
  Decoder decoder_;
  AdamW optimizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir,
                                                         TrainerOptions options) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(spec.model().path());
  if (!config.ok()) return config.status();
  if (spec.data().seq_len() > config->max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.seq_len = ", spec.data().seq_len(), " is out of range; allowed: 1..",
                     config->max_position_embeddings, " (max_position_embeddings of the model)"));
  }
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
      if (absl::Status s = LoadPeftAdapter(spec.lora().init_adapter(), *lora, &*params); !s.ok()) {
        return s;
      }
    }
  }
  return std::make_unique<StandaloneTrainer>(spec, out_dir, options, *std::move(config),
                                             *std::move(params), std::move(lora), *std::move(data));
}

}  // namespace ballast::train
