#include "worker/train/collectives/process_group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef BALLAST_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/train/collectives/step_phase.h"

namespace ballast::train {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Every rank bumps its heartbeat key on the store this often, from a thread
// of its own, so that a rank blocked in a collective or busy computing still
// shows as alive; after a failure a rank whose heartbeat stood still for
// kLostAfter, and that did not report the failure itself, is lost.
constexpr milliseconds kHeartbeatEvery{500};
constexpr milliseconds kLostAfter{2500};
// Survivors notice a failure within about a second of each other (Gloo
// reports a closed connection at once, and each peer's exit closes more).
constexpr milliseconds kPeersNameLostWithin{3 * kLostAfter};

std::string Address(const Rendezvous& r) { return absl::StrCat(r.master_addr, ":", r.master_port); }

std::string Seconds(Clock::duration d) {
  return absl::StrCat(std::chrono::duration_cast<milliseconds>(d).count() / 1000.0, " s");
}

std::string WhatOf(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// The local address this host uses to reach `host`: Gloo listens there, so
// that peers on other hosts can connect to it (the hostname may resolve to
// 127.0.1.1 on Debian). A UDP connect sends nothing.
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve --master-addr ", host));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  freeaddrinfo(found);
  if (fd >= 0) close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("no route to --master-addr ", host));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return std::string(text);
}

class ProcessGroupCollectives;

class WorkInFlight : public InFlight {
 public:
  WorkInFlight(ProcessGroupCollectives* owner, absl::string_view name, int64_t seq,
               c10::intrusive_ptr<c10d::Work> work)
      : owner_(owner), name_(name), seq_(seq), work_(std::move(work)) {}
  void Wait() override;

 private:
  ProcessGroupCollectives* owner_;
  absl::string_view name_;
  int64_t seq_;
  c10::intrusive_ptr<c10d::Work> work_;
};

// A reduce-scatter over Gloo's all-to-all: once every rank's chunk for this
// rank has arrived, `shard` is their sum, added in rank order so that every
// shard is summed alike at any world size (for two ranks, the bits of
// Gloo's allreduce: a + b = b + a).
class ChunksInFlight : public InFlight {
 public:
  ChunksInFlight(ProcessGroupCollectives* owner, int64_t seq, c10::intrusive_ptr<c10d::Work> work,
                 at::Tensor shard, at::Tensor chunks)
      : arrival_(owner, "reduce_scatter", seq, std::move(work)),
        shard_(std::move(shard)),
        chunks_(std::move(chunks)) {}
  void Wait() override {
    arrival_.Wait();
    const int64_t n = shard_.numel();
    shard_.copy_(chunks_.narrow(0, 0, n));
    for (int64_t from = n; from < chunks_.numel(); from += n) {
      shard_.add_(chunks_.narrow(0, from, n));
    }
    chunks_ = at::Tensor();
  }

 private:
  WorkInFlight arrival_;
  at::Tensor shard_;
  at::Tensor chunks_;
};

// The collectives of one c10d group: the world's, or a hybrid job's shard or
// replica group. Waits go through the world's ProcessGroupCollectives, whose
// heartbeat watches every rank whichever group it waits in, and whose
// failures name the lost ranks by their world rank.
class GroupCollectives : public Collectives {
 public:
  GroupCollectives(ProcessGroupCollectives* world, c10::intrusive_ptr<c10d::Backend> group,
                   int rank, int size, c10::Device device)
      : world_(world), group_(std::move(group)), rank_(rank), size_(size), device_(device) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  void SumInPlace(at::Tensor& values) override;
  int64_t Max(int64_t value) override;
  std::unique_ptr<InFlight> AllGather(at::Tensor full, at::Tensor shard) override;
  std::unique_ptr<InFlight> ReduceScatter(at::Tensor shard, at::Tensor full) override;
  void AllToAll(at::Tensor output, at::Tensor input, const std::vector<int64_t>& recv_rows,
                const std::vector<int64_t>& send_rows) override;
  void Barrier() override;
  int64_t communicated_bytes() const override { return sent_; }
  void FenceIfStalled() override;

 private:
  // Bytes this rank sends in a ring algorithm that passes `passes` times over
  // `t`: (N - 1) / N of it per pass. The reduce-scatter's all-to-all sends
  // the same as a ring's one pass.
  int64_t RingBytes(const at::Tensor& t, int passes) const {
    return passes * static_cast<int64_t>(t.nbytes()) * (size_ - 1) / size_;
  }

