// A throwaway PostgreSQL server for the store's tests, made and stopped by
// postgres_server.sh (initdb in a folder, served on a unix socket there
// only, so parallel runs never collide; run as the `postgres` user when
// this is root, as CI is). Each test takes a new database on it.
//
// Under CTest one server serves every test process: a fixture starts it
// before the server tests and stops it after (tests/unit/CMakeLists.txt),
// and BALLAST_TEST_POSTGRES names its folder, since a cluster of its own per
// process would cost each case 1.5 s. A test binary run by hand starts its
// own at its first use and stops it at exit (or, should it crash, a second
// after). Without PostgreSQL's binaries (`make setup` installs them), tests
// that need one skip.
#ifndef BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_
#define BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server::testing {

class PostgresServer {
 public:
  // The server of this test process. NOT_FOUND when PostgreSQL's binaries
  // are missing (a test skips with the message); INTERNAL, with the
  // server's log, when they fail.
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

  // A URL to a new, empty database on the server; its name is unique among
  // the processes sharing the server.
  absl::StatusOr<std::string> NewDatabase() {
    const std::string name = absl::StrCat("test_", getpid(), "_", ++databases_);
    if (absl::Status s = Exec(Url("postgres"), absl::StrCat("CREATE DATABASE ", name)); !s.ok()) {
      return s;
    }
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
    return absl::StrCat("postgresql:///", name, "?host=", folder_.string(),
                        "&port=5432&user=ballast");
  }

  ~PostgresServer() {
    if (own_) (void)std::system(absl::StrCat(Script(), " stop ", folder_.string()).c_str());
  }

 private:
  explicit PostgresServer(std::filesystem::path folder) : folder_(std::move(folder)) {}
  // A server of this process's own, in a new temporary folder.
  PostgresServer()
      : scratch_(std::make_unique<TempDir>()), folder_(scratch_->path() / "server"), own_(true) {
    // The server's user (not root) must reach its folder inside.
    std::filesystem::permissions(scratch_->path(), std::filesystem::perms::others_exec,
                                 std::filesystem::perm_options::add);
  }

  static std::string Script() {
    const char* source = std::getenv("BALLAST_SOURCE_DIR");
    return absl::StrCat(source != nullptr ? source : ".", "/tests/unit/server/postgres_server.sh");
  }

  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start() {
    if (const char* shared = std::getenv("BALLAST_TEST_POSTGRES");
        shared != nullptr && std::filesystem::exists(std::filesystem::path(shared) / "data")) {
      return std::unique_ptr<PostgresServer>(new PostgresServer(shared));
    }
    std::unique_ptr<PostgresServer> server(new PostgresServer());
    const std::string errors = (server->scratch_->path() / "start.err").string();
    const int rc = std::system(
        absl::StrCat(Script(), " start ", server->folder_.string(), " 2>", errors).c_str());
    std::stringstream message;
    message << std::ifstream(errors).rdbuf();
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) return absl::NotFoundError(message.str());
    if (rc != 0)
      return absl::InternalError(absl::StrCat("postgres_server.sh start: ", message.str()));
    // A test process that crashes or is killed runs no destructor: a
    // watcher stops the server once this process is gone.
    (void)std::system(absl::StrCat("sh -c 'while [ -d /proc/", getpid(), " ]; do sleep 1; done; ",
                                   Script(), " stop ", server->folder_.string(),
                                   "' >/dev/null 2>&1 &")
                          .c_str());
    return server;
  }

  // Holds the folder of a server of this process's own.
  const std::unique_ptr<TempDir> scratch_;
  const std::filesystem::path folder_;
  // Started by this process, which stops it.
  const bool own_ = false;
  int databases_ = 0;
};

// A fixture whose every case gets a new, empty database on the shared
// server (url_), and skips where PostgreSQL's binaries are missing.
class PostgresDatabaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> url = PostgresServer::NewSharedDatabase();
    if (absl::IsNotFound(url.status())) GTEST_SKIP() << url.status().message();
    ASSERT_TRUE(url.ok()) << url.status();
    url_ = *url;
  }

  std::string url_;
};

}  // namespace ballast::server::testing

#endif  // BALLAST_TESTS_UNIT_SERVER_POSTGRES_SERVER_H_
