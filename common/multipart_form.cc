#include "common/multipart_form.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ballast {
namespace {

constexpr size_t kMaxBoundary = 70;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("multipart/form-data: ", what));
}

// A header parameter's value: `"quoted"` (with \-escapes) or a bare token.
// False when a quote is not closed.
bool ParameterValue(absl::string_view raw, std::string* out) {
  raw = absl::StripAsciiWhitespace(raw);
  out->clear();
  if (!absl::ConsumePrefix(&raw, "\"")) {
    *out = std::string(raw);
    return true;
  }
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\\' && i + 1 < raw.size()) {
      out->push_back(raw[++i]);
    } else if (raw[i] == '"') {
      return absl::StripAsciiWhitespace(raw.substr(i + 1)).empty();
    } else {
      out->push_back(raw[i]);
    }
  }
  return false;
}

// The parameters after a header value's first `;`, by lower-case name.
// Splits at `;` outside quotes.
absl::Status Parameters(absl::string_view value,
                        std::vector<std::pair<std::string, std::string>>* out) {
  bool quoted = false;
  size_t start = 0;
  std::vector<absl::string_view> items;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i == value.size() || (value[i] == ';' && !quoted)) {
      items.push_back(value.substr(start, i - start));
      start = i + 1;
    } else if (value[i] == '\\' && quoted) {
      ++i;
    } else if (value[i] == '"') {
      quoted = !quoted;
    }
  }
  for (size_t i = 1; i < items.size(); ++i) {
    const absl::string_view item = absl::StripAsciiWhitespace(items[i]);
    if (item.empty()) continue;
    const size_t equals = item.find('=');
    if (equals == absl::string_view::npos)
      return Bad(absl::StrCat("parameter without '=': ", item));
    std::string parsed;
    if (!ParameterValue(item.substr(equals + 1), &parsed)) {
      return Bad(absl::StrCat("unclosed quote in parameter ", item.substr(0, equals)));
    }
    out->emplace_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(item.substr(0, equals))),
                      std::move(parsed));
  }
  return absl::OkStatus();
}

// The headers of one part (CRLF-separated lines) into *part.
absl::Status ReadPartHead(absl::string_view head, FormPart* part) {
  bool disposition = false;
  for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return Bad("a part's header line has no 'Name:'");
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Type")) {
      part->content_type = std::string(value);
    } else if (absl::EqualsIgnoreCase(name, "Content-Disposition")) {
      if (disposition) return Bad("a part has two Content-Disposition headers");
      disposition = true;
      const absl::string_view kind = absl::StripAsciiWhitespace(value.substr(0, value.find(';')));
      if (!absl::EqualsIgnoreCase(kind, "form-data")) {
        return Bad(absl::StrCat("Content-Disposition is '", kind, "', not form-data"));
      }
      std::vector<std::pair<std::string, std::string>> parameters;
      if (absl::Status s = Parameters(value, &parameters); !s.ok()) return s;
      for (auto& [key, parsed] : parameters) {
        if (key == "name") part->name = std::move(parsed);
        if (key == "filename") part->filename = std::move(parsed);
      }
    }
  }
  if (!disposition || part->name.empty()) {
    return Bad("a part has no 'Content-Disposition: form-data; name=...'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> FormBoundary(absl::string_view content_type) {
  const absl::string_view type =
      absl::StripAsciiWhitespace(content_type.substr(0, content_type.find(';')));
  if (!absl::EqualsIgnoreCase(type, "multipart/form-data")) {
    return absl::InvalidArgumentError(absl::StrCat("Content-Type is '", content_type.substr(0, 100),
                                                   "'; an upload is multipart/form-data"));
  }
  std::vector<std::pair<std::string, std::string>> parameters;
  if (absl::Status s = Parameters(content_type, &parameters); !s.ok()) return s;
  for (const auto& [key, value] : parameters) {
    if (key != "boundary") continue;
    if (value.empty() || value.size() > kMaxBoundary) {
      return Bad(absl::StrCat("the boundary has ", value.size(), " characters; allowed 1..70"));
    }
    return value;
  }
  return Bad("Content-Type has no boundary parameter");
}

absl::StatusOr<std::vector<FormPart>> ParseMultipartForm(absl::string_view content_type,
                                                         absl::string_view body) {
  absl::StatusOr<std::string> boundary = FormBoundary(content_type);
  if (!boundary.ok()) return boundary.status();
  const std::string first = absl::StrCat("--", *boundary);
  const std::string delimiter = absl::StrCat("\r\n--", *boundary);
  // A preamble before the first delimiter is allowed, and ignored (RFC 2046).
  size_t at = 0;
  if (!absl::StartsWith(body, first)) {
    at = body.find(delimiter);
    if (at == absl::string_view::npos) return Bad("no boundary delimiter in the body");
    at += 2;
  }
  at += first.size();
  std::vector<FormPart> parts;
  while (true) {
    absl::string_view rest = body.substr(at);
    if (absl::StartsWith(rest, "--")) break;  // the close delimiter
    // Transport padding (spaces or tabs) may follow a delimiter.
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    if (!absl::ConsumePrefix(&rest, "\r\n")) return Bad("a delimiter is not followed by CRLF");
    if (parts.size() == kMaxParts) return Bad(absl::StrCat("more than ", kMaxParts, " parts"));
    const size_t head_end = rest.find("\r\n\r\n");
    if (head_end == absl::string_view::npos || head_end > kMaxPartHeadBytes) {
      return Bad(absl::StrCat("a part's headers do not end (with an empty line) within ",
                              kMaxPartHeadBytes, " bytes"));
    }
    FormPart part;
    if (absl::Status s = ReadPartHead(rest.substr(0, head_end), &part); !s.ok()) return s;
    const absl::string_view data = rest.substr(head_end + 4);
    const size_t end = data.find(delimiter);
    if (end == absl::string_view::npos)
      return Bad("the body ends inside a part, without a delimiter");
    part.data = data.substr(0, end);
    parts.push_back(std::move(part));
    at = static_cast<size_t>(data.data() + end - body.data()) + delimiter.size();
  }
  return parts;
}

}  // namespace ballast
