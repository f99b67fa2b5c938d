// Fuzzes tokenizer.json loading and encoding (worker/train/text/).
//
// Input: text to encode with a fixed Qwen-style tokenizer; or, when it
// starts with '{', a tokenizer.json up to the first NUL and the text after
// it. Seeds of the second kind start from a whole, valid tokenizer.json.
//
// Invariants beyond not crashing: errors carry the codes tokenizer.h
// promises; ids are not negative; EncodeWithOffsets gives Encode's ids with
// ends that climb to the end of the normalized text; every id Encode gives
// decodes; and with the fixed tokenizer, decoding gives the normalized text
// back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "tests/fuzz/fixed_tokenizer.h"
#include "tests/fuzz/invariant.h"
#include "worker/train/text/tokenizer.h"
#include "worker/train/text/utf8.h"

namespace {

using ballast::fuzz::Require;
using ballast::train::Tokenizer;

const Tokenizer& FixedTokenizer() {
  static const Tokenizer* tokenizer = new Tokenizer(ballast::fuzz::BuildFixedTokenizer());
  return *tokenizer;
}

void CheckEncoding(const Tokenizer& tokenizer, std::string_view text, bool allow_special,
                   bool round_trips) {
  const bool utf8 = ballast::train::IsValidUtf8(text);
  absl::StatusOr<std::vector<ballast::train::TokenId>> ids = tokenizer.Encode(text, allow_special);
  if (!ids.ok()) {
    Require(utf8 ? absl::IsInternal(ids.status()) : absl::IsInvalidArgument(ids.status()),
            "Encode's error code");
    return;
  }
  Require(utf8, "Encode refuses text that is not UTF-8");
  for (const ballast::train::TokenId id : *ids) Require(id >= 0, "ids are not negative");
  absl::StatusOr<Tokenizer::Encoding> encoding = tokenizer.EncodeWithOffsets(text, allow_special);
  Require(encoding.ok() && encoding->ids == *ids, "EncodeWithOffsets gives Encode's ids");
  Require(encoding->ends.size() == ids->size(), "one end per id");
  for (size_t i = 0; i < encoding->ends.size(); ++i) {
    Require(encoding->ends[i] <= encoding->normalized.size(), "ends lie in the normalized text");
    Require(i == 0 || encoding->ends[i - 1] <= encoding->ends[i], "ends climb");
  }
  Require(encoding->ends.empty() ? encoding->normalized.empty()
                                 : encoding->ends.back() == encoding->normalized.size(),
          "the ids cover the normalized text");
  absl::StatusOr<std::string> normalized = tokenizer.Normalize(text, allow_special);
  Require(normalized.ok() && *normalized == encoding->normalized,
          "Normalize gives the text the ids cover");
  absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
  Require(decoded.ok(), "every id Encode gives decodes");
  if (round_trips) Require(*decoded == *normalized, "decoding gives the normalized text back");
  (void)tokenizer.FindSpecialToken(text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.empty() || input[0] != '{') {
    for (const bool allow_special : {false, true}) {
      CheckEncoding(FixedTokenizer(), input, allow_special, /*round_trips=*/true);
    }
    return 0;
  }
  const size_t nul = input.find('\0');
  const std::string_view json_text = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  const nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json);
  if (!tokenizer.ok()) {
    Require(absl::IsInvalidArgument(tokenizer.status()), "FromJson's error code",
            tokenizer.status());
    return 0;
  }
  for (const bool allow_special : {false, true}) {
    CheckEncoding(*tokenizer, text, allow_special, /*round_trips=*/false);
  }
  return 0;
}
