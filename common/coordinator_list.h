// CoordinatorList: the coordinators a worker or a CLI was given
// (--coordinator a,b: a leader and its standbys on one PostgreSQL store,
// docs/control-plane.md "Two coordinators") and the one its calls go to.
// A call that a standby refused goes next to the leader the refusal named;
// one that found no coordinator goes to the next address. Not thread-safe.
#ifndef BALLAST_COMMON_COORDINATOR_LIST_H_
#define BALLAST_COMMON_COORDINATOR_LIST_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ballast {

// The trailing metadata in which a standby names the leader's address,
// HOST:PORT (server/standby_server.h).
inline constexpr char kLeaderMetadata[] = "ballast-leader";

class CoordinatorList {
 public:
  // How long an address that did not answer is not called again on a
  // standby's word: until its lease has expired, a standby still names a
  // leader that died.
  static constexpr absl::Duration kUnreachableMemory = absl::Seconds(5);

  // `addresses`: HOST:PORT, or several separated by commas.
  explicit CoordinatorList(const std::string& addresses);

  const std::string& current() const { return current_; }
  bool several() const { return addresses_.size() > 1; }
  size_t size() const { return addresses_.size(); }

  // The call to current() was not served: `leader` is the address the
  // refusal named, empty when the coordinator did not answer (or named
  // none). Moves to the leader, or to the next address; true when current()
  // changed.
  bool Next(const std::string& leader, absl::Time now);

 private:
  std::vector<std::string> addresses_;
  std::string current_;
  std::string unreachable_;
  absl::Time unreachable_at_ = absl::InfinitePast();
};

}  // namespace ballast

#endif  // BALLAST_COMMON_COORDINATOR_LIST_H_
