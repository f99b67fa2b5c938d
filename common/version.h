// Build identity of every Ballast binary.
#ifndef BALLAST_COMMON_VERSION_H_
#define BALLAST_COMMON_VERSION_H_

#include <string>

namespace ballast {

// Release version, e.g. "0.1.0". Stamped at build time.
extern const char kVersion[];
// Short git commit of the build, with "-dirty" for uncommitted changes, or
// "unknown" outside a git checkout. Stamped at build time.
extern const char kGitCommit[];

// "NAME VERSION (commit COMMIT)": the first line of every `--version`.
std::string VersionLine(const std::string& program);

}  // namespace ballast

#endif  // BALLAST_COMMON_VERSION_H_
