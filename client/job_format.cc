#include "client/job_format.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/progress.h"

namespace ballast::client {

namespace {

constexpr absl::string_view kStatePrefix = "JOB_STATE_";

std::string Age(int64_t since_ms, int64_t now_ms) {
  if (since_ms <= 0) return "-";
  return FormatDuration(static_cast<double>(std::max<int64_t>(0, now_ms - since_ms)) / 1000.0);
}

std::string UtcTime(int64_t ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", absl::FromUnixMillis(ms), absl::UTCTimeZone());
}

}  // namespace

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (absl::StartsWith(name, kStatePrefix)) name.erase(0, kStatePrefix.size());
  return name;
}

absl::StatusOr<v1::JobState> ParseState(const std::string& text) {
  std::string name = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(name, kStatePrefix)) name = absl::StrCat(kStatePrefix, name);
  v1::JobState state;
  if (v1::JobState_Parse(name, &state) && state != v1::JOB_STATE_UNSPECIFIED) return state;
  std::vector<std::string> names;
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    names.push_back(absl::AsciiStrToLower(StateName(static_cast<v1::JobState>(s))));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--state: unknown state '", text, "'; one of ", absl::StrJoin(names, ", ")));
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& given_rows) {
  // Names and ids come from other users and workers: never let their bytes
  // move the cursor or forge a row.
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : given_rows) {
    std::vector<std::string>& printable = rows.emplace_back();
    for (const std::string& cell : row) printable.push_back(Printable(cell));
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  auto append_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  };
  append_row(header);
  for (const auto& row : rows) append_row(row);
  return out;
}

std::string JobTable(const std::vector<v1::Job>& jobs, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : jobs) {
    rows.push_back({job.id(), StateName(job.state()),
                    job.spec().name().empty() ? "-" : job.spec().name(),
                    absl::StrCat(job.step(), "/", job.spec().max_steps()),
                    FormatLoss(job.last_step()), Age(job.created_ms(), now_ms)});
  }
  return RenderTable({"ID", "STATE", "NAME", "STEP", "LOSS", "AGE"}, rows);
}

std::string WorkerTable(const std::vector<v1::Worker>& workers, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Worker& w : workers) {
    const std::string heartbeat =
        w.last_heartbeat_ms() > 0 ? Age(w.last_heartbeat_ms(), now_ms) + " ago" : "-";
    rows.push_back({w.id(), w.host(), w.device_kind(), absl::StrCat(w.busy(), "/", w.capacity()),
                    w.alive() ? "yes" : "no", heartbeat});
  }
  return RenderTable({"ID", "HOST", "KIND", "BUSY/CAP", "ALIVE", "LAST HEARTBEAT"}, rows);
}

std::string RoleName(v1::Role role) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::Role_Name(role), "ROLE_"));
}

std::string TokenTable(const std::vector<v1::Token>& tokens, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Token& t : tokens) {
    rows.push_back({t.id(), RoleName(t.role()),
                    t.role() == v1::ROLE_WORKER ? t.worker_id() : t.tenant(),
                    Age(t.created_ms(), now_ms) + " ago",
                    t.revoked_ms() > 0 ? Age(t.revoked_ms(), now_ms) + " ago" : "-",
                    t.description().empty() ? "-" : t.description()});
  }
  return RenderTable({"ID", "ROLE", "TENANT/WORKER", "CREATED", "REVOKED", "DESCRIPTION"}, rows);
}

