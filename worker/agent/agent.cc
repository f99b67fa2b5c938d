#include "worker/agent/agent.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/metrics.h"

namespace ballast::agent {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);
// A stream that lived this long was a working connection: the next
// reconnect starts from the shortest backoff again.
constexpr absl::Duration kHealthyStream = absl::Seconds(5);
// Streams are reopened this often, so that even a silently dead connection
// is noticed; heartbeat failures cut a stream sooner.
constexpr absl::Duration kStreamDeadline = absl::Minutes(10);

constexpr char kSocketDirPrefix[] = "/tmp/ballast-worker-";

// Keepalives go out this many times per rank silence limit, so a late or
// lost one never fences a rank whose worker is fine.
constexpr int kKeepalivesPerSilence = 4;
// How often the keepalive loop looks when no rank asks for keepalives.
constexpr absl::Duration kKeepaliveIdle = absl::Seconds(1);
constexpr absl::Duration kMinKeepalive = absl::Milliseconds(10);

// Socket folders of workers that died without cleaning up (kill -9): their
// pid is gone. A live pid's folder is left alone, whoever owns it now.
void RemoveStaleSocketDirs() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/tmp", ec)) {
    const std::string path = entry.path().string();
    int pid = 0;
    if (path.rfind(kSocketDirPrefix, 0) != 0 ||
        !absl::SimpleAtoi(path.substr(sizeof(kSocketDirPrefix) - 1), &pid) || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

std::string ReadFileTrimmed(const fs::path& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return std::string(absl::StripAsciiWhitespace(text));
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("code ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

}  // namespace

class Agent::TrackedCall {
 public:
  TrackedCall(Agent* agent, grpc::ClientContext* context, absl::Duration timeout)
      : agent_(agent), context_(context) {
    agent_->coordinator_->Prepare(context, timeout);
    absl::MutexLock lock(&agent_->mu_);
    agent_->calls_.insert(context);
    if (agent_->stopping_) context->TryCancel();
  }
  ~TrackedCall() {
    absl::MutexLock lock(&agent_->mu_);
    agent_->calls_.erase(context_);
  }

 private:
  Agent* const agent_;
  grpc::ClientContext* const context_;
};

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      cpu_threads_(std::max<int>(
          1, static_cast<int>(std::thread::hardware_concurrency()) /
                 std::max<int>(1, static_cast<int>(options_.devices.names.size())))) {}

Agent::~Agent() { Shutdown(); }

absl::Status Agent::Start() {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      GrpcChannelCredentials(options_.tls, "--tls-");
  if (!credentials.ok()) return credentials.status();
  std::error_code ec;
  fs::create_directories(fs::path(options_.work_dir) / "ranks", ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create --work-dir ", options_.work_dir, ": ", ec.message()));
  }
  StopOrphanedRanks((fs::path(options_.work_dir) / "ranks").string());
  // Socket paths must fit sun_path (108 bytes), which a deep work dir would
  // not; /tmp keeps them short.
  RemoveStaleSocketDirs();
  socket_dir_ = absl::StrCat(kSocketDirPrefix, getpid());
  fs::remove_all(socket_dir_, ec);
  if (mkdir(socket_dir_.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot create ", socket_dir_));
  }
  coordinator_ = std::make_unique<CoordinatorConnection>(options_.coordinator, options_.token,
                                                         *std::move(credentials));
  EventRelayOptions relay_options;
  relay_options.rpc_timeout = options_.rpc_timeout;
  relay_ = std::make_unique<EventRelay>(coordinator_.get(), relay_options);
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = ReadFileTrimmed(fs::path(options_.work_dir) / "worker-id");
    started_ = true;
  }
  session_ = std::thread([this] { SessionLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  janitor_ = std::thread([this] { JanitorLoop(); });
  keepalive_ = std::thread([this] { KeepaliveLoop(); });
  return absl::OkStatus();
}

void Agent::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    for (grpc::ClientContext* call : calls_) call->TryCancel();
  }
  session_.join();
  heartbeat_.join();
  janitor_.join();
  keepalive_.join();

  // No thread adds ranks any more: stop them all, then wait for their exits
  // so that each RankExited is queued before the last flush.
  std::map<RankKey, std::unique_ptr<Rank>> ranks;
  {
    absl::MutexLock lock(&mu_);
    ranks.swap(ranks_);
  }
  for (auto& [key, rank] : ranks)
    rank->Stop(options_.shutdown_grace, "the worker is shutting down");
  const absl::Time deadline = absl::Now() + options_.shutdown_grace + absl::Seconds(3);
  for (auto& [key, rank] : ranks) {
    while (!rank->Finished() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }
  ranks.clear();
  if (absl::Status s = relay_->Flush(absl::Now() + options_.shutdown_flush); !s.ok()) {
    std::cerr << "ballast-worker: exiting with events undelivered: " << s.message() << "\n";
  }
  relay_.reset();
  std::error_code ec;
  fs::remove_all(socket_dir_, ec);
}

bool Agent::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &Agent::Stopping), d);
  return !stopping_;
}

