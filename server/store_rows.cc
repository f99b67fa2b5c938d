#include "server/store_rows.h"

#include "absl/strings/str_cat.h"

namespace ballast::server {
namespace {

// The jobs.resume_at_or_before column: 0 has meant "no rollback pending"
// since the first schema, so a rollback to step 0 is stored as -1 and older
// stores read the same.
int64_t ResumeColumn(std::optional<int64_t> step) {
  if (!step) return 0;
  return *step == 0 ? -1 : *step;
}
std::optional<int64_t> ResumeFromColumn(int64_t value) {
  if (value == 0) return std::nullopt;
  return value < 0 ? 0 : value;
}

}  // namespace

JobRow EncodeJobRow(const StoreBatch::JobChange& change, int64_t retention) {
  const JobRecord& r = change.record;
  JobRow row;
  row.order = r.order;
  row.id = r.job.id();
  // Unique per tenant: two tenants may use the same idempotency key.
  if (!r.job.request_id().empty())
    row.request_id = ScopedRequestId(r.job.tenant(), r.job.request_id());
  row.state = r.job.state();
  row.priority = r.job.spec().scheduling().priority();
  row.attempt = r.attempt;
  row.resume_at_or_before = ResumeColumn(r.resume_at_or_before);
  row.events_deleted = r.events_deleted;
  row.job = r.job.SerializeAsString();
  row.tenant = r.job.tenant();
  row.evicted = r.evicted;
  if (!change.events.empty() && r.job.last_seq() > retention) {
    row.trim_events_through = r.job.last_seq() - retention;
  }
  return row;
}

absl::StatusOr<JobRecord> DecodeJobRow(int64_t order, int32_t attempt, int64_t resume_column,
                                       int64_t events_deleted, bool evicted, std::string_view job) {
  JobRecord r;
  r.order = order;
  r.attempt = attempt;
  r.resume_at_or_before = ResumeFromColumn(resume_column);
  r.events_deleted = events_deleted;
  r.evicted = evicted;
  if (!r.job.ParseFromArray(job.data(), static_cast<int>(job.size()))) {
    return absl::DataLossError(absl::StrCat("store: job row ", order, " does not parse"));
  }
  return r;
}

absl::Status RequestIdTaken(const v1::Job& job) {
  return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), ": request_id '", job.request_id(),
                                               "' belongs to another job"));
}

absl::Status CheckSchemaVersion(const std::string& where, int64_t found) {
  if (found == kSchemaVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      where, " holds schema version ", found, "; this ballastd reads version ", kSchemaVersion));
}

std::string RedactStoreUrl(std::string_view url) {
  std::string out(url);
  // scheme://user:password@host...
  if (const size_t scheme = out.find("://"); scheme != std::string::npos) {
    const size_t authority = scheme + 3;
    const size_t end = out.find_first_of("/?", authority);
    const size_t at = out.rfind('@', end == std::string::npos ? out.size() : end);
    if (at != std::string::npos && at >= authority) {
      const size_t colon = out.find(':', authority);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // ...?password=secret&...
  for (size_t key = out.find("password="); key != std::string::npos;
       key = out.find("password=", key + 1)) {
    const size_t value = key + 9;
    const size_t end = out.find('&', value);
    out.replace(value, (end == std::string::npos ? out.size() : end) - value, "***");
  }
  return out;
}

}  // namespace ballast::server
