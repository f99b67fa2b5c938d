#include "worker/train/text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/train/text/oniguruma_classes.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

std::string Pcre2Message(int error_code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(error_code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", error_code);
  }
  return reinterpret_cast<const char*>(buffer);
}

using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;

// Reads a boolean setting that must hold `expected` for the pre-tokenizer to
// behave as implemented; absent means the tokenizers default, `expected`.
absl::Status RequireSetting(const nlohmann::json& step, const std::string& type,
                            const std::string& key, bool expected) {
  if (!step.contains(key) || step[key] == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer ", type, " with ", key, "=",
                                                 step[key].dump(), " is not supported (only ",
                                                 expected ? "true" : "false", ")"));
}

// Adds the steps of one json pre-tokenizer to `steps`; `byte_level` is set
// once the ByteLevel step is seen, which must come last.
absl::Status AddSteps(const nlohmann::json& step, std::vector<SplitPattern>* steps,
                      bool* byte_level) {
  const std::string type = step.is_object() ? step.value("type", "") : "";
  if (*byte_level) {
    return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer ", type,
                                                   " after ByteLevel is not supported (ByteLevel "
                                                   "must be the last step)"));
  }
  if (type == "Sequence" && step.contains("pretokenizers") && step["pretokenizers"].is_array()) {
    for (const nlohmann::json& inner : step["pretokenizers"]) {
      if (absl::Status status = AddSteps(inner, steps, byte_level); !status.ok()) return status;
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    if (step.value("behavior", "") != "Isolated") {
      return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer Split with behavior \"",
                                                     step.value("behavior", ""),
                                                     "\" is not supported (only Isolated)"));
    }
    if (absl::Status status = RequireSetting(step, type, "invert", false); !status.ok()) {
      return status;
    }
    const nlohmann::json pattern = step.value("pattern", nlohmann::json());
    const bool literal = pattern.contains("String") && pattern["String"].is_string();
    if (!literal && !(pattern.contains("Regex") && pattern["Regex"].is_string())) {
      return absl::InvalidArgumentError(
          absl::StrCat("pre_tokenizer Split pattern ", pattern.dump(),
                       " is not supported (only {\"Regex\": ...} or {\"String\": ...})"));
    }
    absl::StatusOr<SplitPattern> compiled =
        SplitPattern::Compile(pattern[literal ? "String" : "Regex"].get<std::string>(), literal);
    if (!compiled.ok()) return compiled.status();
    steps->push_back(*std::move(compiled));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    for (const char* key : {"add_prefix_space", "use_regex"}) {
      if (absl::Status status = RequireSetting(step, type, key, false); !status.ok()) {
        return status;
      }
    }
    *byte_level = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "pre_tokenizer type \"", type, "\" is not supported (only Sequence, Split and ByteLevel)"));
}

}  // namespace

void SplitPattern::CodeDeleter::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

absl::StatusOr<SplitPattern> SplitPattern::Compile(std::string_view pattern, bool literal) {
  std::string source(pattern);
  if (!literal) {
    absl::StatusOr<std::string> rewritten = OnigurumaClassesForPcre2(pattern);
    if (!rewritten.ok()) return rewritten.status();
    source = *std::move(rewritten);
  }
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP, which a literal does not need.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre_tokenizer Split regex ", std::string(pattern),
                     " does not compile: ", Pcre2Message(error_code)));
  }
  // Without a JIT (an unsupported CPU, or no executable memory) pcre2_match
  // runs the interpreter on the same code: slower, same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return SplitPattern(code);
}

absl::Status SplitPattern::Split(std::string_view text,
                                 std::vector<std::string_view>* pieces) const {
  const MatchData match_data(pcre2_match_data_create_from_pattern(code_.get(), nullptr),
                             &pcre2_match_data_free);
  if (match_data == nullptr) return absl::ResourceExhaustedError("PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    // The caller checked the UTF-8 once; PCRE2 would otherwise check the
    // whole subject again on every call.
    int rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                         match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter keeps its backtracking frames on the heap, which
      // grows further than the JIT's default stack.
      rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       match_data.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(
          absl::StrCat("pre_tokenizer regex failed at byte ", offset, ": ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end) {
      // An empty match yields no piece; Oniguruma's search moves on by one
      // character, and so does this one.
      offset = end;
      if (offset < text.size()) NextCodePoint(text, &offset);
      continue;
    }
    if (last_end < start) pieces->push_back(text.substr(last_end, start - last_end));
    pieces->push_back(text.substr(start, end - start));
    last_end = offset = end;
  }
  if (last_end < text.size()) pieces->push_back(text.substr(last_end));
  return absl::OkStatus();
}

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& pre_tokenizer) {
  std::vector<SplitPattern> steps;
  bool byte_level = false;
  if (absl::Status status = AddSteps(pre_tokenizer, &steps, &byte_level); !status.ok()) {
    return status;
  }
  if (!byte_level) {
    return absl::InvalidArgumentError(
        "pre_tokenizer without a ByteLevel step is not supported (the model is byte-level BPE)");
  }
  return PreTokenizer(std::move(steps));
}

absl::Status PreTokenizer::Split(std::string_view text,
                                 std::vector<std::string_view>* pieces) const {
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (const SplitPattern& step : steps_) {
    next.clear();
    for (const std::string_view piece : current) {
      if (absl::Status status = step.Split(piece, &next); !status.ok()) return status;
    }
    current.swap(next);
  }
  for (const std::string_view piece : current) {
    if (!piece.empty()) pieces->push_back(piece);
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
