// ballast-train: one rank of a Ballast job, or a standalone run.
//
//   ballast-train --spec JOB.yaml|JOB.json --out DIR [--set key=value]...
//       [--agent-socket PATH [--agent-silence-ms N]] [--attempt N]
//       [--resume-at-or-before N] [--profile FILE.json]
//       [--rank R --world-size W --master-addr A --master-port P]
//       [--rendezvous-timeout SECONDS] [--collective-timeout SECONDS]
//   ballast-train --spec JOB.yaml --out DIR [--nproc N] [--set key=value]...
//       [--rendezvous-timeout S] [--collective-timeout S]
//   ballast-train logits --model DIR [--adapter DIR] --tokens FILE.jsonl --out FILE.safetensors
//   ballast-train merge --model DIR --adapter DIR --out DIR
//   ballast-train rerank --model DIR [--adapter DIR] --queries FILE.jsonl [--spec JOB.yaml]
//   ballast-train data-check --spec JOB.yaml [--set key=value]... [--rows N]
//   ballast-train tokenize --tokenizer DIR_OR_JSON [--template T] [--train-on-all]
//       [--allow-special] < in.jsonl > out.jsonl
//
// A job has the spec's `devices` ranks: --world-size and --nproc may repeat
// that number, never change it. Without --rank, --world-size, --master-port
// or --agent-socket, a job of several ranks starts them all on this machine.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <fstream>
#include <functional>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_files.h"
#include "common/job_spec_paths.h"
#include "common/regular_file.h"
#include "common/spec_rules.h"
#include "common/version.h"
#include "worker/train/checkpoint/export.h"
#include "worker/train/collectives/process_group.h"
#include "worker/train/collectives/step_phase.h"
#include "worker/train/data/data_check.h"
#include "worker/train/data/tokenize_lines.h"
#include "worker/train/model/inference.h"
#include "worker/train/objective/rerank_queries.h"
#include "worker/train/rank/agent_channel.h"
#include "worker/train/rank/attempt_output.h"
#include "worker/train/rank/device_info.h"
#include "worker/train/rank/local_ranks.h"
#include "worker/train/rank/rank_observer.h"
#include "worker/train/trainer/op_profile.h"
#include "worker/train/trainer/trainer.h"

namespace {

// A training step allocates and frees the same large activations every step.
// glibc serves blocks above its mmap threshold (32 MiB at most) with fresh
// mappings and unmaps them on free, and trims the heap top past 128 KiB, so
// each step page-faults its activations in again: about 10k faults per step on
// the benchmark model (bench/trainer_vs_peft.py), roughly 5% of its time.
// Serving every block from the heap and trimming only past 2 GiB keeps them
// mapped after the first step, at about 15% more peak RSS there.
// Only for one rank: a sharded step's largest blocks (a layer's flat
// gradient, Gloo's buffers, from several threads) change size and place per
// layer, and a heap that never gives memory back fragments under them until
// a rank of two peaks above one whole rank (measured: 2605 MiB at N = 2
// against 2505 at N = 1 with it, 1800 without; bench/sharded_trainer.py).
void KeepActivationsMapped() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

// Exit codes (docs/control-plane.md): 0 done; 2 the spec or an input is bad,
// which a restart on the same spec and files cannot fix, so the coordinator
// fails the job without retrying; 3 fenced (its worker went silent, or a
// newer attempt took the output folder over; restartable); 143 cancelled by
// the worker or SIGTERM; 1 anything else, which a restart may fix (a lost
// peer, a full disk).
constexpr int kExitFenced = 3;

// Ends a rank that may no longer write for its job (a fence fell), at once
// and from any thread: nothing more reaches the job's folder or the worker.
// Uncommitted work stays in the attempt's folder, which the next attempt's
// claim removes.
[[noreturn]] void ExitFenced(const std::string& why) {
  std::cerr << "ballast-train: " << why << "; stopping without writing more" << std::endl;
  _exit(kExitFenced);
}

int Fail(const absl::Status& status) {
  std::cerr << "ballast-train: " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:     // a value the spec, model or data contradicts
    case absl::StatusCode::kNotFound:            // a missing file or tensor
    case absl::StatusCode::kFailedPrecondition:  // a shape that disagrees; the guard's diagnosis,
                                                 // a run that applied too few steps among them
    case absl::StatusCode::kDataLoss:            // a corrupt safetensors file or checkpoint
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:  // the job does not fit in memory
      return 2;
    case absl::StatusCode::kAborted:
      return kExitFenced;
    case absl::StatusCode::kCancelled:
      return 143;
    default:
      return 1;
  }
}

