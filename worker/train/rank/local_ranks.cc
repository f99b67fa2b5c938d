#include "worker/train/rank/local_ranks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ballast::train {
namespace {

using Clock = std::chrono::steady_clock;

// How long the ranks' stderr may stay open after the last rank exited (a
// grandchild holding it): their last lines are read, then the launcher ends.
constexpr auto kPipeLinger = std::chrono::seconds(2);

struct Child {
  int rank = 0;
  pid_t pid = -1;
  // Read end of its stderr; -1 once at end of file.
  int err = -1;
  // What it wrote after its last newline.
  std::string partial;
  bool running = false;
  // The launcher asked it to stop (after another rank failed), or the user
  // did through the launcher: either way it is not asked a second time.
  bool stop_sent = false;
};

void WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr gone: nothing left to tell
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// Whether `port` (0: any) can be bound on every address now; the bound one.
absl::StatusOr<int> BindablePort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind port ", port, ": ", std::strerror(error)));
  }
  return ntohs(addr.sin_port);
}

// A port for rank 0's store, free now. Rank 0 binds it a moment later, so it
// is drawn below the kernel's ephemeral range (ip_local_port_range), which
// outgoing connections and port-0 listeners take their ports from: only
// another explicit bind of the same port could come between. (A port of
// that range was taken now and then by a concurrent test's connection, and
// rank 0 failed with EADDRINUSE.) Falls back to the kernel's choice.
absl::StatusOr<int> FreePort() {
  int ephemeral_low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int low = 0, high = 0;
    if (std::fscanf(f, "%d %d", &low, &high) == 2 && low > 1024) ephemeral_low = low;
    std::fclose(f);
  }
  constexpr int kLowest = 10000;
  if (ephemeral_low > kLowest + 1) {
    std::random_device seed;
    std::mt19937 draw(seed());
    std::uniform_int_distribution<int> ports(kLowest, ephemeral_low - 1);
    for (int tries = 0; tries < 64; ++tries) {
      if (absl::StatusOr<int> port = BindablePort(ports(draw)); port.ok()) return port;
    }
  }
  absl::StatusOr<int> port = BindablePort(0);
  if (!port.ok()) {
    return absl::InternalError(absl::StrCat("cannot pick a free port: ", port.status().message()));
  }
  return port;
}

int ExitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                      ")");
}

// Forks rank `child->rank`, its stderr into a pipe. The rank gets its own
// process group, so a terminal's Ctrl-C reaches it once, through the
// launcher, and a signal from the launcher reaches whatever it started too;
// it dies with the launcher even when that is SIGKILLed.
absl::Status Spawn(const std::string& binary, const std::string& argv0,
                   const std::vector<std::string>& args, const std::vector<std::string>& env,
                   const sigset_t& original_mask, Child* child) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(argv0.empty() ? binary.c_str() : argv0.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(
        absl::StrCat("cannot start rank ", child->rank, ": fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl
    dup2(fds[1], STDERR_FILENO);
    pthread_sigmask(SIG_SETMASK, &original_mask, nullptr);
    execve(binary.c_str(), argv.data(), envp.data());
    const std::string error = absl::StrCat("cannot run ", binary, ": ", std::strerror(errno), "\n");
    WriteAll(STDERR_FILENO, error);
    _exit(127);
  }
  // Also here, so the group exists before the launcher may signal it.
  setpgid(pid, pid);
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  child->pid = pid;
  child->err = fds[0];
  child->running = true;
  return absl::OkStatus();
}

// Copies what the rank wrote, whole lines only, each prefixed with its rank.
void Relay(Child* child, int out_fd) {
  char buffer[65536];
  while (true) {
    const ssize_t n = read(child->err, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n > 0) child->partial.append(buffer, static_cast<size_t>(n));
    std::string lines;
    size_t start = 0;
    for (size_t end; (end = child->partial.find('\n', start)) != std::string::npos;
         start = end + 1) {
      absl::StrAppend(&lines, "[rank ", child->rank, "] ",
                      child->partial.substr(start, end - start + 1));
    }
    child->partial.erase(0, start);
    if (n <= 0 && !child->partial.empty()) {
      absl::StrAppend(&lines, "[rank ", child->rank, "] ", child->partial, "\n");
      child->partial.clear();
    }
    WriteAll(out_fd, lines);
    if (n <= 0) {  // end of file, or an error that ends it the same way
      close(child->err);
      child->err = -1;
      return;
    }
  }
}

}  // namespace

std::vector<std::string> ArgumentsWithout(int argc, const char* const* argv,
                                          const std::string& option) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == option) {
      ++i;  // and its value
    } else if (!absl::StartsWith(arg, absl::StrCat(option, "="))) {
      out.emplace_back(arg);
    }
  }
  return out;
}

