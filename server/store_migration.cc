#include "server/store_migration.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/crypto.h"
#include "server/store_rows.h"

namespace ballast::server {
namespace {

// Rows read from a store at a time.
constexpr int kPage = 1000;
// A retention no job reaches: the copy deletes no event.
constexpr int64_t kKeepEveryEvent = std::numeric_limits<int64_t>::max();

// The columns of one row, each length-prefixed so no two rows encode alike.
class RowEncoding {
 public:
  RowEncoding& Int(int64_t value) { return Bytes(absl::StrCat(value)); }
  RowEncoding& Bytes(absl::string_view bytes) {
    absl::StrAppend(&out_, bytes.size(), ":", bytes);
    return *this;
  }
  // Deterministic: map fields in key order, so a message parsed and written
  // again (as the copy does) encodes as before.
  RowEncoding& Message(const google::protobuf::MessageLite& message) {
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream stream(&bytes);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      message.SerializeToCodedStream(&coded);
    }
    return Bytes(bytes);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

// The sum, modulo 2^256, of the SHA-256 of rows: independent of their order,
// so the jobs in memory and the evicted ones can be read in any order.
class DigestSum {
 public:
  void Add(const RowEncoding& row) {
    const std::string digest = Sha256(row.str());
    int carry = 0;
    for (int i = static_cast<int>(sum_.size()) - 1; i >= 0; --i) {
      const int v = sum_[i] + static_cast<uint8_t>(digest[i]) + carry;
      sum_[i] = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;
    }
    ++rows_;
  }
  TableSummary Summary(std::string table) const {
    return TableSummary{.table = std::move(table),
                        .rows = rows_,
                        .checksum = absl::BytesToHexString(absl::string_view(
                            reinterpret_cast<const char*>(sum_.data()), sum_.size()))};
  }