  ProcessGroupCollectives* const world_;
  const c10::intrusive_ptr<c10d::Backend> group_;
  const int rank_;
  const int size_;
  const c10::Device device_;
  int64_t sent_ = 0;
};

class ProcessGroupCollectives : public Collectives {
 public:
  // `shards` and `replicas`: a hybrid job's groups (Rendezvous::shard_group),
  // or null.
  ProcessGroupCollectives(Rendezvous rendezvous, c10::intrusive_ptr<c10d::Store> store,
                          c10::intrusive_ptr<c10d::Backend> group,
                          c10::intrusive_ptr<c10d::Backend> shards,
                          c10::intrusive_ptr<c10d::Backend> replicas)
      : r_(std::move(rendezvous)),
        store_(std::move(store)),
        all_(this, std::move(group), r_.rank, r_.world_size, r_.device),
        shards_(shards ? std::make_unique<GroupCollectives>(this, std::move(shards),
                                                            r_.rank % r_.shard_group,
                                                            r_.shard_group, r_.device)
                       : nullptr),
        replicas_(replicas ? std::make_unique<GroupCollectives>(
                                 this, std::move(replicas), r_.rank / r_.shard_group,
                                 r_.world_size / r_.shard_group, r_.device)
                           : nullptr),
        last_beat_(Clock::now().time_since_epoch().count()),
        heartbeat_([this] { Heartbeat(); }),
        watchdog_([this] { Watch(); }) {}

  ~ProcessGroupCollectives() override {
    // A rank that ends normally is no longer watched: rank 0 may still be
    // exporting, for longer than the collective timeout.
    try {
      store_->set(absl::StrCat("departed/", r_.rank), "1");
    } catch (const std::exception&) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    stop_.notify_all();
    heartbeat_.join();
    watchdog_.join();
  }

  int rank() const override { return r_.rank; }
  int world_size() const override { return r_.world_size; }
  void SumInPlace(at::Tensor& values) override { all_.SumInPlace(values); }
  int64_t Max(int64_t value) override { return all_.Max(value); }
  std::unique_ptr<InFlight> AllGather(at::Tensor full, at::Tensor shard) override {
    return all_.AllGather(std::move(full), std::move(shard));
  }
  std::unique_ptr<InFlight> ReduceScatter(at::Tensor shard, at::Tensor full) override {
    return all_.ReduceScatter(std::move(shard), std::move(full));
  }
  void AllToAll(at::Tensor output, at::Tensor input, const std::vector<int64_t>& recv_rows,
                const std::vector<int64_t>& send_rows) override {
    all_.AllToAll(std::move(output), std::move(input), recv_rows, send_rows);
  }
  void Barrier() override { all_.Barrier(); }

  int64_t communicated_bytes() const override {
    return all_.communicated_bytes() + (shards_ ? shards_->communicated_bytes() : 0) +
           replica_communicated_bytes();
  }
  int64_t replica_communicated_bytes() const override {
    return replicas_ ? replicas_->communicated_bytes() : 0;
  }
  Collectives& shard_group() override {
    if (shards_) return *shards_;
    return *this;
  }
  Collectives* replica_group() override { return replicas_.get(); }

  // The number of the next collective issued in any group, for the rank's
  // StepPhase.
  int64_t NextSeq() { return ++issued_; }

  // Once rank 0 has ended (its store is gone) nobody waits for this rank:
  // its last writes, if any, are its own business.
  void FenceIfStalled() override {
    if (store_gone_.load()) return;
    const Clock::duration silent = Clock::now() - LastBeat();
    if (silent > r_.collective_timeout) Stalled(silent);
  }

