#include "common/version.h"

namespace ballast {

std::string VersionLine(const std::string& program) {
  return program + " " + kVersion + " (commit " + kGitCommit + ")";
}

}  // namespace ballast
