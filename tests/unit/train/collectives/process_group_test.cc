// ProcessGroupCollectives' reduce-scatter over real Gloo: N forked ranks on
// loopback issue several reduce-scatters before waiting for any, and each
// rank's shard must be the float64 sum of every rank's chunk to fp32's
// rounding, added in rank order (for two ranks, the bits of Gloo's
// allreduce), with (N - 1) chunks counted as sent. Hybrid sharding's shard
// and replica groups each reduce over their own ranks and count their bytes.
// Expert parallelism's all-to-all moves rows of uneven, zero, and no
// counts.
#include "worker/train/collectives/process_group.h"

#include <ATen/CPUGeneratorImpl.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

// Chunk sizes per reduce-scatter: odd, none a multiple of another, from one
// element to a few hundred KiB.
const std::vector<int64_t> kChunks = {1, 7, 4099, 65537};

// A port below the kernel's ephemeral range, where no test beside this one
// takes it as the local end of a connection before rank 0 listens on it.
int FreePort() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_low = 32768;
  range >> ephemeral_low;
  std::mt19937 rng{std::random_device{}()};
  for (;;) {
    const int port = std::uniform_int_distribution<int>(10000, ephemeral_low - 1)(rng);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return port;
  }
}

// Rank `from`'s full tensor for reduce-scatter `op`: normal values scaled by
// a power of ten per rank, so that the order of the fp32 additions shows.
at::Tensor Full(uint64_t seed, size_t op, int from, int world_size) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed + 1000 * op + from);
  return at::randn({world_size * kChunks[op]}, g, at::TensorOptions().dtype(at::kFloat)) *
         std::pow(10.0, from % 3 - 1);
}

// Rank `rank` of a job of `world_size` on loopback, with shard groups of
// `shard_group` (0: none), on one torch thread.
absl::StatusOr<std::unique_ptr<Collectives>> Connect(int rank, int world_size, int port,
                                                     int shard_group = 0) {
  at::set_num_threads(1);
  Rendezvous r;
  r.rank = rank;
  r.world_size = world_size;
  r.master_port = port;
  r.timeout = std::chrono::seconds(60);
  r.shard_group = shard_group;
  return ConnectProcessGroup(r);
}

// One rank's part; the problems it found, or "".
std::string CheckRank(int rank, int world_size, int port, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Collectives>> group = Connect(rank, world_size, port);
  if (!group.ok()) return group.status().ToString();
  Collectives& c = **group;

  std::vector<at::Tensor> fulls, shards;
  std::vector<std::unique_ptr<InFlight>> in_flight;
  int64_t expected_bytes = 0;
  const int64_t bytes_before = c.communicated_bytes();
  for (size_t op = 0; op < kChunks.size(); ++op) {
    fulls.push_back(Full(seed, op, rank, world_size));
    shards.push_back(at::full({kChunks[op]}, NAN, at::kFloat));
    in_flight.push_back(c.ReduceScatter(shards.back(), fulls.back()));
    expected_bytes += (world_size - 1) * kChunks[op] * 4;
  }
  // Any order: each waits for its own operation.
  for (size_t op = in_flight.size(); op-- > 0;) in_flight[op]->Wait();

  std::string problems;
  if (c.communicated_bytes() - bytes_before != expected_bytes) {
    absl::StrAppend(&problems, "counted ", c.communicated_bytes() - bytes_before,
                    " bytes for the reduce-scatters, expected ", expected_bytes, "; ");
  }
  for (size_t op = 0; op < kChunks.size(); ++op) {
    const int64_t n = kChunks[op];
    at::Tensor exact = at::zeros({n}, at::kDouble);
    at::Tensor magnitude = at::zeros({n}, at::kDouble);
    at::Tensor in_rank_order;
    for (int from = 0; from < world_size; ++from) {
      const at::Tensor mine = Full(seed, op, from, world_size).narrow(0, rank * n, n);
      exact += mine.to(at::kDouble);
      magnitude += mine.to(at::kDouble).abs();
      in_rank_order = from == 0 ? mine.clone() : in_rank_order + mine;
    }
    // N - 1 fp32 additions, each rounding by at most half an ulp of its sum.
    const at::Tensor bound = magnitude * (world_size * std::ldexp(1.0, -24));
    const at::Tensor error = (shards[op].to(at::kDouble) - exact).abs();
    if (!(error <= bound).all().item<bool>()) {
      absl::StrAppend(&problems, "chunk of ", n, " is ", error.max().item<double>(),
                      " off the float64 sum; ");
    }
    if (!torch::equal(shards[op], in_rank_order)) {
      absl::StrAppend(&problems, "chunk of ", n, " is not the fp32 sum in rank order; ");
    }
    at::Tensor allreduced = fulls[op].clone();
    c.SumInPlace(allreduced);
    if (world_size == 2 && !torch::equal(shards[op], allreduced.narrow(0, rank * n, n))) {
      absl::StrAppend(&problems, "chunk of ", n, " differs from Gloo's allreduce; ");
    }
  }
  c.Barrier();
  return problems;
}

