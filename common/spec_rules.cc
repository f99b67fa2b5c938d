#include "common/spec_rules.h"

#include <google/protobuf/descriptor.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {
namespace {

using google::protobuf::FieldDescriptor;

const FieldDescriptor* LastField(size_t index) {
  const std::vector<const FieldDescriptor*>& path = SpecFieldPaths()[index];
  return path.empty() ? nullptr : path.back();
}

bool IsInteger(const FieldDescriptor* f) {
  return f != nullptr && (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ||
                          f->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
                          f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64);
}

// 1e6 as "1e6", 0.01 as "1e-2", 0.999 as "0.999": the shortest text that
// reads back as `v`, in the form a person writes.
std::string FormatReal(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e5) return absl::StrCat(static_cast<int64_t>(v));
  const bool exponent = std::fabs(v) < 0.05 || std::fabs(v) >= 1e5;
  char buf[64];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), exponent ? "%.*e" : "%.*g",
                  exponent ? precision : precision + 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string text = buf;
  const size_t e = text.find('e');
  if (e == std::string::npos) return text;
  std::string mantissa = text.substr(0, e);
  std::string power = text.substr(e + 1);
  const bool negative = power[0] == '-';
  power.erase(0, power.find_first_not_of("+-0"));
  return absl::StrCat(mantissa, "e", negative ? "-" : "", power);
}

// Integers past a million read better as a power of ten (1..10^9).
std::string FormatInteger(double v) {
  const auto n = static_cast<int64_t>(v);
  int power = 0;
  for (int64_t m = n; m >= 10 && m % 10 == 0; m /= 10) ++power;
  if (n > 0 && power >= 7 && std::pow(10.0, power) == v) return absl::StrCat("10^", power);
  return absl::StrCat(n);
}

std::string DefaultCell(const SpecRule& rule, const FieldDescriptor* f) {
  if (!rule.shown.empty()) return std::string(rule.shown);
  switch (rule.default_kind) {
    case SpecDefault::kRequired:
      return "required";
    case SpecDefault::kDerived:
      return "";
    case SpecDefault::kNumber:
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL)
        return rule.number != 0 ? "true" : "false";
      return IsInteger(f) ? FormatInteger(rule.number) : FormatReal(rule.number);
    case SpecDefault::kText:
      if (f->is_repeated()) return absl::StrCat("[", rule.text, "]");
      return rule.text.empty() ? "\"\"" : absl::StrCat("`", rule.text, "`");
  }
  return "";
}

}  // namespace

const std::vector<std::vector<const FieldDescriptor*>>& SpecFieldPaths() {
  static const auto* const paths = [] {
    auto* out = new std::vector<std::vector<const FieldDescriptor*>>();
    for (const SpecRule& rule : kSpecRules) {
      std::vector<const FieldDescriptor*> path;
      const google::protobuf::Descriptor* message = v1::JobSpec::descriptor();
      for (absl::string_view part : absl::StrSplit(rule.key, '.')) {
        const FieldDescriptor* f =
            message == nullptr ? nullptr : message->FindFieldByName(std::string(part));
        if (f == nullptr) {
          path.clear();
          break;
        }
        path.push_back(f);
        message = f->message_type();
      }
      out->push_back(std::move(path));
    }
    return out;
  }();
  return *paths;
}

std::string SpecAllowedText(const SpecRule& rule) {
  switch (rule.allowed_kind) {
    case SpecAllowed::kAny:
      return "";
    case SpecAllowed::kInCode:
      return std::string(rule.allowed);
    case SpecAllowed::kOneOf: {
      const std::vector<std::string> choices = absl::StrSplit(rule.choices, ", ");
      return absl::StrJoin(std::set<std::string>(choices.begin(), choices.end()), ", ");
    }
    case SpecAllowed::kRange:
      break;
  }
  const FieldDescriptor* f = LastField(static_cast<size_t>(&rule - kSpecRules));
  std::string range;
  if (IsInteger(f)) {
    range = absl::StrCat(FormatInteger(rule.lo), "..", FormatInteger(rule.hi));
  } else {
    range = absl::StrCat(rule.lo_open ? "(" : "[", FormatReal(rule.lo), ", ", FormatReal(rule.hi),
                         rule.hi_open ? ")" : "]");
  }
  return rule.zero_off ? absl::StrCat("0 (off) or ", range) : range;
}

std::string SpecTableMarkdown() {
  std::string table = "| key | default | allowed | meaning |\n|---|---|---|---|\n";
  for (size_t i = 0; i < std::size(kSpecRules); ++i) {
    const SpecRule& rule = kSpecRules[i];
    // A cell cannot hold a '|' that Markdown would read as the next column.
    const auto cell = [](absl::string_view text) {
      return absl::StrReplaceAll(text, {{"|", "\\|"}});
    };
    std::string allowed = SpecAllowedText(rule);
    if (rule.allowed_kind == SpecAllowed::kOneOf) {
      // The README lists choices in the table's order, which reads better
      // than the sorted order of an error.
      allowed = std::string(rule.choices);
    }
    absl::StrAppend(&table, "| `", rule.key, "` | ", cell(DefaultCell(rule, LastField(i))), " | ",
                    cell(allowed), " | ", cell(rule.meaning),
                    rule.task.empty() ? "" : absl::StrCat(" (task `", rule.task, "`)"),
                    rule.moe_only ? " (Mixture-of-Experts models)" : "", " |\n");
  }
  return table;
}

absl::StatusOr<std::string> WithSpecTable(absl::string_view readme) {
  const size_t begin = readme.find(kSpecTableBegin);
  const size_t end = readme.find(kSpecTableEnd);
  if (begin == absl::string_view::npos || end == absl::string_view::npos || end < begin) {
    return absl::InvalidArgumentError(absl::StrCat("no lines '", kSpecTableBegin, "' and '",
                                                   kSpecTableEnd, "' around the spec table"));
  }
  const size_t body = begin + kSpecTableBegin.size();
  return absl::StrCat(readme.substr(0, body), "\n", SpecTableMarkdown(), readme.substr(end));
}

}  // namespace ballast