  // Waits for `work`; a failure becomes an error that names the lost ranks.
  // On a GPU the wait is the current stream's, not the host's: NCCL's wait
  // with a timeout would block the host until the data arrived, and the
  // group's watchdog already bounds every collective by the timeout and
  // ends the process when one overruns it. The rank's StepPhase is inside
  // collective `name` number `seq` meanwhile.
  void Wait(absl::string_view name, int64_t seq, const c10::intrusive_ptr<c10d::Work>& work) {
    StepPhase& phase = StepPhase::OfThisRank();
    const StepPhase::Snapshot left = phase.EnterCollective(name, seq);
    absl::Cleanup leave = [&] { phase.LeaveCollective(left); };
    try {
      if (r_.device.is_cuda()) {
        work->wait();
        return;
      }
      work->wait(r_.timeout);
    } catch (const std::exception& e) {
      // A stopped rank's collective fails once it runs again: its peers left.
      FenceIfStalled();
      if (failing_.exchange(true)) Hang();  // the heartbeat thread is ending the process
      throw std::runtime_error(Diagnosis(WhatOf(e)));
    }
  }

 private:
  std::string Diagnosis(const std::string& what) {
    return absl::StrCat("rank ", r_.rank, " of ", r_.world_size, ": a collective failed; ",
                        LostRanks(), " (", what, ")");
  }

  [[noreturn]] static void Hang() {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }

  Clock::time_point LastBeat() const {
    return Clock::time_point(Clock::duration(last_beat_.load()));
  }

  [[noreturn]] void Stalled(Clock::duration silent) {
    const std::string why = absl::StrCat(
        "rank ", r_.rank, " of ", r_.world_size, " went ", Seconds(silent),
        " without a heartbeat, past the collective timeout of ", Seconds(r_.collective_timeout),
        ": it was stopped or cut off, and its peers count it lost");
    if (r_.on_stalled) r_.on_stalled(why);
    _exit(1);
  }

  // Beats, and watches for a failure another rank reported: this rank's own
  // collective may be waiting on a peer that is alive (in its own roll
  // call) and would not fail before that peer exits. Then this thread ends
  // the process with the diagnosis, as ballast-train's main() would (exit 1,
  // restartable); the training thread is blocked in the collective anyway.
  // Rank 0 also watches its peers' heartbeats, and ends the same way when
  // one stood still for the collective timeout.
  void Heartbeat() {
    const std::string key = absl::StrCat("heartbeat/", r_.rank);
    std::vector<std::string> seen(r_.world_size);
    std::vector<Clock::time_point> changed(r_.world_size, Clock::now());
    for (int64_t beat = 0;; ++beat) {
      bool peer_failed = false;
      int still = -1;
      try {
        store_->set(key, std::to_string(beat));
        peer_failed = store_->check({"failure"});
        if (r_.rank == 0 && !peer_failed) still = StillPeer(&seen, &changed);
      } catch (const std::exception&) {
        FenceIfStalled();
        store_gone_ = true;  // rank 0 ended, normally or not; Gloo tells the training thread
        return;
      }
      // Before anything is made of what the store said: this rank may be
      // the one that did not run.
      FenceIfStalled();
      last_beat_ = Clock::now().time_since_epoch().count();
      if (peer_failed && !failing_.exchange(true)) {
        std::cerr << "ballast-train: " << Diagnosis("a peer's collective failed") << std::endl;
        _exit(1);
      }
      if (still >= 0 && !failing_.exchange(true)) {
        std::cerr << "ballast-train: "
                  << Diagnosis(absl::StrCat("rank ", still, " sent no heartbeat for ",
                                            Seconds(r_.collective_timeout)))
                  << std::endl;
        _exit(1);
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_.wait_for(lock, kHeartbeatEvery, [this] { return stopping_; })) return;
    }
  }

  // Rank 0: the first peer whose heartbeat has not changed for the
  // collective timeout, leaving out those that ended normally; -1 if none.
  // `seen` and `changed` hold each peer's last beat and when it was read.
  int StillPeer(std::vector<std::string>* seen, std::vector<Clock::time_point>* changed) {
    const Clock::time_point now = Clock::now();
    for (int k = 1; k < r_.world_size; ++k) {
      const std::string key = absl::StrCat("heartbeat/", k);
      const std::vector<uint8_t> v =
          store_->check({key}) ? store_->get(key) : std::vector<uint8_t>();
      std::string beat(v.begin(), v.end());
      if (beat != (*seen)[k]) {
        (*seen)[k] = std::move(beat);
        (*changed)[k] = now;
      } else if (now - (*changed)[k] > r_.collective_timeout &&
                 !store_->check({absl::StrCat("departed/", k)})) {
        return k;
      }
    }
    return -1;
  }