std::string JobDetail(const v1::Job& job, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows;
  auto add = [&](std::string key, std::string value) {
    rows.push_back({std::move(key), std::move(value)});
  };
  add("STATE", StateName(job.state()));
  if (!job.spec().name().empty()) add("NAME", job.spec().name());
  if (!job.tenant().empty()) add("TENANT", job.tenant());
  add("STEP", absl::StrCat(job.step(), "/", job.spec().max_steps()));
  add("CHECKPOINT", job.checkpoint_step() > 0 ? absl::StrCat(job.checkpoint_step()) : "-");
  add("RESTARTS", absl::StrCat(job.restarts()));
  if (job.guard_rollbacks() > 0 || job.skipped_steps() > 0 || !job.anomalies().empty()) {
    // Sorted, for a stable line (the proto map has no order).
    std::map<std::string, int64_t> anomalies(job.anomalies().begin(), job.anomalies().end());
    std::vector<std::string> kinds;
    for (const auto& [kind, n] : anomalies) kinds.push_back(absl::StrCat(kind, " ", n));
    add("GUARD", absl::StrCat(job.guard_rollbacks(), " rollbacks, ", job.skipped_steps(),
                              " skipped steps; anomalies: ",
                              kinds.empty() ? "none" : absl::StrJoin(kinds, ", ")));
  }
  if (job.has_last_guard_event()) add("LAST GUARD", GuardLine(job.last_guard_event()));
  if (job.has_data()) add("DATA", DataLine(job.data()));
  if (job.has_last_eval()) add("EVAL", EvalLine(job.last_eval()));
  if (job.has_end()) {
    if (!job.end().stop_reason().empty()) add("STOPPED", job.end().stop_reason());
    add("EXPORTED",
        absl::StrCat("step ", job.end().exported_step(), ": ", job.end().export_reason()));
  }
  if (job.created_ms() > 0) {
    add("CREATED",
        absl::StrCat(UtcTime(job.created_ms()), " (", Age(job.created_ms(), now_ms), " ago)"));
  }
  if (job.updated_ms() > 0) add("UPDATED", UtcTime(job.updated_ms()));
  if (!job.output_dir().empty()) add("OUTPUT", job.output_dir());
  for (const v1::RankPlacement& p : job.placement()) {
    // A gang's ranks end one by one; those already gone say how.
    add(absl::StrCat("RANK ", p.rank()),
        absl::StrCat(p.worker_id(), " device ", p.device(),
                     p.has_exit_code() ? absl::StrCat(", exited ", p.exit_code()) : ""));
  }
  if (!job.failure_reason().empty()) add("FAILURE", job.failure_reason());
  add("EVENTS", absl::StrCat(job.last_seq()));
  if (!job.request_id().empty()) add("REQUEST", job.request_id());
  return RenderTable({"ID", job.id()}, rows);
}

std::string LogLineText(const v1::LogLine& log) {
  if (log.level().empty() || log.level() == "info") {
    return absl::StrCat("[rank ", log.rank(), "] ", log.text());
  }
  return absl::StrCat("[rank ", log.rank(), "] ", log.level(), ": ", log.text());
}

std::string GuardLine(const v1::GuardEvent& g) {
  std::string line;
  switch (g.kind()) {
    case v1::GuardEvent::KIND_SKIP:
      line = absl::StrCat("guard skip at step ", g.step());
      break;
    case v1::GuardEvent::KIND_ROLLBACK:
      line = absl::StrCat("guard rollback at step ", g.step(), " to step ", g.to_step());
      break;
    case v1::GuardEvent::KIND_DIAGNOSIS:
      line = absl::StrCat("guard diagnosis at step ", g.step());
      break;
    case v1::GuardEvent::KIND_RECOVERED:
      line = absl::StrCat("guard recovered step ", g.step());
      break;
    case v1::GuardEvent::KIND_CHECKPOINT_REFUSED:
      line = absl::StrCat("guard refused checkpoint ", g.step());
      break;
    default:
      line = absl::StrCat("guard event at step ", g.step());
  }
  // The facts first, in a fixed order, so that a reader (or grep) finds them
  // without parsing the message.
  std::vector<std::string> facts;
  if (!g.trigger().empty()) facts.push_back(g.trigger());
  switch (g.verdict()) {
    case v1::GuardEvent::VERDICT_TRANSIENT:
      facts.push_back("transient");
      break;
    case v1::GuardEvent::VERDICT_DETERMINISTIC:
      facts.push_back("deterministic");
      break;
    default:
      break;
  }
  if (!g.module().empty()) facts.push_back(absl::StrCat(g.module(), " on rank ", g.rank()));
  if (g.steps_lost() > 0) facts.push_back(absl::StrCat(g.steps_lost(), " steps lost"));
  if (g.documents_skipped() > 0) {
    facts.push_back(absl::StrCat(g.documents_skipped(), " documents skipped from position ",
                                 g.first_document()));
  }
  if (!facts.empty()) absl::StrAppend(&line, " [", absl::StrJoin(facts, ", "), "]");
  if (!g.message().empty()) absl::StrAppend(&line, ": ", g.message());
  return line;
}

