#include "worker/agent/rank.h"

#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace ballast::agent {
namespace {

namespace fs = std::filesystem;

// How long an exited rank's socket may take to deliver what is still in it.
constexpr absl::Duration kDrainTimeout = absl::Seconds(2);

}  // namespace

std::vector<std::string> TrainArguments(const v1::Assignment& a, const std::string& spec_path,
                                        const std::string& socket_path) {
  std::vector<std::string> args = {"--spec",         spec_path,
                                   "--out",          a.output_dir(),
                                   "--agent-socket", socket_path,
                                   "--rank",         absl::StrCat(a.rank()),
                                   "--world-size",   absl::StrCat(std::max(1, a.world_size()))};
  // The attempt scopes the rank's writes (OUT/attempts/N until committed);
  // the silence limit is its fence against a worker that lost its lease.
  if (a.attempt() > 0) args.insert(args.end(), {"--attempt", absl::StrCat(a.attempt())});
  if (a.agent_silence_ms() > 0) {
    args.insert(args.end(), {"--agent-silence-ms", absl::StrCat(a.agent_silence_ms())});
  }
  if (!a.master_addr().empty()) {
    args.insert(args.end(), {"--master-addr", a.master_addr()});
  }
  if (a.master_port() > 0) {
    args.insert(args.end(), {"--master-port", absl::StrCat(a.master_port())});
  }
  for (const std::string& root : a.path_roots()) args.insert(args.end(), {"--path-root", root});
  if (a.has_resume_at_or_before()) {
    args.insert(args.end(), {"--resume-at-or-before", absl::StrCat(a.resume_at_or_before())});
  }
  return args;
}

absl::Status WriteSpecJson(const v1::JobSpec& spec, const std::string& path) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(spec, &json, options); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot write the spec as JSON: ", s.ToString()));
  }
  std::ofstream out(path, std::ios::trunc);
  out << json << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