// Runs check(rank) in `world_size` forked processes and expects each to
// report no problems within 120 s (generous for a loaded machine).
void ExpectEveryRankPasses(int world_size, uint64_t seed,
                           const std::function<std::string(int rank)>& check) {
  std::vector<pid_t> ranks;
  std::vector<int> reports;
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      std::string problems;
      try {
        problems = check(rank);
      } catch (const std::exception& e) {
        problems = e.what();
      }
      if (!problems.empty()) (void)!write(fds[1], problems.data(), problems.size());
      _exit(problems.empty() ? 0 : 1);
    }
    close(fds[1]);
    ranks.push_back(pid);
    reports.push_back(fds[0]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int rank = 0; rank < world_size; ++rank) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(ranks[rank], &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (done == 0) {
      for (pid_t pid : ranks) kill(pid, SIGKILL);
      waitpid(ranks[rank], &status, 0);
    }
    std::string problems(4096, '\0');
    const ssize_t got = read(reports[rank], problems.data(), problems.size());
    problems.resize(got > 0 ? got : 0);
    close(reports[rank]);
    EXPECT_NE(done, 0) << "rank " << rank << " of " << world_size << " did not finish in 120 s";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " of " << world_size << " (seed " << seed << "): " << problems;
  }
}

class GlooReduceScatterTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooReduceScatterTest, EveryShardIsTheSumOfItsChunksAndSendsOneRingPass) {
  const int world_size = GetParam();
  const int port = FreePort();
  const uint64_t seed = std::random_device{}();
  ExpectEveryRankPasses(world_size, seed,
                        [&](int rank) { return CheckRank(rank, world_size, port, seed); });
}

// Expert parallelism's all-to-all: rank `from` sends rank `to` Rows(from,
// to) rows whose values name both and the row, in fp32 and in bf16, with
// rank 0 sending nothing at all and the last rank receiving nothing at all.
// Each rank must receive every peer's rows in rank order, and count the
// rows it sent to others.
int64_t Rows(uint64_t seed, int from, int to, int world_size) {
  if (from == 0 || to == world_size - 1) return 0;
  return static_cast<int64_t>((seed >> (4 * (from * world_size + to) % 60)) % 5);
}

at::Tensor RowsBetween(int from, int to, int64_t rows, at::ScalarType dtype) {
  // Small integers, exact in bf16: 3 columns of (from, to, row).
  at::Tensor t = at::empty({rows, 3}, at::kFloat);
  for (int64_t r = 0; r < rows; ++r) {
    t[r][0] = from;
    t[r][1] = to;
    t[r][2] = r;
  }
  return t.to(dtype);
}

std::string CheckAllToAllRank(int rank, int world_size, int port, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Collectives>> group = Connect(rank, world_size, port);
  if (!group.ok()) return group.status().ToString();
  Collectives& c = **group;
  std::string problems;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    std::vector<int64_t> send(world_size), recv(world_size);
    std::vector<at::Tensor> sent, expected;
    for (int peer = 0; peer < world_size; ++peer) {
      send[peer] = Rows(seed, rank, peer, world_size);
      recv[peer] = Rows(seed, peer, rank, world_size);
      sent.push_back(RowsBetween(rank, peer, send[peer], dtype));
      expected.push_back(RowsBetween(peer, rank, recv[peer], dtype));
    }
    const at::Tensor input = at::cat(sent);
    const at::Tensor want = at::cat(expected);
    at::Tensor output = at::full_like(want, NAN);
    const int64_t bytes_before = c.communicated_bytes();
    c.AllToAll(output, input, recv, send);
    if (!torch::equal(output, want)) {
      absl::StrAppend(&problems, at::toString(dtype), ": received other rows; ");
    }
    const int64_t sent_bytes = (input.size(0) - send[rank]) * 3 * input.element_size();
    if (c.communicated_bytes() - bytes_before != sent_bytes) {
      absl::StrAppend(&problems, at::toString(dtype), ": counted ",
                      c.communicated_bytes() - bytes_before, " bytes, sent ", sent_bytes, "; ");
    }
  }
  c.Barrier();
  return problems;
}

class GlooAllToAllTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooAllToAllTest, EveryRankReceivesItsRowsInRankOrderEvenWhenNoneOrNoneAtAll) {
  const int world_size = GetParam();
  const int port = FreePort();
  const uint64_t seed = std::random_device{}();
  ExpectEveryRankPasses(world_size, seed,
                        [&](int rank) { return CheckAllToAllRank(rank, world_size, port, seed); });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooAllToAllTest, ::testing::Values(2, 3));

