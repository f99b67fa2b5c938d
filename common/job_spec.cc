#include "common/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/printable.h"
#include "common/regular_file.h"
#include "common/spec_rules.h"

namespace ballast {
namespace {

constexpr size_t kMaxKeyParts = 8;

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

std::string AllowedKeys(const google::protobuf::Descriptor* desc) {
  std::vector<std::string> names;
  for (int i = 0; i < desc->field_count(); ++i) names.push_back(desc->field(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::Status TypeError(const std::string& path, const char* want, const YAML::Node& node) {
  std::string got = node.IsScalar()     ? absl::StrCat("'", node.Scalar(), "'")
                    : node.IsSequence() ? "a list"
                    : node.IsMap()      ? "a mapping"
                                        : "nothing";
  return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", want, ", got ", got));
}

// The byte offset of the first byte that breaks UTF-8 in `text`, or -1.
int64_t InvalidUtf8At(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > text.size()) return static_cast<int64_t>(i);
    uint32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xc0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (c & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
      return static_cast<int64_t>(i);
    }
    i += n;
  }
  return -1;
}

// Where `text` stops being UTF-8, as "line L, column C (byte B)" counted
// from 1, or nullopt when all of it is UTF-8.
std::optional<std::string> InvalidUtf8Place(absl::string_view text) {
  const int64_t at = InvalidUtf8At(text);
  if (at < 0) return std::nullopt;
  const absl::string_view before = text.substr(0, static_cast<size_t>(at));
  const size_t line_start = before.rfind('\n');
  const int64_t line = 1 + std::count(before.begin(), before.end(), '\n');
  const int64_t column =
      1 + static_cast<int64_t>(line_start == absl::string_view::npos ? at : at - line_start - 1);
  return absl::StrCat("line ", line, ", column ", column, " (byte ", at, ")");
}

// An integer in decimal, 0x hexadecimal or 0o octal, with an optional sign.
// A decimal with a leading zero is nullopt: YAML 1.1 tools (PyYAML,
// yaml-cpp) read "010" as eight and YAML 1.2 as ten, so a spec would mean
// one thing to the script that wrote it and another here.
std::optional<int64_t> ParseInteger(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  int base = 10;
  if (absl::ConsumePrefix(&text, "0x")) {
    base = 16;
  } else if (absl::ConsumePrefix(&text, "0o")) {
    base = 8;
  }
  if (text.empty() || (base == 10 && text.size() > 1 && text[0] == '0')) return std::nullopt;
  uint64_t magnitude = 0;
  for (char c : text) {
    const int digit = absl::ascii_isdigit(c)    ? c - '0'
                      : absl::ascii_isxdigit(c) ? absl::ascii_tolower(c) - 'a' + 10
                                                : 99;
    if (digit >= base) return std::nullopt;
    if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / base) return std::nullopt;
    magnitude = magnitude * base + digit;
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (magnitude > limit) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

// The integer `node` holds; INVALID_ARGUMENT naming `path` otherwise.
absl::StatusOr<int64_t> ReadInteger(const YAML::Node& node, const std::string& path) {
  if (const std::optional<int64_t> v = ParseInteger(node.Scalar())) return *v;
  absl::string_view digits = absl::StripAsciiWhitespace(node.Scalar());
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) digits.remove_prefix(1);
  if (digits.size() > 1 && digits[0] == '0' && absl::ascii_isdigit(digits[1])) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": '", node.Scalar(),
        "' has a leading zero, which YAML 1.1 reads as octal and YAML 1.2 as decimal; write it "
        "without the zero, or 0o for octal"));
  }
  return TypeError(path, "an integer", node);
}