// ---- Registration ----------------------------------------------------------

absl::Status Agent::RegisterOnce() {
  v1::RegisterWorkerRequest request;
  request.set_host(options_.host);
  request.set_device_kind(options_.devices.kind);
  request.set_capacity(static_cast<int32_t>(options_.devices.names.size()));
  for (const std::string& name : options_.devices.names) request.add_device_names(name);
  std::string previous;
  {
    absl::MutexLock lock(&mu_);
    previous = worker_id_;
    request.set_previous_worker_id(previous);
    for (const v1::RankRef& ref : RunningLocked()) *request.add_running() = ref;
  }
  grpc::ClientContext context;
  v1::RegisterWorkerResponse response;
  grpc::Status status;
  const auto sent = std::chrono::steady_clock::now();
  const std::string coordinator = coordinator_->address();
  {
    TrackedCall call(this, &context, options_.rpc_timeout);
    // Waits (within the deadline) for a coordinator that is coming back,
    // rather than failing at once while the channel reconnects; with
    // several, the next one is tried instead.
    context.set_wait_for_ready(!coordinator_->several());
    status = coordinator_->stub()->RegisterWorker(&context, request, &response);
  }
  if (!status.ok()) {
    coordinator_->Failed(context, status);
    return absl::UnavailableError(
        absl::StrCat("RegisterWorker at ", coordinator, " failed (", Describe(status), ")"));
  }
  if (response.worker_id().empty()) {
    return absl::UnavailableError("RegisterWorker answered without a worker_id");
  }
  SaveWorkerId(response.worker_id());
  relay_->SetWorkerId(response.worker_id());
  RenewLease(sent, response.lease_ms());
  const absl::Duration interval =
      response.heartbeat_interval_ms() > 0 ? absl::Milliseconds(response.heartbeat_interval_ms())
      : response.lease_ms() > 0            ? absl::Milliseconds(response.lease_ms() / 3)
                                           : absl::Seconds(5);
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    heartbeat_interval_ = interval;
    epoch = ++epoch_;
  }
  std::cout << "ballast-worker: registered as " << response.worker_id() << " with " << coordinator
            << " (" << options_.devices.names.size() << " " << options_.devices.kind
            << " devices: " << absl::StrJoin(options_.devices.names, ", ") << "; "
            << request.running_size() << " running ranks"
            << (previous.empty() ? "" : absl::StrCat("; previous id ", previous))
            << (epoch > 1 ? "; re-registration" : "") << ")" << std::endl;
  return absl::OkStatus();
}

bool Agent::RegisterUntilDone() {
  absl::Duration backoff = kMinBackoff;
  std::string last_error;
  for (;;) {
    absl::Status s = RegisterOnce();
    if (s.ok()) return true;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return false;  // The failure is our own cancellation.
    }
    // One line per kind of error: a coordinator that is down for an hour
    // does not fill the log.
    const std::string error(s.message());
    if (error.substr(0, 60) != last_error.substr(0, 60)) {
      std::cerr << "ballast-worker: " << error << "; retrying\n";
    }
    last_error = error;
    if (!SleepFor(backoff)) return false;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

void Agent::Reregister(int64_t seen_epoch) {
  absl::MutexLock registering(&register_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (epoch_ != seen_epoch || stopping_) return;  // Someone registered meanwhile.
  }
  if (!RegisterUntilDone()) return;
  // The open stream still runs under the old registration.
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr) stream_->TryCancel();
}

void Agent::SaveWorkerId(const std::string& id) const {
  const fs::path path = fs::path(options_.work_dir) / "worker-id";
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << id << "\n";
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) std::cerr << "ballast-worker: cannot write " << path << ": " << ec.message() << "\n";
}

// ---- Threads ---------------------------------------------------------------

