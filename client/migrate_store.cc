#include "client/migrate_store.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace ballast::client {

int MigrateStore(const Io& io, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ballastd", "migrate-store"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> pointers;
  for (std::string& arg : argv) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  // Flushed before the process image is replaced.
  io.out->flush();
  io.err->flush();
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path beside = self.parent_path() / "ballastd";
  if (!ec && access(beside.c_str(), X_OK) == 0) execv(beside.c_str(), pointers.data());
  execvp("ballastd", pointers.data());
  *io.err << "ballast: migrate-store runs `ballastd migrate-store`, and no ballastd could be run "
             "(none beside "
          << (ec ? std::string("this ballast") : self.string())
          << ", nor on PATH): " << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace ballast::client