// Converts one YAML scalar to the field's type and stores it (appends when repeated).
absl::Status SetScalar(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                       Message* msg) {
  const Reflection* r = msg->GetReflection();
  const bool rep = f->is_repeated();
  if (!node.IsScalar()) {
    return TypeError(
        path, f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? "a string" : "a scalar", node);
  }
  try {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        const absl::StatusOr<int64_t> v = ReadInteger(node, path);
        if (!v.ok()) return v.status();
        if (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": ", *v, " does not fit in 32 bits"));
        }
        rep ? r->AddInt32(msg, f, static_cast<int32_t>(*v))
            : r->SetInt32(msg, f, static_cast<int32_t>(*v));
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const absl::StatusOr<int64_t> v = ReadInteger(node, path);
        if (!v.ok()) return v.status();
        rep ? r->AddInt64(msg, f, *v) : r->SetInt64(msg, f, *v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        const absl::StatusOr<int64_t> v = ReadInteger(node, path);
        if (!v.ok()) return v.status();
        if (*v < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": must be >= 0, got ", node.Scalar()));
        }
        rep ? r->AddUInt64(msg, f, static_cast<uint64_t>(*v))
            : r->SetUInt64(msg, f, static_cast<uint64_t>(*v));
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
        rep ? r->AddDouble(msg, f, node.as<double>()) : r->SetDouble(msg, f, node.as<double>());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        rep ? r->AddBool(msg, f, node.as<bool>()) : r->SetBool(msg, f, node.as<bool>());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        // Protobuf strings are UTF-8; one that is not would fail far from
        // here, as an INTERNAL error without a word.
        if (const int64_t at = InvalidUtf8At(node.Scalar()); at >= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": not valid UTF-8 (at byte ", at, ")"));
        }
        rep ? r->AddString(msg, f, node.Scalar()) : r->SetString(msg, f, node.Scalar());
        break;
      default:
        return absl::InternalError(absl::StrCat(path, ": field type not supported in YAML"));
    }
  } catch (const YAML::BadConversion&) {
    const char* want = "a value";
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        want = "an integer";
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        want = "a number";
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        want = "true or false";
        break;
      default:
        break;
    }
    return TypeError(path, want, node);
  }
  return absl::OkStatus();
}

// Fills `msg` from a YAML mapping, field by field through the descriptor, so
// that an unknown key or a wrong type is reported with its dotted path.
absl::Status FillMessage(const YAML::Node& node, const std::string& path, Message* msg) {
  const google::protobuf::Descriptor* desc = msg->GetDescriptor();
  if (!node.IsMap()) return TypeError(path.empty() ? "spec" : path, "a mapping", node);
  const Reflection* r = msg->GetReflection();
  std::map<std::string, int> first_line;  // 1-based, as an editor counts
  for (const auto& kv : node) {
    // A complex key ("? {a: 1}") is a mapping or a list; as<std::string>
    // would throw on it.
    if (!kv.first.IsScalar()) {
      return TypeError(Join(path, "<key>"), "a key that is a field name", kv.first);
    }
    const std::string key = kv.first.Scalar();
    const std::string field_path = Join(path, key);
    const int line = kv.first.Mark().line + 1;
    // yaml-cpp would keep the last of them without a word.
    if (const auto [it, added] = first_line.emplace(key, line); !added) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate key '", field_path, "' at line ",
                                                     line, " (first at line ", it->second, ")"));
    }
    const FieldDescriptor* f = desc->FindFieldByName(key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key '", field_path, "'; allowed: ", AllowedKeys(desc)));
    }
    const YAML::Node& value = kv.second;
    if (f->is_repeated()) {
      if (!value.IsSequence()) return TypeError(field_path, "a list", value);
      r->ClearField(msg, f);
      for (size_t i = 0; i < value.size(); ++i) {
        const std::string item_path = absl::StrCat(field_path, "[", i, "]");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          absl::Status s = FillMessage(value[i], item_path, r->AddMessage(msg, f));
          if (!s.ok()) return s;
        } else if (absl::Status s = SetScalar(value[i], item_path, f, msg); !s.ok()) {
          return s;
        }
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (value.IsNull()) continue;
      if (absl::Status s = FillMessage(value, field_path, r->MutableMessage(msg, f)); !s.ok()) {
        return s;
      }
    } else if (absl::Status s = SetScalar(value, field_path, f, msg); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// yaml-cpp 0.7 (Debian 12's) reports an empty document for ever, without
// consuming the token it cannot place, on some malformed streams (a lone
// ","; jbeder/yaml-cpp#1040, fixed upstream by #1319), so YAML::LoadAll
// loops and its memory grows until the process dies. This event handler
// drives the parser with no document kept and notes where it stands.
class StuckParserFinder : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { at_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { at_ = mark; }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { at_ = mark; }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    at_ = mark;
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    at_ = mark;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    at_ = mark;
  }
  void OnMapEnd() override {}

  // OK when the parser reaches the end of `text`; every document takes at
  // least a byte, so more documents than bytes mean it is stuck. The parser
  // is deterministic: after OK, LoadAll ends too. Throws as LoadAll does.
  absl::Status Run(const std::string& text) {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    for (size_t documents = 0; parser.HandleNextDocument(*this); ++documents) {
      if (documents > text.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec is not valid YAML: the parser is stuck at line ", at_.line + 1,
                         ", column ", at_.column + 1));
      }
    }
    return absl::OkStatus();
  }

 private:
  YAML::Mark at_ = YAML::Mark::null_mark();
};