// How this process was started: alone, or as one rank under a worker.
struct RankFlags {
  std::string agent_socket;
  int64_t agent_silence_ms = 0;
  int32_t attempt = 0;
  std::optional<int64_t> resume_at_or_before;
  int rank = 0;
  // The spec's devices: --world-size and --nproc may only repeat it.
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double rendezvous_timeout_s = 300;
  // How long a peer may go without a heartbeat (process_group.h).
  double collective_timeout_s = 60;
  // ballastd's --path-root folders, which the spec's paths must lie in.
  std::vector<std::string> path_roots;
  // --profile: torch's profiler over the run, into this Chrome trace.
  std::string profile_path;
};

// A job of several ranks meets at rank 0's store before anything is loaded,
// so that a missing peer fails the job in seconds, not after the model loads.
// `shard_group`: hybrid sharding's ranks per shard group, 0 without it.
absl::StatusOr<std::unique_ptr<ballast::train::Collectives>> ConnectRanks(const RankFlags& flags,
                                                                          c10::Device device,
                                                                          int shard_group) {
  if (flags.world_size == 1) return std::make_unique<ballast::train::SingleRank>();
  if (flags.master_port <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job of ", flags.world_size,
                     " ranks (the spec's devices) needs --master-port "
                     "(rank 0's store)"));
  }
  ballast::train::Rendezvous r;
  r.rank = flags.rank;
  r.world_size = flags.world_size;
  r.master_addr = flags.master_addr;
  r.master_port = flags.master_port;
  r.attempt = flags.attempt;
  r.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.rendezvous_timeout_s * 1000));
  r.collective_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(flags.collective_timeout_s * 1000));
  r.on_stalled = ExitFenced;
  r.device = device;
  r.shard_group = shard_group;
  return ballast::train::ConnectProcessGroup(r);
}

// A spec file with its --set overrides and defaults applied, not yet checked
// (PrepareJobSpec fills some fields from the model's files first).
absl::StatusOr<ballast::v1::JobSpec> LoadSpec(const std::string& spec_path,
                                              const std::vector<std::string>& overrides) {
  // A worker hands its rank spec.json (proto JSON); a user passes YAML.
  absl::StatusOr<ballast::v1::JobSpec> spec = ballast::LoadJobSpecFile(spec_path);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = ballast::ApplyOverrides(overrides, &*spec); !s.ok()) return s;
  ballast::ApplyDefaults(&*spec);
  return spec;
}

// The rank's phase as its channel reports it to the watchdog; nothing while
// no step has begun (the model and the data are loading).
std::optional<std::pair<uint64_t, ballast::v1::RankPhase>> ReadStepPhase() {
  using ballast::train::StepPhase;
  const StepPhase::Snapshot now = StepPhase::OfThisRank().Read();
  if (now.kind == StepPhase::Kind::kIdle) return std::nullopt;
  ballast::v1::RankPhase phase;
  phase.set_step(now.step);
  phase.set_phase(std::string(StepPhase::Name(now.kind)));
  phase.set_layer(now.layer);
  phase.set_collective(std::string(now.collective));
  phase.set_collective_seq(now.collective_seq);
  phase.set_since_ms(now.since_ms);
  return std::make_pair(now.version, std::move(phase));
}

// The trainer's run, under torch's profiler with --profile.
absl::Status RunProfiled(ballast::train::Trainer& trainer, const RankFlags& flags,
                         c10::Device device) {
  if (flags.profile_path.empty()) return trainer.Run();
  absl::StatusOr<std::unique_ptr<ballast::train::OpProfile>> profile =
      ballast::train::OpProfile::Start(
          ballast::train::RankProfilePath(flags.profile_path, flags.rank, flags.world_size),
          device);
  if (!profile.ok()) return profile.status();
  absl::Status status = trainer.Run();
  // A trace that cannot be written is said, and the run's own outcome
  // stands: a trained export (or an attempt to commit) is never lost to it.
  if (absl::Status written = (*profile)->Finish(); !written.ok()) {
    std::cerr << "ballast-train: --profile: " << written.message() << std::endl;
  }
  return status;
}