  // The heartbeat seen from outside: a store call to a stopped rank 0 never
  // returns, so a heartbeat stuck past the collective timeout means rank 0
  // is lost, unless this thread did not run either (this process was the
  // one stopped).
  void Watch() {
    Clock::time_point looked = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_.wait_for(lock, kHeartbeatEvery, [this] { return stopping_; })) {
      if (store_gone_.load()) return;
      const Clock::time_point now = Clock::now();
      const Clock::duration silent = now - LastBeat();
      if (silent > r_.collective_timeout) {
        if (now - looked > r_.collective_timeout / 2) Stalled(silent);
        std::cerr << "ballast-train: rank " << r_.rank << " of " << r_.world_size
                  << ": lost rank 0 (its store at " << Address(r_)
                  << " has not answered a heartbeat for " << Seconds(silent)
                  << ", past the collective timeout of " << Seconds(r_.collective_timeout) << ")"
                  << std::endl;
        _exit(1);
      }
      looked = now;
    }
  }

  // The ranks whose heartbeat stands still, leaving out those that said they
  // saw the failure too (they may have exited on it since).
  std::string LostRanks() {
    try {
      store_->set(absl::StrCat("saw_failure/", r_.rank), "1");
      store_->set("failure", "1");
      auto beats = [&] {
        std::vector<std::string> out;
        for (int k = 0; k < r_.world_size; ++k) {
          const std::string key = absl::StrCat("heartbeat/", k);
          const std::vector<uint8_t> v =
              store_->check({key}) ? store_->get(key) : std::vector<uint8_t>();
          out.emplace_back(v.begin(), v.end());
        }
        return out;
      };
      const std::vector<std::string> before = beats();
      std::this_thread::sleep_for(kLostAfter);
      const std::vector<std::string> after = beats();
      std::vector<int> lost;
      for (int k = 0; k < r_.world_size; ++k) {
        if (k != r_.rank && before[k] == after[k] &&
            !store_->check({absl::StrCat("saw_failure/", k)})) {
          lost.push_back(k);
        }
      }
      store_->set(absl::StrCat("named_lost/", r_.rank), "1");
      if (r_.rank == 0) KeepStoreForPeers(lost);
      if (lost.empty()) return "every rank is still alive; a peer hung or the network broke";
      return absl::StrCat("lost rank", lost.size() > 1 ? "s " : " ", absl::StrJoin(lost, ", "));
    } catch (const std::exception&) {
      return absl::StrCat("lost rank 0 (its store at ", Address(r_), " is gone)");
    }
  }

  // The store lives in rank 0: it stays until every surviving peer has named
  // the lost ranks too (or kPeersNameLostWithin passes), so that none of them
  // sees the store vanish and blames rank 0 instead.
  void KeepStoreForPeers(const std::vector<int>& lost) {
    const auto deadline = std::chrono::steady_clock::now() + kPeersNameLostWithin;
    for (int k = 1; k < r_.world_size; ++k) {
      if (std::find(lost.begin(), lost.end(), k) != lost.end()) continue;
      const std::string key = absl::StrCat("named_lost/", k);
      while (!store_->check({key}) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
  }

  const Rendezvous r_;
  c10::intrusive_ptr<c10d::Store> store_;
  GroupCollectives all_;
  std::unique_ptr<GroupCollectives> shards_;    // hybrid sharding only
  std::unique_ptr<GroupCollectives> replicas_;  // hybrid sharding only
  // Collectives issued, numbering each for the rank's StepPhase.
  int64_t issued_ = 0;
  std::mutex mu_;
  std::condition_variable stop_;
  bool stopping_ = false;  // guarded by mu_
  // Set by whichever thread first handles a failure: the training thread's
  // collective, or the heartbeat thread on another rank's report.
  std::atomic<bool> failing_{false};
  // Set by the heartbeat thread when the store went away under it.
  std::atomic<bool> store_gone_{false};
  // When the heartbeat last went round (set, then check for a failure), as
  // a steady_clock count.
  std::atomic<Clock::rep> last_beat_;
  // Last: they start once the rest is built.
  std::thread heartbeat_;
  std::thread watchdog_;
};

void WorkInFlight::Wait() { owner_->Wait(name_, seq_, work_); }

void GroupCollectives::SumInPlace(at::Tensor& values) {
  std::vector<at::Tensor> tensors = {values};
  world_->Wait("all_reduce", world_->NextSeq(), group_->allreduce(tensors));
  sent_ += RingBytes(values, 2);
}

int64_t GroupCollectives::Max(int64_t value) {
  std::vector<at::Tensor> tensors = {
      at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(device_))};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  world_->Wait("all_reduce", world_->NextSeq(), group_->allreduce(tensors, options));
  sent_ += RingBytes(tensors[0], 2);
  return tensors[0].item<int64_t>();
}