 private:
  std::array<uint8_t, 32> sum_{};
  int64_t rows_ = 0;
};

// Calls `each` with every job of `store`: those in memory in submission
// order, then the evicted ones newest first.
absl::Status ForEachJob(Store& store, const std::function<absl::Status(const JobRecord&)>& each) {
  absl::StatusOr<std::vector<JobRecord>> live = store.LoadJobs();
  if (!live.ok()) return live.status();
  for (const JobRecord& r : *live) {
    if (absl::Status s = each(r); !s.ok()) return s;
  }
  int64_t before = std::numeric_limits<int64_t>::max();
  while (true) {
    absl::StatusOr<std::vector<JobRecord>> page = store.ListEvictedJobs(before, {}, "", kPage);
    if (!page.ok()) return page.status();
    for (const JobRecord& r : *page) {
      if (absl::Status s = each(r); !s.ok()) return s;
    }
    if (page->size() < kPage) return absl::OkStatus();
    before = page->back().order;
  }
}

// Calls `each` with the events of `job_id` in seq order, `limit` at a time.
absl::Status ForEachEventPage(Store& store, const std::string& job_id, int limit,
                              const std::function<absl::Status(std::vector<v1::JobEvent>)>& each) {
  int64_t after = std::numeric_limits<int64_t>::min();
  while (true) {
    absl::StatusOr<std::vector<v1::JobEvent>> page = store.ReadEvents(job_id, after, limit);
    if (!page.ok()) return page.status();
    if (page->empty()) return absl::OkStatus();
    const bool last = static_cast<int>(page->size()) < limit;
    after = page->back().seq();
    if (absl::Status s = each(*std::move(page)); !s.ok()) return s;
    if (last) return absl::OkStatus();
  }
}

// "3 jobs, 1 worker" for what `store` holds; empty when it holds nothing.
absl::StatusOr<std::string> DescribeRows(Store& store) {
  absl::StatusOr<std::vector<JobRecord>> live = store.LoadJobs();
  if (!live.ok()) return live.status();
  absl::StatusOr<std::map<int, int64_t>> evicted = store.CountEvictedJobs();
  if (!evicted.ok()) return evicted.status();
  int64_t jobs = static_cast<int64_t>(live->size());
  for (const auto& [state, count] : *evicted) jobs += count;
  absl::StatusOr<std::vector<WorkerRecord>> workers = store.LoadWorkers();
  if (!workers.ok()) return workers.status();
  absl::StatusOr<std::vector<TokenRecord>> tokens = store.LoadTokens();
  if (!tokens.ok()) return tokens.status();
  std::string out;
  const std::pair<int64_t, const char*> counts[] = {
      {jobs, "job"},
      {static_cast<int64_t>(workers->size()), "worker"},
      {static_cast<int64_t>(tokens->size()), "token"}};
  for (const auto& [count, noun] : counts) {
    if (count == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", count, " ", noun, count == 1 ? "" : "s");
  }
  return out;
}

// `s` with `side` ("source", "target") in front of its message.
absl::Status OnSide(const char* side, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(side, " ", s.message()));
}

// Copies every job with its events, then the workers and tokens, of `from`
// into `to`, rows_per_write rows per transaction.
absl::Status Copy(Store& from, Store& to, int64_t rows_per_write) {
  StoreBatch batch;
  int64_t rows = 0;
  auto flush = [&]() -> absl::Status {
    if (batch.jobs.empty() && batch.workers.empty()) return absl::OkStatus();
    const StoreBatch* batches[] = {&batch};
    absl::Status s = to.Write(batches, kKeepEveryEvent);
    batch = StoreBatch();
    rows = 0;
    return s;
  };
  auto add = [&](const JobRecord& record, std::vector<v1::JobEvent> events) -> absl::Status {
    rows += std::max<int64_t>(1, static_cast<int64_t>(events.size()));
    batch.jobs.push_back({.record = record, .events = std::move(events)});
    return rows >= rows_per_write ? flush() : absl::OkStatus();
  };
  const int page = static_cast<int>(std::clamp<int64_t>(rows_per_write, 1, kPage));
  absl::Status copied = ForEachJob(from, [&](const JobRecord& record) -> absl::Status {
    bool any = false;
    // A job with more events than a page is written once per page; each
    // write replaces its row with the same one.
    absl::Status s = ForEachEventPage(from, record.job.id(), page,
                                      [&](std::vector<v1::JobEvent> events) -> absl::Status {
                                        any = true;
                                        return add(record, std::move(events));
                                      });
    if (!s.ok() || any) return s;
    return add(record, {});
  });
  if (!copied.ok()) return copied;
  absl::StatusOr<std::vector<WorkerRecord>> workers = from.LoadWorkers();
  if (!workers.ok()) return workers.status();
  batch.workers = *std::move(workers);
  if (absl::Status s = flush(); !s.ok()) return s;
  absl::StatusOr<std::vector<TokenRecord>> tokens = from.LoadTokens();
  if (!tokens.ok()) return tokens.status();
  for (const TokenRecord& token : *tokens) {
    if (absl::Status s = to.PutToken(token); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TableSummary>> SummarizeStore(Store& store) {
  DigestSum jobs;
  DigestSum events;
  absl::Status read = ForEachJob(store, [&](const JobRecord& record) -> absl::Status {
    // The columns as the store writes them, so a derived column (state,
    // tenant, request_id) that came out otherwise would show.
    const JobRow row = EncodeJobRow({.record = record}, kKeepEveryEvent);
    jobs.Add(RowEncoding()
                 .Int(row.order)
                 .Bytes(row.id)
                 .Bytes(row.request_id ? "+" + *row.request_id : "-")
                 .Int(row.state)
                 .Int(row.priority)
                 .Int(row.attempt)
                 .Int(row.resume_at_or_before)
                 .Int(row.events_deleted)
                 .Message(record.job)
                 .Bytes(row.tenant)
                 .Int(row.evicted ? 1 : 0));
    return ForEachEventPage(store, record.job.id(), kPage,
                            [&](std::vector<v1::JobEvent> page) -> absl::Status {
                              for (const v1::JobEvent& e : page) {
                                events.Add(RowEncoding().Bytes(e.job_id()).Int(e.seq()).Message(e));
                              }
                              return absl::OkStatus();
                            });
  });
  if (!read.ok()) return read;
  absl::StatusOr<std::vector<WorkerRecord>> workers = store.LoadWorkers();
  if (!workers.ok()) return workers.status();
  DigestSum worker_rows;
  for (const WorkerRecord& w : *workers) {
    worker_rows.Add(RowEncoding().Bytes(w.worker.id()).Int(w.last_report_id).Message(w.worker));
  }
  absl::StatusOr<std::vector<TokenRecord>> tokens = store.LoadTokens();
  if (!tokens.ok()) return tokens.status();
  DigestSum token_rows;
  for (const TokenRecord& t : *tokens) {
    token_rows.Add(RowEncoding()
                       .Bytes(t.token.id())
                       .Int(t.token.created_ms())
                       .Bytes(t.secret_sha256)
                       .Message(t.token));
  }
  return std::vector<TableSummary>{jobs.Summary("jobs"), events.Summary("events"),
                                   worker_rows.Summary("workers"), token_rows.Summary("tokens")};
}

bool MigrationReport::verified() const {
  if (source.size() != target.size()) return false;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i].rows != target[i].rows || source[i].checksum != target[i].checksum) return false;
  }
  return true;
}

absl::StatusOr<MigrationReport> MigrateStore(const std::string& from_url, const std::string& to_url,
                                             const MigrateOptions& options) {
  if (from_url == to_url) {
    return absl::InvalidArgumentError(
        absl::StrCat("source and target are the same store, ", RedactStoreUrl(from_url)));
  }
  for (const auto& [key, url] :
       {std::pair("source store", &from_url), std::pair("target store", &to_url)}) {
    if (absl::Status s = Store::CheckUrl(*url, key); !s.ok()) return s;
  }
  // Opening a SQLite store makes the file: a source that is not there would
  // be copied as an empty one.
  if (absl::StartsWith(from_url, "sqlite:") && !std::filesystem::exists(from_url.substr(7))) {
    return absl::NotFoundError(absl::StrCat("source ", from_url, ": no such file"));
  }
  for (const auto& [side, url] : {std::pair("source", &from_url), std::pair("target", &to_url)}) {
    if (absl::Status s = Store::CheckNotInUse(*url); !s.ok()) return OnSide(side, s);
  }
  absl::StatusOr<std::unique_ptr<Store>> from = Store::Open(from_url);
  if (!from.ok()) return OnSide("source", from.status());
  absl::StatusOr<std::unique_ptr<Store>> to = Store::Open(to_url);
  if (!to.ok()) return OnSide("target", to.status());
  if (!options.allow_non_empty) {
    absl::StatusOr<std::string> there = DescribeRows(**to);
    if (!there.ok()) return OnSide("target", there.status());
    if (!there->empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("target ", RedactStoreUrl(to_url), " is not empty: it holds ", *there,
                       "; copy into an empty store, or pass --allow-non-empty to copy over it "
                       "(rows with the same key are replaced)"));
    }
  }
  if (absl::Status s = Copy(**from, **to, options.rows_per_write); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("copying ", RedactStoreUrl(from_url), " to ", RedactStoreUrl(to_url),
                               " stopped: ", s.message(),
                               "; what was copied stays in the target (a rerun with "
                               "--allow-non-empty replaces it)"));
  }
  MigrationReport report;
  absl::StatusOr<std::vector<TableSummary>> source = SummarizeStore(**from);
  if (!source.ok()) return OnSide("source", source.status());
  absl::StatusOr<std::vector<TableSummary>> target = SummarizeStore(**to);
  if (!target.ok()) return OnSide("target", target.status());
  report.source = *std::move(source);
  report.target = *std::move(target);
  return report;
}

std::string FormatMigrationReport(const MigrationReport& report) {
  std::string out = absl::StrFormat("%-8s %12s %12s  %-64s  %s\n", "TABLE", "SOURCE ROWS",
                                    "TARGET ROWS", "CHECKSUM (SUM OF ROW SHA-256)", "CHECK");
  for (size_t i = 0; i < report.source.size() && i < report.target.size(); ++i) {
    const TableSummary& s = report.source[i];
    const TableSummary& t = report.target[i];
    const bool same = s.rows == t.rows && s.checksum == t.checksum;
    absl::StrAppendFormat(&out, "%-8s %12d %12d  %-64s  %s\n", s.table, s.rows, t.rows, s.checksum,
                          same ? "ok" : absl::StrCat("MISMATCH: target ", t.checksum));
  }
  return out;
}

}  // namespace ballast::server