absl::Status RunSpec(ballast::v1::JobSpec spec, const std::string& out_dir,
                     const RankFlags& flags) {
  // A user's relative paths mean this folder, as they would to `ballast submit`.
  if (absl::Status s = ballast::MakeSpecPathsAbsolute(&spec); !s.ok()) return s;
  // The same checks as submission, so a standalone run refuses what ballastd
  // would; with its roots again, since a symlink may point elsewhere by now.
  if (absl::Status s = ballast::CheckPathRoots(flags.path_roots); !s.ok()) return s;
  // From here every file of the spec is read through a descriptor whose file
  // is checked to lie under the roots, so a symlink swapped after this check
  // cannot lead a read out of them either.
  ballast::ConfineOpensBeneath(flags.path_roots);
  if (absl::Status s = ballast::PrepareJobSpec(&spec, flags.path_roots); !s.ok()) return s;
  if (!flags.path_roots.empty()) ballast::ResolveSpecPaths(&spec);
  // Before the rendezvous: a rank that cannot compute where the spec says
  // fails the job at once, with exit 2 (a restart would find the same).
  absl::StatusOr<c10::Device> device =
      ballast::train::ChooseDevice(spec.device(), ballast::train::ProbeDevices());
  if (!device.ok()) return device.status();
  std::unique_ptr<ballast::train::AgentChannel> channel;
  if (!flags.agent_socket.empty()) {
    ballast::train::SilenceFence fence;
    fence.limit = std::chrono::milliseconds(flags.agent_silence_ms);
    fence.on_silent = [limit = flags.agent_silence_ms](std::chrono::milliseconds silent) {
      // The worker is frozen, dead or cut off, and the coordinator hands
      // this rank's work to another worker once the lease and this limit
      // have run out: stop now, in the middle of a step if need be.
      ExitFenced(absl::StrCat("no keepalive from the worker for ", silent.count(),
                              " ms (--agent-silence-ms ", limit, ")"));
    };
    absl::StatusOr<std::unique_ptr<ballast::train::AgentChannel>> connected =
        ballast::train::AgentChannel::Connect(flags.agent_socket, flags.rank, std::move(fence),
                                              {.read = ReadStepPhase});
    if (!connected.ok()) return absl::UnavailableError(connected.status().message());
    channel = *std::move(connected);
  }
  absl::StatusOr<std::unique_ptr<ballast::train::Collectives>> collectives = ConnectRanks(
      flags, *device, spec.sharding().strategy() == "hybrid" ? spec.sharding().shard_group() : 0);
  if (!collectives.ok()) return collectives.status();
  // Under a coordinator the trainer writes into its attempt's own folder and
  // every report is committed to out_dir before it goes up. Rank 0 claims
  // the folder and commits; the other ranks write their checkpoint shards
  // into it (a file system every rank of the job shares).
  std::unique_ptr<ballast::train::AttemptOutput> output;
  std::string trainer_dir = out_dir;
  if (flags.attempt > 0) {
    absl::Status claim_status;
    if (flags.rank == 0) {
      absl::StatusOr<std::unique_ptr<ballast::train::AttemptOutput>> claimed =
          ballast::train::AttemptOutput::Claim(out_dir, flags.attempt, flags.resume_at_or_before);
      claim_status = claimed.status();
      if (claimed.ok()) output = *std::move(claimed);
    }
    if ((*collectives)->Max(claim_status.ok() ? 0 : 1) != 0) {
      if (!claim_status.ok()) return claim_status;
      return absl::AbortedError(
          absl::StrCat("rank 0 could not claim ", out_dir, " for attempt ", flags.attempt));
    }
    trainer_dir = ballast::train::AttemptOutput::DirFor(out_dir, flags.attempt);
  }
  ballast::train::RankObserver observer(channel.get(), output.get(), collectives->get());
  ballast::train::TrainerOptions options;
  options.resume_at_or_before = flags.resume_at_or_before;
  // Rank 0 commits each checkpoint there; every rank reads it on a rollback.
  if (flags.attempt > 0) options.kept_checkpoints_dir = out_dir + "/checkpoints";
  // The job's folder, not the attempt's: a restart reads what the first
  // attempt tokenized.
  options.data_cache_dir = out_dir + "/data-cache";
  options.observer = &observer;
  options.collectives = collectives->get();
  options.device = *device;
  absl::StatusOr<ballast::train::DelayInjection> delays =
      ballast::train::DelayInjection::FromEnvironment(flags.rank, flags.attempt);
  if (!delays.ok()) return delays.status();
  options.delays = *delays;
  absl::StatusOr<std::unique_ptr<ballast::train::Trainer>> trainer =
      ballast::train::Trainer::Create(spec, trainer_dir, options);
  absl::Status status = trainer.ok() ? RunProfiled(**trainer, flags, *device) : trainer.status();
  // A refused commit ended the run, whatever the trainer made of the stop.
  if (!observer.commit_status().ok()) status = observer.commit_status();
  if (output == nullptr) return status;
  (*collectives)->FenceIfStalled();
  if (!status.ok()) {
    output->Discard();
    return status;
  }
  absl::StatusOr<std::string> exported = output->CommitExport();
  if (!exported.ok()) return exported.status();
  const std::string line = absl::StrCat("committed attempt ", flags.attempt, ": ", *exported);
  std::cerr << "ballast-train: " << line << std::endl;
  observer.OnEvent(ballast::train::LogEvent("info", line));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Subcommands: each takes its parsed flags and returns the exit code.

struct TrainArgs {
  std::string spec_path;
  std::string out_dir;
  std::vector<std::string> overrides;
  RankFlags flags;
  // As given; unset means the spec's devices.
  std::optional<int> world_size;
  int nproc = 0;
};

struct LogitsArgs {
  std::string model_dir, adapter_dir, tokens_path, out;
  bool gradients = false;
};

struct MergeArgs {
  std::string model_dir, adapter_dir, out;
};

struct RerankArgs {
  std::string model_dir, adapter_dir, queries_path, spec_path;
};

struct DataCheckArgs {
  std::string spec_path;
  std::vector<std::string> overrides;
  int64_t rows = 2;
};

// Starts `nproc` ranks of this command on this machine and waits for them.
int RunLocal(int nproc, int argc, char** argv) {
  ballast::train::LocalRanksOptions local;
  local.binary = "/proc/self/exe";
  local.argv0 = argv[0];
  local.args = ballast::train::ArgumentsWithout(argc, argv, "--nproc");
  local.nproc = nproc;
  absl::StatusOr<int> code = ballast::train::RunLocalRanks(local);
  if (!code.ok()) return Fail(code.status());
  return *code;
}

// The job of a spec: one rank of it (under a worker, or started by hand
// with --rank), or all of its ranks on this machine.
int Train(const TrainArgs& args, const CLI::App& app, int argc, char** argv) {
  if (args.nproc > 0) {
    for (const char* own : {"--rank", "--world-size", "--master-addr", "--master-port",
                            "--agent-socket", "--attempt"}) {
      if (app.count(own) > 0) {
        std::cerr << "ballast-train: --nproc starts its own ranks; it cannot be combined with "
                  << own << "\n";
        return 2;
      }
    }
  }
  if (args.spec_path.empty() || args.out_dir.empty()) {
    std::cerr << "ballast-train: --spec and --out are required\n" << app.help();
    return 2;
  }
  absl::StatusOr<ballast::v1::JobSpec> spec = LoadSpec(args.spec_path, args.overrides);
  if (!spec.ok()) return Fail(spec.status());
  if (absl::Status apart = ballast::CheckOutputApartFromInputs(args.out_dir, *spec); !apart.ok()) {
    return Fail(apart);
  }
  // The spec says how many ranks the job has, as it does to the
  // coordinator; a flag that says otherwise is a mistake, not an override.
  const int devices = spec->devices();
  if (const ballast::SpecRule& rule = *ballast::FindSpecRule("devices");
      devices < rule.lo || devices > rule.hi) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "devices = ", devices, " is out of range; allowed: ", ballast::SpecAllowedText(rule))));
  }
  for (const auto& [flag, value] : {std::pair{"--nproc", args.nproc > 0 ? args.nproc : devices},
                                    {"--world-size", args.world_size.value_or(devices)}}) {
    if (value != devices) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(flag, " ", value, " disagrees with the spec's devices: ", devices)));
    }
  }
  // Nothing says this process is one rank of a gang: it starts them all.
  const bool one_rank = args.world_size.has_value() || app.count("--rank") > 0 ||
                        app.count("--master-port") > 0 || !args.flags.agent_socket.empty();
  if (args.nproc > 0 || (devices > 1 && !one_rank)) return RunLocal(devices, argc, argv);

  RankFlags flags = args.flags;
  flags.world_size = devices;
  if (flags.rank >= flags.world_size) {
    std::cerr << "ballast-train: --rank " << flags.rank << " is out of range; allowed: 0.."
              << flags.world_size - 1 << "\n";
    return 2;
  }
  if (flags.world_size == 1) KeepActivationsMapped();
  // Before anything slow: a SIGTERM while loading stops the run at its
  // first step boundary.
  ballast::train::RankObserver::CatchSigterm();
  absl::Status status = RunSpec(*std::move(spec), args.out_dir, flags);
  return status.ok() ? 0 : Fail(status);
}