std::unique_ptr<InFlight> GroupCollectives::AllGather(at::Tensor full, at::Tensor shard) {
  sent_ += RingBytes(full, 1);
  return std::make_unique<WorkInFlight>(world_, "all_gather", world_->NextSeq(),
                                        group_->_allgather_base(full, shard));
}

std::unique_ptr<InFlight> GroupCollectives::ReduceScatter(at::Tensor shard, at::Tensor full) {
  sent_ += RingBytes(full, 1);
  if (device_.is_cuda() && full.scalar_type() == shard.scalar_type()) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<WorkInFlight>(world_, "reduce_scatter", world_->NextSeq(),
                                          group_->_reduce_scatter_base(shard, full, options));
  }
  // Gloo reduce-scatters as an allreduce of `full` and a slice
  // (pytorch/pytorch#118911), twice the traffic. Its all-to-all instead
  // sends each peer that peer's chunk of `full` and nothing else: the
  // (N - 1) / N of a ring reduce-scatter, on c10d's own threads. The
  // chunks are added on Wait(), in fp32 whatever they were sent in, which
  // is also how bf16 chunks are summed in fp32 on NCCL.
  at::Tensor chunks = at::empty_like(full);
  std::vector<int64_t> equal_split;
  return std::make_unique<ChunksInFlight>(
      world_, world_->NextSeq(), group_->alltoall_base(chunks, full, equal_split, equal_split),
      std::move(shard), std::move(chunks));
}

void GroupCollectives::AllToAll(at::Tensor output, at::Tensor input,
                                const std::vector<int64_t>& recv_rows,
                                const std::vector<int64_t>& send_rows) {
  TORCH_CHECK(
      static_cast<int>(recv_rows.size()) == size_ && static_cast<int>(send_rows.size()) == size_,
      "AllToAll: ", send_rows.size(), " and ", recv_rows.size(), " row counts for ", size_,
      " ranks");
  // What leaves this rank: every row but those it keeps.
  const int64_t row_bytes = input.dim() == 0 || input.size(0) == 0
                                ? 0
                                : static_cast<int64_t>(input.nbytes()) / input.size(0);
  sent_ += (input.size(0) - send_rows[rank_]) * row_bytes;
  std::vector<int64_t> recv(recv_rows), send(send_rows);
  world_->Wait("all_to_all", world_->NextSeq(), group_->alltoall_base(output, input, recv, send));
}

void GroupCollectives::Barrier() {
  c10d::BarrierOptions options;
  // NCCL's barrier is an allreduce on a device, which it would otherwise guess.
  if (device_.is_cuda()) options.device_ids = {device_.index()};
  world_->Wait("barrier", world_->NextSeq(), group_->barrier(options));
}

void GroupCollectives::FenceIfStalled() { world_->FenceIfStalled(); }

}  // namespace

std::unique_ptr<InFlight> SingleRank::AllGather(at::Tensor full, at::Tensor shard) {
  full.copy_(shard);
  return nullptr;
}

std::unique_ptr<InFlight> SingleRank::ReduceScatter(at::Tensor shard, at::Tensor full) {
  shard.copy_(full);
  return nullptr;
}

void SingleRank::AllToAll(at::Tensor output, at::Tensor input, const std::vector<int64_t>&,
                          const std::vector<int64_t>&) {
  output.copy_(input);
}