absl::Status OutOfRange(const std::string& field, const std::string& value,
                        const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is out of range; allowed: ", allowed));
}

template <typename T>
absl::Status CheckRange(const std::string& field, T v, T lo, T hi, const std::string& allowed) {
  if (!(v >= lo && v <= hi)) return OutOfRange(field, absl::StrCat(v), allowed);
  return absl::OkStatus();
}

absl::Status CheckOneOf(const std::string& field, const std::string& v,
                        const std::set<std::string>& allowed) {
  if (allowed.count(v) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = '", v, "' is not supported; allowed: ", absl::StrJoin(allowed, ", ")));
  }
  return absl::OkStatus();
}

// The allowed values of `key` in words, from its rule.
std::string AllowedText(absl::string_view key) { return SpecAllowedText(*FindSpecRule(key)); }

// A field against its rule's range or choices; `msg` holds the field `f`.
absl::Status CheckRule(const SpecRule& rule, const Message& msg, const FieldDescriptor* f) {
  const Reflection* r = msg.GetReflection();
  const std::string key(rule.key);
  if (rule.allowed_kind == SpecAllowed::kOneOf) {
    std::vector<std::string> values;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(msg, f); ++k)
        values.push_back(r->GetRepeatedString(msg, f, k));
      // "all-linear" stands for every linear, alone.
      if (key == "lora.target_modules" && values == std::vector<std::string>{"all-linear"}) {
        return absl::OkStatus();
      }
    } else {
      values.push_back(r->GetString(msg, f));
      // Empty until the trainer derives it (from the data, the tokenizer).
      if (values[0].empty() && rule.default_kind == SpecDefault::kDerived) return absl::OkStatus();
    }
    const std::vector<std::string> choices = absl::StrSplit(rule.choices, ", ");
    const std::set<std::string> allowed(choices.begin(), choices.end());
    for (const std::string& v : values) {
      if (absl::Status s = CheckOneOf(key, v, allowed); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  double v = 0;
  std::string text;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      v = r->GetInt32(msg, f);
      text = absl::StrCat(r->GetInt32(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      v = static_cast<double>(r->GetInt64(msg, f));
      text = absl::StrCat(r->GetInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      v = static_cast<double>(r->GetUInt64(msg, f));
      text = absl::StrCat(r->GetUInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      v = r->GetDouble(msg, f);
      text = absl::StrCat(v);
      break;
    default:
      return absl::InternalError(absl::StrCat(key, ": a range on a field that is not a number"));
  }
  if (rule.zero_off && v == 0) return absl::OkStatus();
  // Written so that NaN fails every bound.
  const bool above_lo = rule.lo_open ? v > rule.lo : v >= rule.lo;
  const bool below_hi = rule.hi_open ? v < rule.hi : v <= rule.hi;
  if (above_lo && below_hi) return absl::OkStatus();
  return OutOfRange(key, text, SpecAllowedText(rule));
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(const std::string& yaml_text) {
  // Checked on the whole text, keys and comments too: yaml-cpp passes such
  // bytes on, and protobuf then fails to send the spec with an empty message.
  if (const std::optional<std::string> place = InvalidUtf8Place(yaml_text)) {
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid UTF-8 at ", *place));
  }
  std::vector<YAML::Node> documents;
  try {
    if (absl::Status s = StuckParserFinder().Run(yaml_text); !s.ok()) return s;
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid YAML: ", e.what()));
  }
  std::erase_if(documents, [](const YAML::Node& d) { return d.IsNull(); });
  if (documents.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec holds ", documents.size(), " YAML documents (the second at line ",
        documents[1].Mark().line + 1, ", after ---); a spec is one, the others would be ignored"));
  }
  v1::JobSpec spec;
  if (documents.empty()) return absl::InvalidArgumentError("spec is empty");
  const YAML::Node& root = documents[0];
  if (absl::Status s = FillMessage(root, "", &spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json_text) {
  v1::JobSpec spec;
  // The default options refuse unknown fields, as the YAML loader does.
  if (auto s = google::protobuf::util::JsonStringToMessage(json_text, &spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec is not valid JobSpec JSON: ", s.ToString()));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  // A 50 MB list once took the CLI 3.9 GB and 33 s to parse before ballastd
  // refused it.
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxJobSpecBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("spec file not found: ", path));
  }
  if (!text.ok()) return text.status();
  absl::StatusOr<v1::JobSpec> spec =
      absl::EndsWith(path, ".json") ? ParseJobSpecJson(*text) : ParseJobSpecYaml(*text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

absl::Status ApplyOverrides(const std::vector<std::string>& overrides, v1::JobSpec* spec) {
  for (const std::string& item : overrides) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("override '", item, "' must look like key.path=value"));
    }
    YAML::Node value;
    try {
      value = YAML::Load(item.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("override '", item, "': ", e.what()));
    }
    // Wraps the value in mappings along the path: a.b=v becomes {a: {b: v}}.
    std::vector<std::string> keys = absl::StrSplit(item.substr(0, eq), '.');
    // The deepest key of a spec has 3 parts (guard.inject.on_rank); a deep
    // one would only be refused after costly nesting.
    if (keys.size() > kMaxKeyParts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "override '", item.substr(0, std::min<size_t>(eq, 80)), eq > 80 ? "..." : "",
          "': a key of ", keys.size(), " parts; spec keys have at most ", kMaxKeyParts));
    }
    YAML::Node node = value;
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      YAML::Node parent(YAML::NodeType::Map);
      parent[*it] = node;
      node = parent;
    }
    if (absl::Status s = FillMessage(node, "", spec); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void ApplyDefaults(v1::JobSpec* spec) {
  const std::vector<std::vector<const FieldDescriptor*>>& paths = SpecFieldPaths();
  // In the table's order, which sets task before the rules that depend on it.
  for (size_t i = 0; i < std::size(kSpecRules); ++i) {
    const SpecRule& rule = kSpecRules[i];
    if (rule.default_kind == SpecDefault::kRequired || rule.default_kind == SpecDefault::kDerived ||
        (rule.default_kind == SpecDefault::kText && rule.text.empty()) ||
        (!rule.task.empty() && spec->task() != rule.task) || (rule.moe_only && !spec->has_moe())) {
      continue;
    }
    const FieldDescriptor* f = paths[i].back();
    // A number without presence holds its zero when unset, and spec_rules_test
    // checks that such fields default to their zero, or that their zero
    // stands for the default (zero_default), filled below.
    const bool zero_means_unset =
        !f->has_presence() && !f->is_repeated() && f->cpp_type() != FieldDescriptor::CPPTYPE_STRING;
    if (zero_means_unset && !rule.zero_default) continue;
    Message* msg = spec;
    for (size_t k = 0; k + 1 < paths[i].size(); ++k) {
      msg = msg->GetReflection()->MutableMessage(msg, paths[i][k]);
    }
    const Reflection* r = msg->GetReflection();
    if (f->is_repeated()) {
      if (r->FieldSize(*msg, f) > 0) continue;
      for (absl::string_view item : absl::StrSplit(rule.text, ", ")) {
        r->AddString(msg, f, std::string(item));
      }
      continue;
    }
    // (HasField of a field without presence: whether it is not 0.)
    if (f->has_presence() || zero_means_unset ? r->HasField(*msg, f)
                                              : !r->GetString(*msg, f).empty()) {
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(msg, f, static_cast<int32_t>(rule.number));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(msg, f, static_cast<int64_t>(rule.number));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(msg, f, rule.number);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(msg, f, rule.number != 0);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(msg, f, std::string(rule.text));
        break;
      default:
        break;
    }
  }
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  std::vector<absl::Status> checks;
  if (const size_t bytes = spec.ByteSizeLong(); bytes > kMaxJobSpecBytes) {
    checks.push_back(absl::InvalidArgumentError(absl::StrCat(
        "spec is ", bytes, " bytes as a proto; at most ", kMaxJobSpecBytes, " are allowed")));
  }
  // Characters, not bytes: a name in Greek or Chinese may be as long.
  const int64_t name_characters = std::count_if(spec.name().begin(), spec.name().end(),
                                                [](char c) { return (c & 0xc0) != 0x80; });
  if (name_characters > 128) {
    checks.push_back(
        OutOfRange("name", absl::StrCat(name_characters, " characters"), "at most 128 characters"));
  }
  // Other users see the name in `ballast list`, where a newline or an escape
  // sequence in it could forge rows (the CLI escapes them too).
  if (const std::optional<size_t> at = FirstControlCharacter(spec.name())) {
    checks.push_back(absl::InvalidArgumentError(
        absl::StrCat("name has a control character at byte ", *at, " (", Printable(spec.name()),
                     "); a name is printable text")));
  }
  if (spec.model().path().empty()) {
    checks.push_back(absl::InvalidArgumentError("model.path is required: an HF model folder"));
  }
  if (spec.data().path().empty()) {
    checks.push_back(absl::InvalidArgumentError(
        "data.path is required: a JSONL or parquet file, or a data folder"));
  }

  // Every fixed range and choice of the table. Checked whatever the method:
  // method full ignores lora's, but a stored spec that says lora_dropout NaN
  // is wrong the day someone switches it to lora.
  const std::vector<std::vector<const FieldDescriptor*>>& paths = SpecFieldPaths();
  for (size_t i = 0; i < std::size(kSpecRules); ++i) {
    const SpecRule& rule = kSpecRules[i];
    if (!rule.task.empty() && spec.task() != rule.task) continue;
    if (rule.moe_only && !spec.has_moe()) continue;
    if (rule.allowed_kind != SpecAllowed::kRange && rule.allowed_kind != SpecAllowed::kOneOf) {
      continue;
    }
    const Message* msg = &spec;
    for (size_t k = 0; k + 1 < paths[i].size(); ++k) {
      msg = &msg->GetReflection()->GetMessage(*msg, paths[i][k]);
    }
    checks.push_back(CheckRule(rule, *msg, paths[i].back()));
  }

  if (spec.task() == "block_diffusion") {
    const v1::BlockDiffusionSpec& b = spec.block_diffusion();
    checks.push_back(CheckRange<int32_t>("block_diffusion.block_length", b.block_length(), 1,
                                         std::max(1, spec.data().seq_len() / 2),
                                         AllowedText("block_diffusion.block_length")));
    if (b.has_mask_token_id() && b.mask_token_id() < 0) {
      checks.push_back(OutOfRange("block_diffusion.mask_token_id", absl::StrCat(b.mask_token_id()),
                                  AllowedText("block_diffusion.mask_token_id")));
    }
  } else if (spec.has_block_diffusion()) {
    checks.push_back(absl::InvalidArgumentError(absl::StrCat(
        "block_diffusion is set, but task is ", spec.task(), "; it is for task block_diffusion")));
  }
  if (spec.task() == "generative_reranker") {
    checks.push_back(CheckRange<int64_t>("reranker.eval_every", spec.reranker().eval_every(), 0,
                                         spec.max_steps(), AllowedText("reranker.eval_every")));
    if (!spec.data().format().empty() && spec.data().format() != "reranker") {
      checks.push_back(absl::InvalidArgumentError(absl::StrCat(
          "data.format = ", spec.data().format(),
          " does not fit task generative_reranker, which reads data.format reranker")));
    }
  } else if (spec.has_reranker()) {
    checks.push_back(absl::InvalidArgumentError(absl::StrCat(
        "reranker is set, but task is ", spec.task(), "; it is for task generative_reranker")));
  } else if (spec.data().format() == "reranker") {
    checks.push_back(absl::InvalidArgumentError(
        "data.format = reranker is for task generative_reranker; set task"));
  }
  if (spec.has_eval()) {
    const v1::EvalSpec& eval = spec.eval();
    if (spec.task() == "generative_reranker") {
      checks.push_back(absl::InvalidArgumentError(
          "eval is set, but task is generative_reranker, which evaluates reranker.eval_path "
          "(MRR@10 and NDCG@10); set reranker.eval_path and reranker.eval_every instead"));
    }
    if (eval.path().empty() == (eval.fraction() == 0)) {
      checks.push_back(absl::InvalidArgumentError(absl::StrCat(
          "eval ", eval.path().empty() ? "has neither eval.path nor" : "has both eval.path and",
          " eval.fraction: name a file of records in data.path's format, or the share of "
          "data.path's documents to hold out")));
    }
    checks.push_back(CheckRange<int64_t>("eval.every", eval.every(), 0, spec.max_steps(),
                                         AllowedText("eval.every")));
    if (eval.max_tokens() != 0 && eval.max_tokens() < spec.data().seq_len()) {
      // One row at least: a bound below it would evaluate nothing.
      checks.push_back(OutOfRange("eval.max_tokens", absl::StrCat(eval.max_tokens()),
                                  AllowedText("eval.max_tokens")));
    }
  }
  // What early stopping and export: best watch must be evaluated.
  const bool reranker = spec.task() == "generative_reranker";
  if (spec.has_early_stopping()) {
    const v1::EarlyStoppingSpec& es = spec.early_stopping();
    const std::string metric = es.metric().empty() ? "eval_loss" : es.metric();
    const bool ranking = metric == "mrr_at_10" || metric == "ndcg_at_10";
    if (metric != "eval_loss" && !ranking) {
      checks.push_back(absl::InvalidArgumentError(
          absl::StrCat("early_stopping.metric = ", es.metric(),
                       " is not one of eval_loss, mrr_at_10, ndcg_at_10")));
    } else if (ranking && !reranker) {
      checks.push_back(absl::InvalidArgumentError(absl::StrCat("early_stopping.metric = ", metric,
                                                               " is a reranker's, but task is ",
                                                               spec.task(), "; watch eval_loss")));
    } else if (ranking && spec.reranker().eval_path().empty()) {
      checks.push_back(absl::InvalidArgumentError(
          absl::StrCat("early_stopping.metric = ", metric,
                       " needs reranker.eval_path, the held-out groups it is measured on")));
    } else if (!ranking && reranker) {
      checks.push_back(absl::InvalidArgumentError(
          "early_stopping.metric = eval_loss, but task is generative_reranker, whose "
          "evaluation (reranker.eval_path) has no loss; watch mrr_at_10 or ndcg_at_10"));
    } else if (!ranking && !spec.has_eval()) {
      checks.push_back(absl::InvalidArgumentError(
          "early_stopping is set, but eval is not: early stopping watches the validation set's "
          "loss; set eval.path or eval.fraction"));
    }
    checks.push_back(CheckRange<int32_t>("early_stopping.patience", es.patience(), 1, 1000000,
                                         AllowedText("early_stopping.patience")));
    if (spec.export_() == "last") {
      checks.push_back(absl::InvalidArgumentError(
          "export = last contradicts early_stopping, which exports the best evaluation's "
          "checkpoint; drop one"));
    }
  }
  if (!spec.export_().empty() && spec.export_() != "last" && spec.export_() != "best") {
    checks.push_back(absl::InvalidArgumentError(
        absl::StrCat("export = ", spec.export_(), " is not one of best, last")));
  } else if (spec.export_() == "best" && !spec.has_early_stopping()) {
    if (reranker) {
      checks.push_back(absl::InvalidArgumentError(
          "export = best needs a metric for a reranker: set early_stopping.metric (mrr_at_10 or "
          "ndcg_at_10) and its patience"));
    } else if (!spec.has_eval()) {
      checks.push_back(absl::InvalidArgumentError(
          "export = best needs eval: the best is the lowest eval_loss; set eval.path or "
          "eval.fraction"));
    }
  }
  checks.push_back(CheckRange<int64_t>("checkpoint_every", spec.checkpoint_every(), 0,
                                       spec.max_steps(), AllowedText("checkpoint_every")));
  checks.push_back(CheckRange<int64_t>("schedule.warmup_steps", spec.schedule().warmup_steps(), 0,
                                       spec.max_steps(), AllowedText("schedule.warmup_steps")));
  // Whether the cluster can place `devices` is the coordinator's check at
  // submission; the spec alone only bounds the gang.
  const v1::GuardInject& inject = spec.guard().inject();
  for (const auto& [key, steps] :
       {std::pair{"guard.inject.nan_grad_at_step", &inject.nan_grad_at_step()},
        {"guard.inject.inf_loss_at_step", &inject.inf_loss_at_step()},
        {"guard.inject.spike_at_step", &inject.spike_at_step()},
        {"guard.inject.zero_tokens_at_steps", &inject.zero_tokens_at_steps()},
        {"guard.inject.nan_weight_at_step", &inject.nan_weight_at_step()}}) {
    for (int64_t step : *steps) {
      checks.push_back(
          CheckRange<int64_t>(key, step, 1, spec.max_steps(), "1..max_steps (a step to run)"));
    }
  }
  checks.push_back(CheckRange<int32_t>("guard.inject.on_rank", inject.on_rank(), 0,
                                       std::max(spec.devices(), 1) - 1,
                                       "0..devices-1 (a rank of the job)"));

  // The rate is aux_free's alone: with the aux loss it would be ignored.
  // Unset, the trainer takes kDefaultAuxFreeRate.
  if (spec.moe().has_aux_free_rate()) {
    const double rate = spec.moe().aux_free_rate();
    if (spec.moe().balance() != "aux_free") {
      checks.push_back(absl::InvalidArgumentError(
          absl::StrCat("moe.aux_free_rate is set, but moe.balance is ",
                       spec.moe().balance().empty() ? "unset (aux_loss)" : spec.moe().balance(),
                       "; the rate is for moe.balance aux_free")));
    } else if (!(rate > 0 && rate <= 1)) {
      checks.push_back(
          OutOfRange("moe.aux_free_rate", absl::StrCat(rate), AllowedText("moe.aux_free_rate")));
    }
  }

  const v1::ShardingSpec& sharding = spec.sharding();
  if (sharding.strategy() == "hybrid") {
    const int32_t devices = std::max(spec.devices(), 1);
    if (sharding.shard_group() < 1 || sharding.shard_group() > devices ||
        devices % sharding.shard_group() != 0) {
      checks.push_back(
          OutOfRange("sharding.shard_group", absl::StrCat(sharding.shard_group()),
                     absl::StrCat(AllowedText("sharding.shard_group"), "; devices is ", devices)));
    }
  } else if (sharding.shard_group() != 0) {
    checks.push_back(absl::InvalidArgumentError(
        absl::StrCat("sharding.shard_group is set, but sharding.strategy is ",
                     sharding.strategy().empty() ? "unset (zero3)" : sharding.strategy(),
                     "; shard groups are for strategy hybrid")));
  }
  // Experts split over the ranks ZeRO-3 shards over: their shards are then
  // whole experts (worker/train/shard/flat_layout.h), and no expert is kept
  // twice in a shard group. num_experts is config.json's: CheckMoeSection
  // (job_spec_files.cc) checks that the number divides it.
  if (const int32_t expert_parallel = spec.moe().expert_parallel();
      expert_parallel > 1 || expert_parallel < 0) {
    const bool hybrid = sharding.strategy() == "hybrid";
    const int32_t shard_ranks = hybrid ? sharding.shard_group() : std::max(spec.devices(), 1);
    if (expert_parallel != shard_ranks) {
      checks.push_back(
          OutOfRange("moe.expert_parallel", absl::StrCat(expert_parallel),
                     absl::StrCat("0 or 1 (off), or the ranks ZeRO-3 shards over: ",
                                  hybrid ? "sharding.shard_group, " : "devices, ", shard_ranks)));
    }
  }
  if (spec.zero3().reduce_dtype() == "bf16" && spec.precision() != "bf16") {
    checks.push_back(absl::InvalidArgumentError(
        absl::StrCat("zero3.reduce_dtype = bf16 needs precision bf16; precision is ",
                     spec.precision().empty() ? "unset (fp32)" : spec.precision(),
                     ", whose gradients bf16 would round")));
  }

  const v1::LoraSpec& lora = spec.lora();
  if (spec.method() == "full" && !lora.init_adapter().empty()) {
    checks.push_back(absl::InvalidArgumentError(
        "lora.init_adapter is set, but method is full, which would ignore it; an adapter starts "
        "method lora (ballast-train merge folds one into a model folder for full)"));
  }

  const v1::DataSpec& data = spec.data();
  // The model's max_position_embeddings bounds it too (ValidateJobSpecFiles).
  checks.push_back(
      CheckRange<int32_t>("data.seq_len", data.seq_len(), 1, 1 << 24, AllowedText("data.seq_len")));
  // Each rank trains an equal share of a step's micro-batches, so a gang
  // whose ranks could not split them would fail at start on every worker;
  // submission says so first (the trainer checks its own world size too).
  if (spec.devices() > 1 && data.grad_accum_steps() % spec.devices() != 0) {
    checks.push_back(absl::InvalidArgumentError(absl::StrCat(
        "data.grad_accum_steps = ", data.grad_accum_steps(), " is not a multiple of devices ",
        spec.devices(), ": each rank takes an equal share of a step's micro-batches")));
  }
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ballast
