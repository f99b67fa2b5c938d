// A throwaway PostgreSQL server for the store's tests: a cluster made with
// initdb in a temporary folder, serving on a unix socket in that folder
// only (no TCP port, so parallel tests never collide), stopped and deleted
// when the test process ends (or, should it crash, a second after). Debian's postgresql package
// installs the binaries (`make setup`); without them, tests that need one skip.
//
// initdb and the server refuse to run as root, which CI and this machine
// are: then they run as the `postgres` user that package creates (`nobody`
// where there is none) via runuser, in a folder given to that user.
#ifndef BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_
#define BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_

#include <libpq-fe.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server::testing {

class PostgresServer {
 public:
  // The server of this test process, started at the first call. NOT_FOUND
  // when PostgreSQL's binaries are missing (a test skips with the message);
  // INTERNAL, with the server's log, when they fail.
  static absl::StatusOr<PostgresServer*> Shared() {
    static absl::StatusOr<std::unique_ptr<PostgresServer>> server = Start();
    if (!server.ok()) return server.status();
    return server->get();
  }

  // A URL to a new, empty database on the shared server; NOT_FOUND as Shared.
  static absl::StatusOr<std::string> NewSharedDatabase() {
    absl::StatusOr<PostgresServer*> server = Shared();
    if (!server.ok()) return server.status();
    return (*server)->NewDatabase();
  }

  // A URL to a new, empty database on the server.
  absl::StatusOr<std::string> NewDatabase() {
    const std::string name = absl::StrCat("test_", ++databases_);
    PGconn* admin = PQconnectdb(Url("postgres").c_str());
    PGresult* r = PQexec(admin, absl::StrCat("CREATE DATABASE ", name).c_str());
    absl::Status status = PQresultStatus(r) == PGRES_COMMAND_OK
                              ? absl::OkStatus()
                              : absl::InternalError(PQerrorMessage(admin));
    PQclear(r);
    PQfinish(admin);
    if (!status.ok()) return status;
    return Url(name);
  }

  // Runs `sql` on database `url` as the cluster's superuser.
  static absl::Status Exec(const std::string& url, const std::string& sql) {
    PGconn* conn = PQconnectdb(url.c_str());
    PGresult* r = PQexec(conn, sql.c_str());
    const ExecStatusType status = PQresultStatus(r);
    absl::Status s = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK
                         ? absl::OkStatus()
                         : absl::InternalError(PQerrorMessage(conn));
    PQclear(r);
    PQfinish(conn);
    return s;
  }

  // The URL of database `name`, through the socket folder.
  std::string Url(const std::string& name) const {
    return absl::StrCat("postgresql:///", name, "?host=", dir_.path().string(),
                        "&port=5432&user=ballast");
  }

  ~PostgresServer() {
    (void)Run(absl::StrCat(bin_, "/pg_ctl -D ", data(), " -m immediate stop >/dev/null"));
  }

 private:
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start() {
    std::string bin;
    const std::filesystem::path versions = "/usr/lib/postgresql";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(versions, ec)) {
      if (std::filesystem::exists(entry.path() / "bin" / "initdb")) {
        bin = std::max(bin, (entry.path() / "bin").string());
      }
    }
    if (bin.empty()) {
      return absl::NotFoundError(
          "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): `make setup` "
          "installs Debian's postgresql package");
    }
    std::unique_ptr<PostgresServer> server(new PostgresServer(bin));
    if (absl::Status s = server->Init(); !s.ok()) return s;
    return server;
  }

  explicit PostgresServer(std::string bin) : bin_(std::move(bin)) {}

  std::string data() const { return (dir_.path() / "data").string(); }

  absl::Status Init() {
    if (geteuid() == 0) {
      const passwd* user = getpwnam("postgres");
      if (user == nullptr) user = getpwnam("nobody");
      if (user == nullptr)
        return absl::InternalError("running as root, and no user postgres or nobody");
      as_user_ = absl::StrCat("runuser -u ", user->pw_name, " -- ");
      if (chown(dir_.path().c_str(), user->pw_uid, user->pw_gid) != 0) {
        return absl::InternalError(absl::StrCat("chown ", dir_.path().string(), " failed"));
      }
    }
    // initdb's output is written by this process, the server's log by the
    // server's user.
    const std::string initdb_log = (dir_.path() / "initdb.log").string();
    const std::string log = (dir_.path() / "server.log").string();
    // No fsync: a test's data need not survive a power loss, and this
    // machine is slow at it.
    if (absl::Status s = Run(absl::StrCat(bin_, "/initdb -D ", data(),
                                          " -A trust -U ballast --no-sync -E UTF8 --locale=C > ",
                                          initdb_log, " 2>&1"));
        !s.ok()) {
      return Failed(s, initdb_log);
    }
    if (absl::Status s = Run(absl::StrCat(bin_, "/pg_ctl -D ", data(), " -l ", log, " -o \"-k ",
                                          dir_.path().string(),
                                          " -p 5432 -c listen_addresses='' -c fsync=off\" -w "
                                          "start >/dev/null"));
        !s.ok()) {
      return Failed(s, log);
    }
    // A test process that crashes or is killed runs no destructor: a
    // watcher stops the server once this process is gone.
    return Run(absl::StrCat("sh -c 'while [ -d /proc/", getpid(), " ]; do sleep 1; done; ", bin_,
                            "/pg_ctl -D ", data(), " -m immediate stop' >/dev/null 2>&1 &"));
  }

  absl::Status Run(const std::string& command) const {
    const std::string line = as_user_ + command;
    if (std::system(line.c_str()) != 0) return absl::InternalError(absl::StrCat("failed: ", line));
    return absl::OkStatus();
  }

  static absl::Status Failed(const absl::Status& s, const std::string& log) {
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    return absl::InternalError(absl::StrCat(s.message(), "\n", text.str()));
  }

  TempDir dir_;
  const std::string bin_;
  // Prefix of each command: runs it as another user when this one is root.
  std::string as_user_;
  int databases_ = 0;
};

}  // namespace ballast::server::testing

#endif  // BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_