int Logits(const LogitsArgs& args) {
  absl::Status status = ballast::train::WriteLogits(args.model_dir, args.adapter_dir,
                                                    args.tokens_path, args.out, args.gradients);
  return status.ok() ? 0 : Fail(status);
}

int Merge(const MergeArgs& args) {
  absl::Status status =
      ballast::train::ExportMergedLora(args.model_dir, args.adapter_dir, args.out);
  return status.ok() ? 0 : Fail(status);
}

int Rerank(const RerankArgs& args) {
  ballast::train::RerankOptions options{args.model_dir, args.adapter_dir, {}};
  if (!args.spec_path.empty()) {
    absl::StatusOr<ballast::v1::JobSpec> spec = ballast::LoadJobSpecFile(args.spec_path);
    if (!spec.ok()) return Fail(spec.status());
    options.spec = *std::move(spec);
  }
  std::ifstream queries(args.queries_path);
  int64_t failed = 0;
  absl::StatusOr<ballast::train::RankingMetrics> metrics =
      ballast::train::RerankQueries(options, queries, std::cout, &failed);
  if (!metrics.ok()) return Fail(metrics.status());
  if (metrics->groups > 0) {
    std::cerr << "ballast-train: MRR@10 " << metrics->mrr_at_10 << ", NDCG@10 "
              << metrics->ndcg_at_10 << " over " << metrics->groups << " queries with a positive\n";
  }
  if (failed > 0) {
    std::cerr << "ballast-train: " << failed << " lines failed; see their error lines\n";
    return 1;
  }
  return 0;
}