int StopOrphanedRanks(const std::string& ranks_dir) {
  int killed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ranks_dir, ec)) {
    pid_t pid = 0;
    std::ifstream(entry.path() / "pid") >> pid;
    std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"));
    const std::string args((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    if (pid > 0 && args.find((entry.path() / "spec.json").string()) != std::string::npos &&
        kill(-pid, SIGKILL) == 0) {
      std::cout << "ballast-worker: killed rank pid " << pid << " left by a previous run ("
                << entry.path().filename().string() << ")" << std::endl;
      ++killed;
    }
    fs::remove_all(entry.path(), ec);
  }
  return killed;
}

absl::StatusOr<std::unique_ptr<Rank>> Rank::Start(const v1::Assignment& assignment,
                                                  const RankEnvironment& env, EventRelay* relay,
                                                  std::function<void()> on_finished) {
  std::error_code ec;
  fs::remove_all(env.scratch_dir, ec);
  fs::create_directories(env.scratch_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", env.scratch_dir));
  // The coordinator names a job's folder after the job's random id, and the
  // worker makes it: a symlink already there was planted to lead the job's
  // writes (logs, checkpoints, the export) into someone else's folder.
  // Refused for good, since every attempt would meet the same link.
  if (fs::is_symlink(fs::symlink_status(assignment.output_dir(), ec))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's output folder ", assignment.output_dir(), " is a symbolic link (to ",
        fs::read_symlink(assignment.output_dir(), ec).string(),
        "); a job writes only into a folder its worker made, so the link is refused"));
  }
  fs::create_directories(assignment.output_dir(), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", assignment.output_dir()));
  const std::string spec_path = (fs::path(env.scratch_dir) / "spec.json").string();
  if (absl::Status s = WriteSpecJson(assignment.spec(), spec_path); !s.ok()) return s;

  v1::RankRef ref;
  ref.set_job_id(assignment.job_id());
  ref.set_rank(assignment.rank());
  ref.set_attempt(assignment.attempt());
  std::unique_ptr<Rank> rank(new Rank(ref, absl::Milliseconds(assignment.agent_silence_ms()), env,
                                      relay, std::move(on_finished)));
  Rank* self = rank.get();

  absl::StatusOr<std::unique_ptr<RankSocket>> socket =
      RankSocket::Listen(env.socket_path, [self](const v1::RankMessage& m) { self->OnMessage(m); });
  if (!socket.ok()) return socket.status();
  rank->socket_ = *std::move(socket);

  SpawnOptions spawn;
  spawn.binary = env.train_binary;
  spawn.args = TrainArguments(assignment, spec_path, env.socket_path);
  spawn.args.insert(spawn.args.end(),
                    {"--collective-timeout", absl::StrCat(env.collective_timeout_s)});
  if (env.device_kind == "cuda") {
    spawn.env.emplace_back("CUDA_VISIBLE_DEVICES", absl::StrCat(assignment.device()));
  } else {
    spawn.env.emplace_back("CUDA_VISIBLE_DEVICES", "");
    spawn.env.emplace_back("OMP_NUM_THREADS", absl::StrCat(std::max(1, env.cpu_threads)));
  }
  spawn.log_path =
      (fs::path(assignment.output_dir()) / absl::StrCat("rank-", assignment.rank(), ".log"))
          .string();
  spawn.on_exit = [self](const ProcessExit& exit) { self->OnExit(exit); };
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Spawn(std::move(spawn));
  if (!process.ok()) return process.status();

  // Lets the next run of the worker find this process if this one dies.
  std::ofstream(fs::path(env.scratch_dir) / "pid") << (*process)->pid() << "\n";

  v1::RankEvent started = rank->NewEvent();
  started.mutable_started()->set_pid((*process)->pid());
  relay->Add(std::move(started));
  rank->process_ = *std::move(process);
  {
    absl::MutexLock lock(&rank->mu_);
    rank->started_ = true;
  }
  return rank;
}

Rank::Rank(v1::RankRef ref, absl::Duration agent_silence, RankEnvironment env, EventRelay* relay,
           std::function<void()> on_finished)
    : ref_(std::move(ref)),
      agent_silence_(agent_silence),
      env_(std::move(env)),
      relay_(relay),
      on_finished_(std::move(on_finished)) {}

Rank::~Rank() {
  process_.reset();
  socket_.reset();
  std::error_code ec;
  fs::remove_all(env_.scratch_dir, ec);
}

v1::RankEvent Rank::NewEvent() const {
  v1::RankEvent event;
  event.set_job_id(ref_.job_id());
  event.set_attempt(ref_.attempt());
  event.set_rank(ref_.rank());
  return event;
}

void Rank::Stop(absl::Duration grace, const std::string& reason) {
  if (!process_) return;
  v1::RankControl control;
  control.mutable_cancel()->set_reason(reason);
  if (socket_->Send(control).ok()) {
    process_->KillAfter(grace);
  } else {
    process_->Stop(grace);
  }
}

void Rank::SendKeepalive() {
  v1::RankControl control;
  control.mutable_keepalive();
  // A miss is harmless: the next one follows within a quarter of the limit.
  (void)socket_->Send(control);
}

bool Rank::Finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

void Rank::OnMessage(const v1::RankMessage& message) {
  v1::RankEvent event = NewEvent();
  switch (message.kind_case()) {
    case v1::RankMessage::kTraining:
      // Relayed whole: the worker interprets no training event.
      *event.mutable_training() = message.training();
      break;
    case v1::RankMessage::KIND_NOT_SET:
      return;  // From a newer trainer: a kind this worker does not know.
  }
  relay_->Add(std::move(event));
}

void Rank::OnExit(const ProcessExit& exit) {
  {
    // A rank that dies at once must not report its exit before its start.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&started_));
  }
  // Every message the rank wrote before it died goes out before RankExited.
  socket_->Drain(kDrainTimeout);
  v1::RankEvent event = NewEvent();
  v1::RankExited* exited = event.mutable_exited();
  exited->set_exit_code(exit.exit_code);
  exited->set_stopped(exit.stopped);
  exited->set_stderr_tail(exit.log_tail);
  relay_->Add(std::move(event));
  std::cout << "ballast-worker: rank " << ref_.rank() << " of " << ref_.job_id() << " attempt "
            << ref_.attempt() << " exited with code " << exit.exit_code
            << (exit.stopped ? " (stopped)" : "") << std::endl;
  {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  if (on_finished_) on_finished_();
}

}  // namespace ballast::agent
