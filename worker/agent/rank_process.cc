#include "worker/agent/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace ballast::agent {
namespace {

// Owns the posix_spawn attribute objects so every error path frees them.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

std::vector<std::string> MergedEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& [key, value] : overrides) env[key] = value;
  std::vector<std::string> out;
  for (const auto& [key, value] : env) out.push_back(absl::StrCat(key, "=", value));
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

}  // namespace

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 2;
    if (ok && len > 1) {
      // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (text[i + k] & 0x3f);
      const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out.push_back('?');
      i += 1;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Spawn(SpawnOptions options) {
  std::vector<std::string> argv_strings = {options.binary};
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env_strings = MergedEnvironment(options.env);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);

  SpawnSetup setup;
  int rc = posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  if (rc == 0) {
    rc = posix_spawn_file_actions_addopen(&setup.actions, 1, options.log_path.c_str(),
                                          O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  if (rc == 0) rc = posix_spawn_file_actions_adddup2(&setup.actions, 1, 2);
  // gRPC's sockets and the other ranks' channels must not leak into a rank.
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&setup.actions, 3);
  // The worker blocks SIGTERM/SIGINT to wait for them, and gRPC ignores
  // SIGPIPE; both would otherwise be inherited across exec.
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  if (rc == 0) rc = posix_spawnattr_setsigmask(&setup.attr, &empty);
  if (rc == 0) rc = posix_spawnattr_setsigdefault(&setup.attr, &all);
  if (rc == 0) rc = posix_spawnattr_setpgroup(&setup.attr, 0);
  if (rc == 0) {
    rc = posix_spawnattr_setflags(
        &setup.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot set up spawn: ", std::strerror(rc)));
  }
  const int64_t log_start = FileSize(options.log_path);
  pid_t pid = 0;
  rc = posix_spawn(&pid, options.binary.c_str(), &setup.actions, &setup.attr, argv.data(),
                   envp.data());
  if (rc != 0) {
    const std::string message = absl::StrCat("cannot start ", options.binary, " (log ",
                                             options.log_path, "): ", std::strerror(rc));
    return rc == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  return std::unique_ptr<RankProcess>(new RankProcess(pid, std::move(options), log_start));
}

RankProcess::RankProcess(pid_t pid, SpawnOptions options, int64_t log_start)
    : pid_(pid), options_(std::move(options)), log_start_(log_start) {
  reaper_ = std::thread([this] { ReaperLoop(); });
  killer_ = std::thread([this] { KillerLoop(); });
}

RankProcess::~RankProcess() {
  {
    absl::MutexLock lock(&mu_);
    destroying_ = true;
    if (!exited_) {
      stop_requested_ = true;
      kill(-pid_, SIGKILL);
    }
  }
  reaper_.join();
  killer_.join();
}

void RankProcess::Stop(absl::Duration grace) { StopWith(grace, /*sigterm=*/true); }

void RankProcess::KillAfter(absl::Duration grace) { StopWith(grace, /*sigterm=*/false); }

void RankProcess::StopWith(absl::Duration grace, bool sigterm) {
  absl::MutexLock lock(&mu_);
  if (exited_ || stop_requested_) return;
  stop_requested_ = true;
  kill_deadline_ = absl::Now() + grace;
  if (sigterm) kill(-pid_, SIGTERM);
}

bool RankProcess::Exited() const {
  absl::MutexLock lock(&mu_);
  return exited_;
}

std::optional<ProcessExit> RankProcess::WaitForExit(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &RankProcess::HasExit), timeout);
  return exit_;
}

void RankProcess::ReaperLoop() {
  // WNOWAIT leaves the zombie in place, so pid_ (and the group id) cannot be
  // reused until exited_ is set and no kill() can reach a stranger.
  siginfo_t info{};
  while (waitid(P_PID, pid_, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  ProcessExit exit;
  exit.exit_code = info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  {
    absl::MutexLock lock(&mu_);
    exited_ = true;
    exit.stopped = stop_requested_ && !destroying_;
    // Anything the rank left behind in its group would hold the log and the
    // socket open; the rank is gone, so they go too.
    kill(-pid_, SIGKILL);
  }
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  exit.log_tail = ReadLogTail();
  {
    absl::MutexLock lock(&mu_);
    exit_ = exit;
  }
  if (options_.on_exit) options_.on_exit(exit);
}

void RankProcess::KillerLoop() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &RankProcess::ExitedOrStopping));
  if (exited_) return;
  if (!mu_.AwaitWithDeadline(absl::Condition(&exited_), kill_deadline_)) {
    kill(-pid_, SIGKILL);
  }
}

std::string RankProcess::ReadLogTail() const {
  const int fd = open(options_.log_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string tail;
  if (fstat(fd, &st) == 0 && st.st_size > log_start_) {
    const int64_t begin = std::max<int64_t>(log_start_, st.st_size - kLogTailBytes);
    tail.resize(st.st_size - begin);
    const ssize_t n = pread(fd, tail.data(), tail.size(), begin);
    tail.resize(n > 0 ? n : 0);
    // A cut first line is dropped, unless it is the only one.
    if (begin > log_start_) {
      const size_t nl = tail.find('\n');
      if (nl != std::string::npos && nl + 1 < tail.size()) tail.erase(0, nl + 1);
    }
  }
  close(fd);
  return SanitizeUtf8(tail);
}

}  // namespace ballast::agent
