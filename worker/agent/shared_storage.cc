#include "worker/agent/shared_storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ballast::agent {

absl::Status CheckSharedStorage(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    const std::string hint =
        " (every node must mount the shared storage at the same path; "
        "docs/deploy.md, \"Shared storage\")";
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared storage ", dir, " is missing on this node: ", std::strerror(errno), hint));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared storage ", dir, " is not a folder", hint));
    }
    if (access(dir.c_str(), R_OK | X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("shared storage ", dir,
                                                        " is not readable by uid ", getuid(), ": ",
                                                        std::strerror(errno), hint));
    }
  }
  return absl::OkStatus();
}

}  // namespace ballast::agent