std::string DataLine(const v1::DataReport& d) {
  std::string line = absl::StrCat("data epoch ", d.epoch(), ": ", d.format());
  if (!d.template_().empty()) absl::StrAppend(&line, " (", d.template_(), ")");
  absl::StrAppend(&line, ", ", d.documents(), " documents of ", d.records(), " records, ",
                  d.tokens(), " tokens (", d.trained_tokens(), " trained), ", d.rows(),
                  " rows, packing ", absl::StrFormat("%.1f%%", 100 * d.packing_efficiency()));
  std::vector<std::string> losses;
  if (d.skipped_records() > 0) {
    losses.push_back(absl::StrCat(d.skipped_records(), " bad records skipped"));
  }
  if (d.cut_documents() > 0) losses.push_back(absl::StrCat(d.cut_documents(), " cut"));
  if (d.dropped_documents() > 0) losses.push_back(absl::StrCat(d.dropped_documents(), " dropped"));
  // Before the losses, which the first bad record's example follows.
  if (d.special_token_records() > 0) {
    absl::StrAppend(&line, "; ", d.special_token_records(), " records with special-token text, as ",
                    d.special_tokens_allowed() ? "special tokens" : "plain text");
  }
  if (!losses.empty()) absl::StrAppend(&line, "; ", absl::StrJoin(losses, ", "));
  if (!d.bad_record_examples().empty()) {
    absl::StrAppend(&line, "; first: ", d.bad_record_examples(0));
  }
  return line;
}

std::string EvalLine(const v1::EvalReport& e) {
  std::string line = e.has_loss()
                         ? absl::StrFormat("eval step %d: loss %.4f over %d supervised tokens",
                                           e.step(), e.loss(), e.supervised_tokens())
                         : absl::StrFormat("eval step %d: MRR@10 %.4f, NDCG@10 %.4f over %d groups",
                                           e.step(), e.mrr_at_10(), e.ndcg_at_10(), e.groups());
  if (e.best()) absl::StrAppend(&line, " (the best so far)");
  return line;
}

std::string EndLine(const v1::TrainingEnd& end) {
  return absl::StrCat(
      end.stop_reason().empty() ? absl::StrCat("trained to step ", end.step()) : end.stop_reason(),
      "; exported step ", end.exported_step(), " (", end.export_reason(), ")");
}

namespace {

// EventLine before escaping.
std::optional<std::string> UnescapedEventLine(const v1::JobEvent& event) {
  if (event.has_state_change()) {
    const v1::StateChange& c = event.state_change();
    std::string line = c.from() == v1::JOB_STATE_UNSPECIFIED
                           ? absl::StrCat("state ", StateName(c.to()))
                           : absl::StrCat("state ", StateName(c.from()), " -> ", StateName(c.to()));
    if (!c.reason().empty()) absl::StrAppend(&line, ": ", c.reason());
    return line;
  }
  const v1::TrainingEvent& training = event.training();
  switch (training.kind_case()) {
    case v1::TrainingEvent::kGuard:
      return GuardLine(training.guard());
    case v1::TrainingEvent::kData:
      return DataLine(training.data());
    case v1::TrainingEvent::kEval:
      return EvalLine(training.eval());
    case v1::TrainingEvent::kEnd:
      return EndLine(training.end());
    case v1::TrainingEvent::kCheckpointSaved:
      return absl::StrCat("checkpoint step ", training.checkpoint_saved().step(), ": ",
                          training.checkpoint_saved().path());
    case v1::TrainingEvent::kLog:
      if (training.log().level() == "warning" || training.log().level() == "error") {
        return LogLineText(training.log());
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<std::string> EventLine(const v1::JobEvent& event) {
  std::optional<std::string> line = UnescapedEventLine(event);
  if (line) *line = Printable(*line);
  return line;
}

std::string FinalLine(const v1::Job& job) {
  std::string line = absl::StrCat(job.id(), " ", StateName(job.state()));
  if (!job.failure_reason().empty() && job.state() != v1::JOB_STATE_SUCCEEDED) {
    absl::StrAppend(&line, ": ", job.failure_reason());
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED && !job.end().stop_reason().empty()) {
    absl::StrAppend(&line, ": ", job.end().stop_reason());
  }
  return Printable(line);
}

}  // namespace ballast::client