int DataCheck(const DataCheckArgs& args) {
  absl::StatusOr<ballast::v1::JobSpec> spec = ballast::LoadJobSpecFile(args.spec_path);
  absl::Status status = spec.status();
  if (status.ok()) status = ballast::ApplyOverrides(args.overrides, &*spec);
  if (status.ok()) status = ballast::MakeSpecPathsAbsolute(&*spec);
  if (status.ok()) status = ballast::PrepareJobSpec(&*spec);
  if (status.ok()) status = ballast::train::WriteDataCheck(*spec, args.rows, std::cout);
  return status.ok() ? 0 : Fail(status);
}

int Tokenize(const ballast::train::TokenizeLinesOptions& options) {
  absl::StatusOr<ballast::train::TokenizeLinesCounts> counts =
      ballast::train::TokenizeLines(options, std::cin, std::cout);
  if (!counts.ok()) return Fail(counts.status());
  if (counts->special_token_text > 0) {
    std::cerr << "ballast-train: " << counts->special_token_text
              << " lines contained special-token text, encoded "
              << (options.allow_special ? "as special tokens (--allow-special)\n"
                                        : "as plain text (--allow-special makes them special "
                                          "tokens)\n");
  }
  if (counts->failed > 0) {
    std::cerr << "ballast-train: " << counts->failed << " lines failed; see their error lines\n";
    return 1;
  }
  return 0;
}

