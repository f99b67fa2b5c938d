#include "server/store_migration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/store_rows.h"
#include "tests/unit/server/postgres_server.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::PostgresDatabaseTest;
using testing::PostgresServer;
using testing::TempDir;

JobRecord MakeJob(const std::string& id, int64_t order, v1::JobState state) {
  JobRecord r;
  r.order = order;
  r.job.set_id(id);
  r.job.set_state(state);
  r.job.set_tenant(kDefaultTenant);
  r.job.mutable_spec()->set_name(id + "-name");
  return r;
}

std::vector<v1::JobEvent> MakeEvents(const std::string& job_id, int64_t first, int64_t last) {
  std::vector<v1::JobEvent> events;
  for (int64_t seq = first; seq <= last; ++seq) {
    v1::JobEvent& e = events.emplace_back();
    e.set_job_id(job_id);
    e.set_seq(seq);
    e.mutable_training()->mutable_log()->set_text(absl::StrCat("line ", seq));
  }
  return events;
}

TokenRecord MakeToken(const std::string& id, int64_t created_ms) {
  TokenRecord t;
  t.token.set_id(id);
  t.token.set_created_ms(created_ms);
  t.token.set_tenant(kDefaultTenant);
  t.secret_sha256 = std::string(32, static_cast<char>(created_ms));
  return t;
}

// A store as a ballastd leaves one: a queued job, a running one with events
// and a worker, an evicted one whose oldest events retention deleted, with a
// request_id in another tenant, and two tokens.
void Fill(Store& store, const std::string& last_log_line = "line 9") {
  StoreBatch batch;
  batch.jobs.push_back({MakeJob("job-a", 1, v1::JOB_STATE_QUEUED), {}});
  JobRecord running = MakeJob("job-b", 2, v1::JOB_STATE_RUNNING);
  running.attempt = 2;
  running.resume_at_or_before = 0;
  running.job.set_last_seq(9);
  std::vector<v1::JobEvent> events = MakeEvents("job-b", 1, 9);
  events.back().mutable_training()->mutable_log()->set_text(last_log_line);
  batch.jobs.push_back({running, events});
  JobRecord evicted = MakeJob("job-c", 3, v1::JOB_STATE_CANCELLED);
  evicted.job.set_tenant("team-1");
  evicted.job.set_request_id("req-1");
  evicted.job.set_last_seq(6);
  evicted.events_deleted = 3;
  evicted.evicted = true;
  batch.jobs.push_back({evicted, MakeEvents("job-c", 4, 6)});
  WorkerRecord& w = batch.workers.emplace_back();
  w.worker.set_id("worker-1");
  w.worker.set_capacity(4);
  w.last_report_id = 42;
  const StoreBatch* batches[] = {&batch};
  ASSERT_TRUE(store.Write(batches, 100).ok());
  ASSERT_TRUE(store.PutToken(MakeToken("tok-1", 1000)).ok());
  ASSERT_TRUE(store.PutToken(MakeToken("tok-2", 2000)).ok());
}

// Copies need a PostgreSQL database: each case takes new ones.
class StoreMigrationTest : public PostgresDatabaseTest {
 protected:
  std::string Sqlite(const std::string& name) const {
    return "sqlite:" + (dir_.path() / name).string();
  }

  // A new SQLite store filled by Fill, closed again.
  std::string FilledSqlite(const std::string& name) {
    const std::string url = Sqlite(name);
    auto store = Store::Open(url);
    EXPECT_TRUE(store.ok()) << store.status();
    if (store.ok()) Fill(**store);
    return url;
  }

  TempDir dir_;
};

TEST_F(StoreMigrationTest, CopiesSqliteToPostgresqlAndBackWithEqualRowsAndChecksums) {
  const std::string source = FilledSqlite("source.db");
  // Three rows a transaction: job-b's nine events span writes.
  absl::StatusOr<MigrationReport> there =
      MigrateStore(source, url_, {.allow_non_empty = false, .rows_per_write = 3});
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_TRUE(there->verified()) << FormatMigrationReport(*there);
  ASSERT_EQ(there->source.size(), 4u);
  const int64_t rows[] = {3, 12, 1, 2};
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(there->target[i].rows, rows[i]) << there->target[i].table;

  {
    auto pg = Store::Open(url_);
    ASSERT_TRUE(pg.ok()) << pg.status();
    auto jobs = (*pg)->LoadJobs();
    ASSERT_TRUE(jobs.ok());
    ASSERT_EQ(jobs->size(), 2u);
    EXPECT_EQ((*jobs)[1].job.id(), "job-b");
    EXPECT_EQ((*jobs)[1].order, 2);
    EXPECT_EQ((*jobs)[1].attempt, 2);
    auto evicted = (*pg)->ReadJob("job-c");
    ASSERT_TRUE(evicted.ok() && evicted->has_value());
    EXPECT_TRUE((*evicted)->evicted);
    EXPECT_EQ((*evicted)->events_deleted, 3);
    EXPECT_EQ(**(*pg)->JobOfRequest(ScopedRequestId("team-1", "req-1")), "job-c");
    auto events = (*pg)->ReadEvents("job-c", 0, 10);
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), 3u);
    EXPECT_EQ((*events)[0].seq(), 4);
    EXPECT_EQ(*(*pg)->LastJobOrder(), 3);
    auto tokens = (*pg)->LoadTokens();
    ASSERT_TRUE(tokens.ok());
    ASSERT_EQ(tokens->size(), 2u);
    EXPECT_EQ((*tokens)[1].secret_sha256, std::string(32, static_cast<char>(2000)));
  }

  // And back: the checksums of a SQLite store copied through PostgreSQL are
  // those of the original.
  absl::StatusOr<MigrationReport> back = MigrateStore(url_, Sqlite("back.db"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->verified()) << FormatMigrationReport(*back);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back->target[i].checksum, there->source[i].checksum) << back->target[i].table;
  }
  EXPECT_THAT(FormatMigrationReport(*back), HasSubstr("events"));
  EXPECT_THAT(FormatMigrationReport(*back), Not(HasSubstr("MISMATCH")));
}

