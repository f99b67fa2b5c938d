#include "common/rank_event_bound.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace ballast {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The last `limit` bytes of `text` or fewer, starting on a character.
std::string LastBytes(const std::string& text, size_t limit) {
  size_t begin = text.size() - limit;
  while (begin < text.size() && IsUtf8Continuation(text[begin])) ++begin;
  return text.substr(begin);
}

}  // namespace

bool BoundRankEvent(v1::RankEvent* event) {
  if (event->has_exited()) {
    bool changed = false;
    std::string* tail = event->mutable_exited()->mutable_stderr_tail();
    if (tail->size() > kMaxStderrTailBytes) {
      *tail = LastBytes(*tail, kMaxStderrTailBytes);
      changed = true;
    }
    // Fields this build does not know may still make it large; the exit
    // itself must arrive.
    if (event->ByteSizeLong() > kMaxRankEventBytes) {
      event->DiscardUnknownFields();
      changed = true;
    }
    return changed;
  }
  const size_t bytes = event->ByteSizeLong();
  if (bytes <= kMaxRankEventBytes) return false;
  // A kind this build does not know has no name here.
  std::string kind = "rank";
  if (event->has_training()) {
    const google::protobuf::FieldDescriptor* field =
        v1::TrainingEvent::descriptor()->FindFieldByNumber(event->training().kind_case());
    kind = field != nullptr ? field->name() : "training";
  }
  // Built anew: unknown fields (a newer trainer's kinds) would keep the size.
  v1::RankEvent note;
  note.set_job_id(event->job_id());
  note.set_attempt(event->attempt());
  note.set_rank(event->rank());
  v1::LogLine* log = note.mutable_training()->mutable_log();
  log->set_rank(event->rank());
  log->set_level("warning");
  log->set_text(absl::StrCat("dropped a ", kind, " event of ", bytes, " bytes from rank ",
                             event->rank(), ": one event is at most ", kMaxRankEventBytes,
                             " bytes"));
  *event = std::move(note);
  return true;
}

}  // namespace ballast