// Hybrid sharding's groups: 6 ranks as 3 replicas x 2, or 2 x 3. Each group
// sums over its own ranks only (values that tell every rank apart), its
// ranks are numbered as collectives.h says, and the bytes are counted per
// group: the total is the world's plus both groups', of which the replica
// group's are reported apart.
std::string CheckHybridRank(int rank, int world_size, int shard_group, int port) {
  absl::StatusOr<std::unique_ptr<Collectives>> world = Connect(rank, world_size, port, shard_group);
  if (!world.ok()) return world.status().ToString();
  Collectives& shards = (*world)->shard_group();
  Collectives* replicas = (*world)->replica_group();
  const int replica_count = world_size / shard_group;
  std::string problems;
  if (replicas == nullptr) return "no replica group";
  if (shards.rank() != rank % shard_group || shards.world_size() != shard_group ||
      replicas->rank() != rank / shard_group || replicas->world_size() != replica_count) {
    absl::StrAppend(&problems, "shard rank ", shards.rank(), " of ", shards.world_size(),
                    ", replica ", replicas->rank(), " of ", replicas->world_size(), "; ");
  }
  auto one_hot = [&] {
    at::Tensor t = at::zeros({world_size}, at::kFloat);
    t[rank] = 1;
    return t;
  };
  auto members = [&](auto in_group) {
    at::Tensor t = at::zeros({world_size}, at::kFloat);
    for (int k = 0; k < world_size; ++k) t[k] = in_group(k) ? 1 : 0;
    return t;
  };
  const int64_t world_before = (*world)->communicated_bytes();
  at::Tensor in_shard_group = one_hot();
  shards.SumInPlace(in_shard_group);
  at::Tensor in_replica_group = one_hot();
  replicas->SumInPlace(in_replica_group);
  const int64_t nbytes = world_size * 4;
  const int64_t shard_bytes = 2 * nbytes * (shard_group - 1) / shard_group;
  const int64_t replica_bytes = 2 * nbytes * (replica_count - 1) / replica_count;
  if (!torch::equal(in_shard_group,
                    members([&](int k) { return k / shard_group == rank / shard_group; }))) {
    absl::StrAppend(&problems, "the shard group summed other ranks; ");
  }
  if (!torch::equal(in_replica_group,
                    members([&](int k) { return k % shard_group == rank % shard_group; }))) {
    absl::StrAppend(&problems, "the replica group summed other ranks; ");
  }
  if (replicas->communicated_bytes() != replica_bytes ||
      (*world)->replica_communicated_bytes() != replica_bytes ||
      shards.communicated_bytes() != shard_bytes ||
      (*world)->communicated_bytes() - world_before != shard_bytes + replica_bytes) {
    absl::StrAppend(&problems, "counted ", (*world)->communicated_bytes() - world_before,
                    " bytes (replicas ", (*world)->replica_communicated_bytes(), "), expected ",
                    shard_bytes + replica_bytes, " (replicas ", replica_bytes, "); ");
  }
  // A reduce-scatter inside the shard group: shard k of the group's sum.
  at::Tensor full = at::arange(shard_group * 3, at::kFloat) * (rank + 1);
  at::Tensor shard = at::empty({3}, at::kFloat);
  std::unique_ptr<InFlight> in_flight = shards.ReduceScatter(shard, full);
  if (in_flight) in_flight->Wait();
  double factor = 0;
  for (int k = 0; k < world_size; ++k) factor += k / shard_group == rank / shard_group ? k + 1 : 0;
  if (!torch::equal(shard,
                    at::arange(shards.rank() * 3, shards.rank() * 3 + 3, at::kFloat) * factor)) {
    absl::StrAppend(&problems, "the shard group's reduce-scatter is wrong; ");
  }
  (*world)->Barrier();
  return problems;
}

class HybridGroupsTest : public ::testing::TestWithParam<int> {};

TEST_P(HybridGroupsTest, EachGroupSumsItsOwnRanksAndCountsItsOwnBytes) {
  const int port = FreePort();
  const int shard_group = GetParam();
  ExpectEveryRankPasses(6, 0,
                        [&](int rank) { return CheckHybridRank(rank, 6, shard_group, port); });
}

INSTANTIATE_TEST_SUITE_P(ShardGroups, HybridGroupsTest, ::testing::Values(2, 3));

TEST(HybridShardGroupTest, OneThatDoesNotDivideTheWorldIsRefused) {
  Rendezvous r;
  r.world_size = 4;
  r.shard_group = 3;
  absl::StatusOr<std::unique_ptr<Collectives>> group = ConnectProcessGroup(r);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(group.status().message().find("sharding.shard_group 3"), std::string::npos)
      << group.status();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooReduceScatterTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace ballast::train
