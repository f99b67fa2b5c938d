// The shared storage a worker needs before it runs ranks: the folders that
// hold models, data and job outputs, which every node must see at the same
// paths (docs/deploy.md, "Shared storage"). A node that lacks one would
// take ranks and fail each of them on its first open(); checking at start
// says which mount is missing, once, before the worker registers.
#ifndef BALLAST_WORKER_AGENT_SHARED_STORAGE_H_
#define BALLAST_WORKER_AGENT_SHARED_STORAGE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ballast::agent {

// OK when each of `dirs` is a folder this process can read and enter.
// Otherwise FAILED_PRECONDITION naming the first folder that is missing, not
// a folder, or not readable (with the user id that tried). Writing is not
// required: a shared root may be read-only with a writable outputs folder
// below it, which ranks report on their own when they cannot write. Does not
// block on a FIFO or create anything.
absl::Status CheckSharedStorage(const std::vector<std::string>& dirs);

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_SHARED_STORAGE_H_
