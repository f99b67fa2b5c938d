// Removing a folder tree in binaries that link LibTorch.
//
// The torch wheel's libtorch.so exports its own std::filesystem::remove_all,
// built against a newer libstdc++ than Debian 12's; a call resolves to it and
// crashes. Code in worker/train uses RemoveTree instead.
#ifndef BALLAST_WORKER_TRAIN_IO_FILE_TREE_H_
#define BALLAST_WORKER_TRAIN_IO_FILE_TREE_H_

#include <string>

#include "absl/status/status.h"

namespace ballast::train {

// Deletes `path` and everything below it, without following symlinks. A
// missing path is OK. INTERNAL names the entry that could not be removed.
absl::Status RemoveTree(const std::string& path);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_FILE_TREE_H_