void Agent::SessionLoop() {
  {
    absl::MutexLock registering(&register_mu_);
    if (!RegisterUntilDone()) return;
  }
  absl::Duration backoff = kMinBackoff;
  for (;;) {
    grpc::ClientContext context;
    v1::StreamAssignmentsRequest request;
    int64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      request.set_worker_id(worker_id_);
      epoch = epoch_;
    }
    const absl::Time opened = absl::Now();
    bool delivered = false;
    grpc::Status status;
    {
      TrackedCall call(this, &context, kStreamDeadline);
      {
        absl::MutexLock lock(&mu_);
        stream_ = &context;
      }
      std::unique_ptr<grpc::ClientReaderInterface<v1::Assignment>> reader =
          coordinator_->stub()->StreamAssignments(&context, request);
      v1::Assignment assignment;
      while (reader->Read(&assignment)) {
        delivered = true;
        Handle(assignment);
      }
      status = reader->Finish();
      absl::MutexLock lock(&mu_);
      stream_ = nullptr;
    }
    if (!status.ok()) coordinator_->Failed(context, status);
    if (delivered || absl::Now() - opened >= kHealthyStream) backoff = kMinBackoff;
    if (!SleepFor(backoff)) return;
    backoff = std::min(backoff * 2, kMaxBackoff);
    // A coordinator that restarted or forgot this worker needs it to register
    // again (with its running ranks) before it hands out work.
    const grpc::StatusCode code = status.error_code();
    if (code != grpc::StatusCode::DEADLINE_EXCEEDED && code != grpc::StatusCode::CANCELLED) {
      std::cerr << "ballast-worker: assignment stream ended (" << Describe(status)
                << "); registering again\n";
      Reregister(epoch);
    }
  }
}

void Agent::HeartbeatLoop() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Agent::StoppingOrRegistered));
  }
  for (;;) {
    v1::HeartbeatRequest request;
    absl::Duration interval;
    int64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
    }
    if (!SleepFor(interval)) return;
    {
      absl::MutexLock lock(&mu_);
      request.set_worker_id(worker_id_);
      for (const v1::RankRef& ref : RunningLocked()) *request.add_running() = ref;
      epoch = epoch_;
    }
    grpc::ClientContext context;
    v1::HeartbeatResponse response;
    grpc::Status status;
    const auto sent = std::chrono::steady_clock::now();
    {
      TrackedCall call(this, &context, std::min(interval, options_.rpc_timeout));
      status = coordinator_->stub()->Heartbeat(&context, request, &response);
    }
    if (status.ok()) {
      RenewLease(sent, response.lease_ms());
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      std::cerr << "ballast-worker: the coordinator does not know " << request.worker_id()
                << "; registering again\n";
      Reregister(epoch);
    } else if (!status.ok()) {
      // The stream may be stuck on a dead connection; cutting it makes the
      // session loop reconnect and register again (with the leader, when
      // this coordinator is not it).
      coordinator_->Failed(context, status);
      absl::MutexLock lock(&mu_);
      if (stream_ != nullptr) stream_->TryCancel();
    }
  }
}

void Agent::JanitorLoop() {
  for (;;) {
    std::vector<std::unique_ptr<Rank>> done;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Agent::StoppingOrFinished));
      if (stopping_) return;
      finished_pending_ = 0;
      for (auto it = ranks_.begin(); it != ranks_.end();) {
        if (it->second->Finished()) {
          done.push_back(std::move(it->second));
          it = ranks_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Destroyed outside the lock: a Rank's destructor joins threads whose
    // exit callback takes mu_.
    done.clear();
  }
}

void Agent::RenewLease(std::chrono::steady_clock::time_point sent, int64_t lease_ms) {
  absl::MutexLock lock(&mu_);
  // The coordinator started the lease when the call arrived, after `sent`.
  lease_until_ = std::max(lease_until_, sent + std::chrono::milliseconds(lease_ms));
}

void Agent::KeepaliveLoop() {
  bool lapsed = false;
  for (;;) {
    absl::Duration period = kKeepaliveIdle;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      const bool fresh = std::chrono::steady_clock::now() < lease_until_;
      // Stopped once per lapse: the coordinator will requeue these jobs
      // elsewhere, so the ranks end at a step boundary now rather than at
      // their silence limit.
      const bool stop = !fresh && !lapsed;
      lapsed = !fresh;
      for (auto& [key, rank] : ranks_) {
        if (rank->Finished()) continue;
        if (rank->agent_silence() > absl::ZeroDuration()) {
          period = std::min(period, rank->agent_silence() / kKeepalivesPerSilence);
        }
        if (fresh) {
          rank->SendKeepalive();
        } else if (stop && rank->agent_silence() > absl::ZeroDuration()) {
          std::cerr << "ballast-worker: lease lapsed (no heartbeat accepted for a lease); "
                    << "stopping rank " << rank->ref().rank() << " of " << rank->ref().job_id()
                    << "\n";
          rank->Stop(rank->agent_silence(), "the worker lost its lease");
        }
      }
    }
    if (!SleepFor(std::max(period, kMinKeepalive))) return;
  }
}

// ---- Assignments -----------------------------------------------------------