absl::StatusOr<int> RunLocalRanks(const LocalRanksOptions& options) {
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();

  sigset_t mask, original_mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &mask, &original_mask);
  const int signals = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signals < 0) {
    pthread_sigmask(SIG_SETMASK, &original_mask, nullptr);
    return absl::InternalError(absl::StrCat("signalfd: ", std::strerror(errno)));
  }

  // N ranks share this machine's cores, as a worker's CPU slots share its
  // node's: unless the user chose, each rank's thread pools get an equal part.
  if (getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned cores = std::thread::hardware_concurrency();
    setenv(
        "OMP_NUM_THREADS",
        absl::StrCat(std::max<unsigned>(1, cores / static_cast<unsigned>(options.nproc))).c_str(),
        1);
  }

  // One GPU per rank, as a worker gives them: rank R sees the R-th of the
  // GPUs this launcher sees (all of them when CUDA_VISIBLE_DEVICES is unset),
  // and none past the last. Ranks that end up on different device kinds are
  // refused at the rendezvous.
  std::vector<std::string> gpus;
  if (const char* visible = getenv("CUDA_VISIBLE_DEVICES")) {
    gpus = absl::StrSplit(visible, ',', absl::SkipEmpty());
  } else {
    for (int r = 0; r < options.nproc; ++r) gpus.push_back(absl::StrCat(r));
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "CUDA_VISIBLE_DEVICES=")) env.emplace_back(*e);
  }

  std::vector<Child> children(options.nproc);
  absl::Status started;
  for (int r = 0; r < options.nproc && started.ok(); ++r) {
    children[r].rank = r;
    std::vector<std::string> args = options.args;
    args.insert(args.end(), {"--rank", absl::StrCat(r), "--world-size", absl::StrCat(options.nproc),
                             "--master-addr", "127.0.0.1", "--master-port", absl::StrCat(*port)});
    std::vector<std::string> rank_env = env;
    rank_env.push_back(
        absl::StrCat("CUDA_VISIBLE_DEVICES=", r < static_cast<int>(gpus.size()) ? gpus[r] : ""));
    started = Spawn(options.binary, options.argv0, args, rank_env, original_mask, &children[r]);
  }

  int running = 0;
  for (Child& c : children) running += c.running ? 1 : 0;
  std::optional<int> first_failure;
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> linger_until;
  auto stop_others = [&](int sig) {
    for (Child& c : children) {
      if (c.running && !c.stop_sent) {
        kill(-c.pid, sig);
        c.stop_sent = true;
      }
    }
  };
  if (!started.ok()) {
    stop_others(SIGKILL);
    first_failure = 1;
  }

  while (true) {
    std::vector<pollfd> fds = {{signals, POLLIN, 0}};
    std::vector<Child*> readers;
    for (Child& c : children) {
      if (c.err >= 0) {
        fds.push_back({c.err, POLLIN, 0});
        readers.push_back(&c);
      }
    }
    if (running == 0) {
      if (readers.empty()) break;
      if (!linger_until) linger_until = Clock::now() + kPipeLinger;
    }
    std::optional<Clock::time_point> wake = kill_at;
    if (linger_until && (!wake || *linger_until < *wake)) wake = linger_until;
    int timeout_ms = -1;
    if (wake) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(*wake - Clock::now()).count()));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      WriteAll(options.err_fd, absl::StrCat("ballast-train: poll: ", std::strerror(errno),
                                            "; killing the ranks\n"));
      for (Child& c : children) {
        if (c.running) kill(-c.pid, SIGKILL);
      }
      first_failure = first_failure.value_or(1);
      break;
    }

    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Relay(readers[i - 1], options.err_fd);
    }
    if (kill_at && Clock::now() >= *kill_at) {
      for (Child& c : children) {
        if (c.running) kill(-c.pid, SIGKILL);
      }
      kill_at.reset();
    }
    if (linger_until && Clock::now() >= *linger_until) break;

    signalfd_siginfo info;
    while (read(signals, &info, sizeof(info)) == sizeof(info)) {
      if (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM) {
        // The user's stop: every signal goes to every running rank.
        for (Child& c : children) {
          if (c.running) {
            kill(-c.pid, static_cast<int>(info.ssi_signo));
            c.stop_sent = true;
          }
        }
      }
    }
    int status = 0;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      for (Child& c : children) {
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        --running;
        if (ExitCodeOf(status) == 0 || first_failure) break;
        first_failure = ExitCodeOf(status);
        WriteAll(options.err_fd, absl::StrCat("ballast-train: rank ", c.rank, " of ", options.nproc,
                                              " ", Describe(status),
                                              running > 0 ? "; stopping the other ranks\n" : "\n"));
        stop_others(SIGTERM);
        kill_at = Clock::now() + options.grace;
      }
    }
  }

  for (Child& c : children) {
    if (c.err >= 0) close(c.err);
    // Only after a failed poll, which killed them.
    if (c.running) waitpid(c.pid, nullptr, 0);
  }
  close(signals);
  pthread_sigmask(SIG_SETMASK, &original_mask, nullptr);
  if (!started.ok()) return started;
  return first_failure.value_or(0);
}

}  // namespace ballast::train