namespace {

// A c10d group of `size` ranks over `store`, this rank being `rank` of it:
// NCCL on a GPU, Gloo (listening on `local`) on the CPU. Throws when the
// peers do not all arrive within r.timeout.
c10::intrusive_ptr<c10d::Backend> ConnectGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size, const Rendezvous& r,
                                               const std::string& local) {
#ifdef BALLAST_WITH_CUDA
  if (r.device.is_cuda()) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = r.timeout;
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
    // NCCL connects lazily, on the first collective; one now makes a
    // missing or broken peer fail the rendezvous, as Gloo's mesh does.
    std::vector<at::Tensor> probe = {
        at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(r.device))};
    group->allreduce(probe)->wait();
    return group;
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(r.timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> ConnectProcessGroup(const Rendezvous& r) {
  const std::string who = absl::StrCat("rank ", r.rank, " of ", r.world_size);
  if (r.shard_group < 0 || (r.shard_group > 0 && r.world_size % r.shard_group != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": sharding.shard_group ", r.shard_group,
                     " does not divide the world size; allowed: a divisor of ", r.world_size));
  }
  const std::string seconds = Seconds(r.timeout);
  absl::StatusOr<std::string> local = LocalAddressTowards(r.master_addr, r.master_port);
  if (!local.ok()) {
    return absl::Status(local.status().code(), absl::StrCat(who, ": ", local.status().message()));
  }

  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(r.master_port);
    options.isServer = r.rank == 0;
    options.waitWorkers = false;
    // A client retries its connect for about twice the store's timeout.
    options.timeout = r.timeout / 2;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(r.master_addr, options);
    tcp->setTimeout(r.timeout);
    store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("attempt-", r.attempt, "/"), tcp);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat(who, ": cannot ", r.rank == 0 ? "open" : "reach", " the rendezvous store at ",
                     Address(r), " within ", seconds, " (", WhatOf(e), ")"));
  }

  try {
    if (r.rank == 0) store->set("world_size", std::to_string(r.world_size));
    const std::vector<uint8_t> got = store->get("world_size");
    const std::string theirs(got.begin(), got.end());
    if (theirs != std::to_string(r.world_size)) {
      // The ranks of one job are started with one world size, so the store
      // is another job's, whose rank 0 took the same port: UNAVAILABLE (exit
      // 1), and the next attempt gets another port. Not the spec's fault.
      return absl::UnavailableError(absl::StrCat(who, " was started with world size ", r.world_size,
                                                 ", but the store at ", Address(r), " says ",
                                                 theirs, ": another job's rank 0 holds this port"));
    }
    // One backend for the whole group: NCCL on GPUs or Gloo on CPUs, never
    // a mix, which would hang in the first collective.
    const std::string kind = r.device.is_cuda() ? "cuda" : "cpu";
    if (r.rank == 0) store->set("device", kind);
    const std::vector<uint8_t> got_kind = store->get("device");
    const std::string theirs_kind(got_kind.begin(), got_kind.end());
    if (theirs_kind != kind) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " computes on ", kind, ", but rank 0 on ", theirs_kind,
          ": every rank of a job needs the same device kind (give each rank a GPU, or set "
          "device: cpu)"));
    }
    store->add("arrived", 1);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(who, ": rank 0 did not open the job at ",
                                                    Address(r), " within ", seconds, " (",
                                                    WhatOf(e), ")"));
  }

#ifndef BALLAST_WITH_CUDA
  if (r.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": device cuda needs NCCL, and this build has no CUDA"));
  }
#endif
  try {
    c10::intrusive_ptr<c10d::Backend> group = ConnectGroup(store, r.rank, r.world_size, r, *local);
    // Hybrid sharding: this rank's shard group (the G consecutive ranks of
    // its replica), then its replica group (the ranks with its shard rank in
    // every replica), each over keys of its own. Every rank connects them in
    // this order, so no group waits on a rank still connecting another.
    c10::intrusive_ptr<c10d::Backend> shards, replicas;
    if (r.shard_group > 0 && r.shard_group < r.world_size) {
      const int g = r.shard_group;
      shards = ConnectGroup(
          c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("shard-", r.rank / g, "/"), store),
          r.rank % g, g, r, *local);
      replicas = ConnectGroup(
          c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("replica-", r.rank % g, "/"), store),
          r.rank / g, r.world_size / g, r, *local);
    }
    return std::unique_ptr<Collectives>(new ProcessGroupCollectives(
        r, std::move(store), std::move(group), std::move(shards), std::move(replicas)));
  } catch (const std::exception& e) {
    int64_t arrived = -1;
    try {
      arrived = store->add("arrived", 0);
    } catch (const std::exception&) {
    }
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": ", arrived >= 0 ? absl::StrCat("only ", arrived) : std::string("not all"), " of ",
        r.world_size, " ranks arrived at ", Address(r), " within ", seconds, " (", WhatOf(e), ")"));
  }
}

}  // namespace ballast::train