std::vector<prometheus::MetricFamily> Agent::Collect() const {
  double running;
  {
    absl::MutexLock lock(&mu_);
    running = static_cast<double>(RunningLocked().size());
  }
  const auto devices = static_cast<double>(options_.devices.names.size());
  const std::string& kind = options_.devices.kind;
  std::vector<prometheus::MetricFamily> families(2);
  prometheus::MetricFamily& ranks = families[0];
  ranks = {"ballast_node_ranks_running",
           "Ranks this worker runs now.",
           prometheus::MetricType::Gauge,
           {}};
  AddSample(&ranks, {}, running);
  prometheus::MetricFamily& states = families[1];
  states = {"ballast_node_devices",
            "This worker's devices: busy (a running rank holds it) or free.",
            prometheus::MetricType::Gauge,
            {}};
  AddSample(&states, {{"kind", kind}, {"state", "busy"}}, running);
  AddSample(&states, {{"kind", kind}, {"state", "free"}}, std::max(0.0, devices - running));
  return families;
}

absl::Status Agent::Health() const {
  absl::MutexLock lock(&mu_);
  if (worker_id_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("not registered with the coordinator at ", coordinator_->address(), " yet"));
  }
  return absl::OkStatus();
}

std::vector<v1::RankRef> Agent::RunningLocked() const {
  std::vector<v1::RankRef> running;
  for (const auto& [key, rank] : ranks_) {
    if (!rank->Finished()) running.push_back(rank->ref());
  }
  return running;
}

void Agent::Handle(const v1::Assignment& assignment) {
  switch (assignment.action()) {
    case v1::Assignment::ACTION_START:
      StartRank(assignment);
      break;
    case v1::Assignment::ACTION_STOP:
      StopRanks(assignment);
      break;
    default:
      std::cerr << "ballast-worker: ignoring an assignment with action "
                << static_cast<int>(assignment.action()) << " for job " << assignment.job_id()
                << "\n";
  }
}

void Agent::StartRank(const v1::Assignment& a) {
  const RankKey key{a.job_id(), a.attempt(), a.rank()};
  RankEnvironment env;
  {
    absl::MutexLock lock(&mu_);
    // A repeat (the coordinator resends after a reconnect) is not a second rank.
    if (stopping_ || ranks_.count(key) > 0) return;
    env.socket_path = absl::StrCat(socket_dir_, "/", next_socket_++, ".sock");
  }
  env.train_binary = options_.train_binary;
  env.device_kind = options_.devices.kind;
  env.cpu_threads = cpu_threads_;
  env.collective_timeout_s = options_.collective_timeout_s;
  env.scratch_dir = (fs::path(options_.work_dir) / "ranks" /
                     absl::StrCat(a.job_id(), "-a", a.attempt(), "-r", a.rank()))
                        .string();
  absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Start(a, env, relay_.get(), [this] {
    absl::MutexLock lock(&mu_);
    ++finished_pending_;
  });
  if (!rank.ok()) {
    ReportStartFailure(a, rank.status());
    return;
  }
  std::cout << "ballast-worker: started rank " << a.rank() << " of " << a.job_id() << " attempt "
            << a.attempt() << " (pid " << (*rank)->pid() << ")" << std::endl;
  absl::MutexLock lock(&mu_);
  ranks_[key] = *std::move(rank);
}

void Agent::StopRanks(const v1::Assignment& a) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, rank] : ranks_) {
    const auto& [job, attempt, r] = key;
    // Attempt 0 stops every attempt of that rank.
    if (job == a.job_id() && r == a.rank() && (a.attempt() == 0 || attempt == a.attempt())) {
      rank->Stop(absl::Milliseconds(std::max<int64_t>(0, a.grace_ms())),
                 absl::StrCat("stop assignment from the coordinator (attempt ", attempt, ")"));
    }
  }
}

void Agent::ReportStartFailure(const v1::Assignment& a, const absl::Status& error) {
  std::cerr << "ballast-worker: cannot start rank " << a.rank() << " of " << a.job_id() << ": "
            << error.message() << "\n";
  v1::RankEvent event;
  event.set_job_id(a.job_id());
  event.set_attempt(a.attempt());
  event.set_rank(a.rank());
  v1::RankExited* exited = event.mutable_exited();
  // 127: what a shell reports for a command it could not run; restartable,
  // since another worker may manage. 2, as ballast-train exits for a bad
  // input, when the job itself is at fault (a planted output folder link).
  exited->set_exit_code(absl::IsInvalidArgument(error) ? 2 : 127);
  exited->set_stderr_tail(SanitizeUtf8(absl::StrCat("ballast-worker: ", error.message())));
  relay_->Add(std::move(event));
}

}  // namespace ballast::agent