// Runs a subcommand, turning what it throws into an exit code: LibTorch
// reports through exceptions, and the subcommands' stop here (the Trainer
// converts its own).
int CatchExceptions(const std::function<int()>& command) {
  absl::Status status;
  try {
    return command();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory: an allocation failed");
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  return Fail(status);
}

// ---------------------------------------------------------------------------
// Flags, one function per subcommand; the job's are the top level's.

void AddTrainFlags(CLI::App& app, TrainArgs* args) {
  app.add_option("--spec", args->spec_path,
                 "Job spec: YAML, or proto JSON if the name ends in .json (README: Job spec)")
      ->check(CLI::ExistingFile);
  app.add_option("--out", args->out_dir,
                 "Run folder: metrics.jsonl, checkpoints/, adapter/ or model/");
  app.add_option("--set", args->overrides, "Override a spec key: key.path=value (repeatable)");
  RankFlags& flags = args->flags;
  app.add_option("--agent-socket", flags.agent_socket,
                 "Unix socket of the ballast-worker that started this rank");
  app.add_option("--agent-silence-ms", flags.agent_silence_ms,
                 "With --agent-socket: exit (code 3) when the worker sends no keepalive this "
                 "long; 0 never")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--attempt", flags.attempt,
                 "The coordinator's attempt: write into OUT/attempts/N and commit into OUT")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume-at-or-before", flags.resume_at_or_before,
                 "Resume from the newest good checkpoint at or before step N; newer ones are "
                 "deleted; 0 starts over from the initial weights")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rank", flags.rank, "This process's rank, 0..world_size-1")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world-size", args->world_size,
                 "Ranks in the job: the spec's devices, which this may only repeat")
      ->check(CLI::PositiveNumber);
  app.add_option("--master-addr", flags.master_addr, "c10d TCPStore host (rank 0's)");
  app.add_option("--master-port", flags.master_port, "c10d TCPStore port")
      ->check(CLI::Range(0, 65535));
  app.add_option("--rendezvous-timeout", flags.rendezvous_timeout_s,
                 "Seconds to wait for the store and every peer, and for any collective")
      ->check(CLI::PositiveNumber);
  app.add_option("--collective-timeout", flags.collective_timeout_s,
                 "Seconds a peer may go without a heartbeat (stopped, frozen, cut off) before "
                 "this rank counts it lost and exits 1; a rank that went this long itself exits "
                 "3 (fenced) without writing more")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--path-root", flags.path_roots,
                 "A folder the spec's model, adapter, tokenizer and data paths must lie in, "
                 "after symlinks (repeatable; ballast-worker passes ballastd's --path-root)");
  app.add_option("--profile", flags.profile_path,
                 "Write a Chrome trace of the run's ops (torch's profiler: each op with its "
                 "input shapes and time) to FILE.json; a job of several ranks writes "
                 "FILE.rankR.json per rank. Slows the run: profile a few steps")
      ->type_name("FILE.json");
  app.add_option("--nproc", args->nproc,
                 "Run the job's N ranks on this machine (standalone), N the spec's devices: each "
                 "is this command with --rank R --world-size N and a free port of 127.0.0.1")
      ->check(CLI::Range(1, 1024));
}

