#include "worker/train/io/file_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

// nftw takes a plain function pointer, so the first failure is kept here;
// thread_local keeps concurrent removals apart.
thread_local std::string failed_entry;
thread_local int failed_errno = 0;

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0) {
    failed_entry = path;
    failed_errno = errno;
    return 1;
  }
  return 0;
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) return absl::OkStatus();
  failed_entry.clear();
  if (nftw(path.c_str(), RemoveEntry, /*fd_limit=*/16, FTW_DEPTH | FTW_PHYS) != 0) {
    return absl::InternalError(absl::StrCat("cannot remove ",
                                            failed_entry.empty() ? path : failed_entry, ": ",
                                            std::strerror(failed_errno)));
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