TEST_F(StoreMigrationTest, ChecksumsTellStoresThatDifferInOneEventApart) {
  const std::string a = FilledSqlite("a.db");
  const std::string b = Sqlite("b.db");
  {
    auto store = Store::Open(b);
    ASSERT_TRUE(store.ok());
    Fill(**store, "line 9, otherwise");
  }
  auto summary = [](const std::string& url) {
    auto store = Store::Open(url);
    EXPECT_TRUE(store.ok()) << store.status();
    auto s = SummarizeStore(**store);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  const std::vector<TableSummary> left = summary(a);
  const std::vector<TableSummary> right = summary(b);
  EXPECT_EQ(left[0].checksum, right[0].checksum);  // jobs
  EXPECT_EQ(left[1].rows, right[1].rows);
  EXPECT_NE(left[1].checksum, right[1].checksum);  // events
  // The report says which table differs.
  const MigrationReport report{.source = left, .target = right};
  EXPECT_FALSE(report.verified());
  EXPECT_THAT(FormatMigrationReport(report),
              HasSubstr(absl::StrCat("MISMATCH: target ", right[1].checksum)));
}

TEST_F(StoreMigrationTest, ANonEmptyTargetIsRefusedNamingWhatItHolds) {
  const std::string source = FilledSqlite("source.db");
  {
    auto target = Store::Open(url_);
    ASSERT_TRUE(target.ok());
    StoreBatch batch;
    // After the source's orders: a store whose orders collide with the
    // source's cannot take its jobs (ord is the jobs' key).
    batch.jobs.push_back({MakeJob("job-z", 10, v1::JOB_STATE_QUEUED), {}});
    const StoreBatch* batches[] = {&batch};
    ASSERT_TRUE((*target)->Write(batches, 100).ok());
    ASSERT_TRUE((*target)->PutToken(MakeToken("tok-z", 5)).ok());
  }
  absl::StatusOr<MigrationReport> refused = MigrateStore(source, url_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("is not empty: it holds 1 job, 1 token"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--allow-non-empty"));

  // Allowed, the copy lands beside job-z, and the check says the tables differ.
  absl::StatusOr<MigrationReport> over = MigrateStore(source, url_, {.allow_non_empty = true});
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_FALSE(over->verified());
  EXPECT_EQ(over->target[0].rows, 4);
}

TEST_F(StoreMigrationTest, AStoreThatABallastdHasOpenIsRefused) {
  const std::string source = FilledSqlite("source.db");
  {
    auto open = Store::Open(source);
    ASSERT_TRUE(open.ok());
    absl::StatusOr<MigrationReport> r = MigrateStore(source, url_);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("source store sqlite:"));
    EXPECT_THAT(r.status().message(), HasSubstr("a running ballastd?"));
  }
  {
    auto open = Store::Open(url_);
    ASSERT_TRUE(open.ok());
    absl::StatusOr<MigrationReport> r = MigrateStore(source, url_);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("target store postgresql://"));
    EXPECT_THAT(r.status().message(), HasSubstr("2 connection(s) of ballastd"));
  }
  // Closed, both are free.
  absl::StatusOr<MigrationReport> r = MigrateStore(source, url_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->verified());
}

TEST_F(StoreMigrationTest, BadUrlsAreRefusedByName) {
  const std::string source = FilledSqlite("source.db");
  absl::Status scheme = MigrateStore(source, "mysql://root:hunter2@db/ballast").status();
  EXPECT_EQ(scheme.code(), absl::StatusCode::kInvalidArgument) << scheme;
  EXPECT_THAT(scheme.message(), HasSubstr("target store: 'mysql://root:***@db/ballast'"));
  EXPECT_EQ(MigrateStore(source, source).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status missing = MigrateStore(Sqlite("nothing.db"), url_).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "nothing.db"));
  // No server listens on this socket folder.
  absl::Status unreachable =
      MigrateStore(source, absl::StrCat("postgresql://ballast:hunter2@/ballast?host=",
                                        (dir_.path() / "none").string(), "&port=5432"))
          .status();
  EXPECT_EQ(unreachable.code(), absl::StatusCode::kUnavailable) << unreachable;
  EXPECT_THAT(unreachable.message(), HasSubstr("target store postgresql://ballast:***@/ballast"));
  EXPECT_THAT(unreachable.message(), Not(HasSubstr("hunter2")));
}

}  // namespace
}  // namespace ballast::server
