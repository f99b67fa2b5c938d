#include "worker/train/text/pre_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Pieces(const char* regex, const std::string& text) {
  absl::StatusOr<PreTokenizer> pre_tokenizer = PreTokenizer::FromJson(SplitThenByteLevel(regex));
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  std::vector<std::string_view> pieces;
  EXPECT_TRUE(pre_tokenizer->Split(text, &pieces).ok());
  return {pieces.begin(), pieces.end()};
}

std::vector<std::string> Qwen(const std::string& text) { return Pieces(kQwenRegex, text); }

TEST(PreTokenizer, ContractionsAreCaseInsensitive) {
  EXPECT_THAT(Qwen("I'M here, it's"), ElementsAre("I", "'M", " here", ",", " it", "'s"));
  EXPECT_THAT(Qwen("WE'LL they'RE"), ElementsAre("WE", "'LL", " they", "'RE"));
  // Only the listed endings: 'x is punctuation before a letter run.
  EXPECT_THAT(Qwen("a'x"), ElementsAre("a", "'x"));
}

TEST(PreTokenizer, QwenSplitsDigitsOneByOneAndLlama3InThrees) {
  EXPECT_THAT(Qwen("12345"), ElementsAre("1", "2", "3", "4", "5"));
  EXPECT_THAT(Pieces(kLlama3Regex, "12345 1234567"),
              ElementsAre("123", "45", " ", "123", "456", "7"));
}

TEST(PreTokenizer, LineBreaksStayTogetherWithTheSpacesBeforeThem) {
  EXPECT_THAT(Qwen("a\r\n\r\nb"), ElementsAre("a", "\r\n\r\n", "b"));
  EXPECT_THAT(Qwen("x  \n  y"), ElementsAre("x", "  \n", " ", " y"));
  EXPECT_THAT(Qwen("end.\n"), ElementsAre("end", ".\n"));
}

TEST(PreTokenizer, TrailingSpacesLeaveTheLastOneToTheNextWord) {
  // \s+(?!\S): a run of spaces before a word gives its last space to it.
  EXPECT_THAT(Qwen("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Qwen("a   "), ElementsAre("a", "   "));
  EXPECT_THAT(Qwen("\t\tb"), ElementsAre("\t", "\tb"));
}

TEST(PreTokenizer, EmojiCjkAndCombiningMarksFollowUnicodeClasses) {
  EXPECT_THAT(Qwen("\U0001F600\U0001F44D!"), ElementsAre("\U0001F600\U0001F44D!"));
  EXPECT_THAT(Qwen("\u65E5\u672C\u8A9E \u6771\u4EAC"),
              ElementsAre("\u65E5\u672C\u8A9E", " \u6771\u4EAC"));
  // A combining mark is neither a letter nor a digit (Mn).
  EXPECT_THAT(Qwen("e\u0301t\u00E9"), ElementsAre("e", "\u0301t\u00E9"));
  // \u00A0 is \s; U+3000 too.
  EXPECT_THAT(Qwen("a\u00A0\u3000b"), ElementsAre("a", "\u00A0", "\u3000b"));
}

TEST(PreTokenizer, AMegabyteOfSpacesSplitsWithoutRunningOutOfStack) {
  const std::string spaces(1 << 20, ' ');
  EXPECT_THAT(Qwen(spaces + "x"), ElementsAre(std::string((1 << 20) - 1, ' '), " x"));
}

TEST(PreTokenizer, TextBetweenMatchesIsAPieceToo) {
  const nlohmann::json json = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "--"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  absl::StatusOr<PreTokenizer> pre_tokenizer = PreTokenizer::FromJson(json);
  ASSERT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(pre_tokenizer->Split("a--b.c--", &pieces).ok());
  EXPECT_THAT(pieces, ElementsAre("a", "--", "b.c", "--"));
}

absl::Status LoadError(const nlohmann::json& json) { return PreTokenizer::FromJson(json).status(); }

TEST(PreTokenizer, RefusesWhatItDoesNotImplementByName) {
  nlohmann::json removed = SplitThenByteLevel(kQwenRegex);
  removed["pretokenizers"][0]["behavior"] = "Removed";
  EXPECT_EQ(LoadError(removed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadError(removed).message(), HasSubstr("behavior \"Removed\""));

  nlohmann::json inverted = SplitThenByteLevel(kQwenRegex);
  inverted["pretokenizers"][0]["invert"] = true;
  EXPECT_THAT(LoadError(inverted).message(), HasSubstr("invert=true"));

  nlohmann::json prefix_space = SplitThenByteLevel(kQwenRegex);
  prefix_space["pretokenizers"][1]["add_prefix_space"] = true;
  EXPECT_THAT(LoadError(prefix_space).message(), HasSubstr("ByteLevel with add_prefix_space"));

  EXPECT_THAT(LoadError({{"type", "Metaspace"}}).message(),
              HasSubstr("pre_tokenizer type \"Metaspace\" is not supported"));
  EXPECT_THAT(LoadError(SplitThenByteLevel(kQwenRegex)["pretokenizers"][0]).message(),
              HasSubstr("without a ByteLevel step"));
  EXPECT_THAT(LoadError(SplitThenByteLevel("(unclosed")).message(), HasSubstr("does not compile"));
}

}  // namespace
}  // namespace ballast::train
