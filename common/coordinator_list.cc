#include "common/coordinator_list.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace ballast {

CoordinatorList::CoordinatorList(const std::string& addresses) {
  for (absl::string_view address : absl::StrSplit(addresses, ',', absl::SkipWhitespace())) {
    addresses_.emplace_back(absl::StripAsciiWhitespace(address));
  }
  if (addresses_.empty()) addresses_.push_back(addresses);
  current_ = addresses_.front();
}

bool CoordinatorList::Next(const std::string& leader, absl::Time now) {
  std::string next;
  if (leader.empty()) {
    unreachable_ = current_;
    unreachable_at_ = now;
  } else if (leader != unreachable_ || now - unreachable_at_ >= kUnreachableMemory) {
    next = leader;
  }
  if (next.empty() && several()) {
    auto it = std::find(addresses_.begin(), addresses_.end(), current_);
    next = (it == addresses_.end() || it + 1 == addresses_.end()) ? addresses_.front() : *(it + 1);
    // Not back to the one that did not answer, on a standby's word.
    if (!leader.empty()) next.clear();
  }
  if (next.empty() || next == current_) return false;
  current_ = next;
  return true;
}

}  // namespace ballast