CLI::App* AddLogits(CLI::App& app, LogitsArgs* args) {
  CLI::App* logits = app.add_subcommand("logits", "Write a model's logits on tokenized documents");
  logits->add_option("--model", args->model_dir, "HF model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  logits->add_option("--adapter", args->adapter_dir, "PEFT adapter folder")
      ->check(CLI::ExistingDirectory);
  logits->add_option("--tokens", args->tokens_path, "JSONL with input_ids")
      ->required()
      ->check(CLI::ExistingFile);
  logits->add_option("--out", args->out, "Output .safetensors (logits, cu_seqlens)")->required();
  logits->add_flag("--gradients", args->gradients,
                   "Also write the gradient of the summed next-token cross-entropy for every "
                   "adapter tensor (every base tensor without --adapter), as grad.<name>");
  return logits;
}

CLI::App* AddMerge(CLI::App& app, MergeArgs* args) {
  CLI::App* merge = app.add_subcommand("merge", "Fold a LoRA adapter into its base model");
  merge->add_option("--model", args->model_dir, "HF base model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  merge->add_option("--adapter", args->adapter_dir, "PEFT adapter folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  merge->add_option("--out", args->out, "Output HF model folder")->required();
  return merge;
}

CLI::App* AddRerank(CLI::App& app, RerankArgs* args) {
  CLI::App* rerank = app.add_subcommand(
      "rerank", "Score (query, document) pairs with a generative reranker: P(yes) per document");
  rerank->add_option("--model", args->model_dir, "HF model folder (with its tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  rerank->add_option("--adapter", args->adapter_dir, "PEFT adapter folder")
      ->check(CLI::ExistingDirectory);
  rerank
      ->add_option("--queries", args->queries_path,
                   "JSONL: {\"query\", \"documents\"} or reranker training records")
      ->required()
      ->check(CLI::ExistingFile);
  rerank
      ->add_option("--spec", args->spec_path,
                   "The job spec whose reranker prompt and yes/no tokens to use (default "
                   "Qwen3-Reranker's)")
      ->check(CLI::ExistingFile);
  return rerank;
}

CLI::App* AddDataCheck(CLI::App& app, DataCheckArgs* args) {
  CLI::App* data_check = app.add_subcommand(
      "data-check", "Tokenize and pack a job's data without training; show what it trains on");
  data_check->add_option("--spec", args->spec_path, "Job spec: YAML, or proto JSON")
      ->required()
      ->check(CLI::ExistingFile);
  data_check->add_option("--set", args->overrides, "Override a spec key: key.path=value");
  data_check->add_option("--rows", args->rows, "Rows to show, decoded (default 2)")
      ->check(CLI::NonNegativeNumber);
  return data_check;
}

CLI::App* AddTokenize(CLI::App& app, ballast::train::TokenizeLinesOptions* options) {
  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "Tokenize JSONL lines ({\"text\"} or {\"messages\"}) from stdin to ids");
  tokenize
      ->add_option("--tokenizer", options->tokenizer,
                   "tokenizer.json, or a model folder holding one")
      ->required()
      ->check(CLI::ExistingPath);
  tokenize->add_option(
      "--template", options->chat_template,
      "Chat template for messages: qwen3, qwen3_5, chatml or llama3 (default: from "
      "tokenizer_config.json)");
  tokenize->add_flag("--train-on-all", options->train_on_all,
                     "Mark every token of a chat trained, not only the assistant turns");
  tokenize->add_flag("--allow-special", options->allow_special,
                     "Match special tokens inside text and message content, as transformers "
                     "does by default and a job does with data.allow_special_tokens");
  return tokenize;
}

}  // namespace

int main(int argc, char** argv) {
  // Gloo writes to its peers with writev(), which has no MSG_NOSIGNAL: a
  // peer that died would otherwise kill this rank with SIGPIPE (exit 141)
  // before it can name the lost rank. EPIPE fails the collective instead.
  // The worker starts ranks with default signal actions, so this is ours.
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"ballast-train: run one finetuning job (LoRA or full) on LibTorch"};
  app.set_version_flag("--version", [] {
    return ballast::VersionLine("ballast-train") + "\n" + ballast::train::DescribeBackends();
  });
  TrainArgs train;
  AddTrainFlags(app, &train);
  LogitsArgs logits_args;
  CLI::App* logits = AddLogits(app, &logits_args);
  MergeArgs merge_args;
  CLI::App* merge = AddMerge(app, &merge_args);
  RerankArgs rerank_args;
  CLI::App* rerank = AddRerank(app, &rerank_args);
  DataCheckArgs data_check_args;
  CLI::App* data_check = AddDataCheck(app, &data_check_args);
  ballast::train::TokenizeLinesOptions tokenize_options;
  CLI::App* tokenize = AddTokenize(app, &tokenize_options);
  CLI11_PARSE(app, argc, argv);

  // A job's ranks decide once they know their world size (Train).
  const bool job = !logits->parsed() && !merge->parsed() && !rerank->parsed() &&
                   !data_check->parsed() && !tokenize->parsed();
  if (!job) KeepActivationsMapped();
  return CatchExceptions([&] {
    if (logits->parsed()) return Logits(logits_args);
    if (merge->parsed()) return Merge(merge_args);
    if (rerank->parsed()) return Rerank(rerank_args);
    if (data_check->parsed()) return DataCheck(data_check_args);
    if (tokenize->parsed()) return Tokenize(tokenize_options);
    return Train(train, app, argc, argv);
  });
}
