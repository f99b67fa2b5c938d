// ProcessGroupCollectives: Collectives over LibTorch's c10d, with rendezvous
// through a c10d::TCPStore that rank 0 hosts. CPU ranks use ProcessGroupGloo,
// GPU ranks ProcessGroupNCCL. We write no transport of our own.
//
// Rendezvous (Connect): rank 0 opens the store on master_addr:master_port and
// records the world size; every rank reads it back and refuses a mismatch,
// then the group connects its full mesh. Keys live under "attempt-N/", so a
// new attempt never reads a half-dead attempt's keys. Each wait is bounded by
// the rendezvous timeout, and a failure names the rank and the address.
//
// With hybrid sharding (shard_group) the shard and replica groups connect
// after the world, in that order on every rank; the heartbeat below watches
// the world's ranks whichever group they wait in.
//
// A lost peer: Gloo throws from the next collective ("Connection closed by
// peer"), which names an address, not a rank. The error this class throws
// instead names the lost ranks: each rank beats a heartbeat key on the store
// from a thread of its own, and after a failure the ranks whose heartbeat
// stands still (and that did not report the failure themselves) are lost;
// rank 0 is lost when the store, which lives in it, is gone, and otherwise
// keeps the store up until the surviving peers have named the lost ranks.
// A rank whose collective still waits on a live peer learns of the failure
// from the store (its heartbeat thread watches for it) and exits 1 with the
// same diagnosis, so every rank ends within seconds.
//
// A peer that stops without closing its connections (SIGSTOP, a frozen VM, a
// host cut off) fails no collective: Gloo would wait out its own timeout,
// and a TCPStore call to a stopped rank 0 never returns. So the heartbeat is
// also the failure detector, bounded by the collective timeout: rank 0 counts
// a peer whose heartbeat stood still that long as lost, and every other rank
// counts rank 0 as lost once the store has not answered its heartbeat that
// long (a watchdog thread sees it; the heartbeat thread is stuck in the
// call). Either way the ranks end as above. A rank that itself went that long
// without a heartbeat (it was the stopped one) may no longer speak for the
// job, whose peers are gone or going: when it runs again, it ends through
// `on_stalled` before it writes anything (FenceIfStalled, and its threads).
#ifndef BALLAST_WORKER_TRAIN_COLLECTIVES_PROCESS_GROUP_H_
#define BALLAST_WORKER_TRAIN_COLLECTIVES_PROCESS_GROUP_H_

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/train/collectives/collectives.h"

namespace ballast::train {

struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Keys of one attempt of a job; 0 for a standalone run.
  int32_t attempt = 0;
  // Bound on connecting to the store, on the peers' arrival, and on every
  // collective after that (a peer that is alive but never joins it).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // How long a rank may go without a heartbeat before its peers count it
  // lost (see above): the spec's scheduling.collective_timeout_s.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(60)};
  // Called, with why, when this rank went longer than collective_timeout
  // without a heartbeat; meant not to return (ballast-train prints why and
  // _exits fenced). The process exits 1 if it does.
  std::function<void(const std::string& why)> on_stalled;
  // The device the step's tensors live on: the CPU (Gloo) or this rank's
  // GPU (NCCL).
  c10::Device device = c10::kCPU;
  // Hybrid sharding (collectives.h): ranks per shard group, dividing
  // world_size; 0 (or world_size): no shard or replica groups. Each group is
  // a c10d group of its own (Gloo or NCCL, as the world's) over the same
  // store, under the keys "shard-K/" and "replica-K/".
  int shard_group = 0;
};

// DEADLINE_EXCEEDED when the store cannot be reached or the peers do not all
// arrive within the timeout; FAILED_PRECONDITION when this rank's world size
// disagrees with the store's; INVALID_ARGUMENT for a shard_group that does
// not divide world_size. Each message names the rank and the address.
absl::StatusOr<std::unique_ptr<Collectives>> ConnectProcessGroup(const Rendezvous& rendezvous);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_COLLECTIVES_PROCESS_GROUP_H_
