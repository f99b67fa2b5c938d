#include "worker/train/text/oniguruma_classes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/train/text/tokenizer_json.h"
#include "worker/train/text/pre_tokenizer.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> Pieces(const std::string& text) {
  absl::StatusOr<SplitPattern> pattern = SplitPattern::Compile(kQwenRegex, false);
  EXPECT_TRUE(pattern.ok()) << pattern.status();
  std::vector<std::string_view> pieces;
  EXPECT_TRUE(pattern->Split(text, &pieces).ok());
  return {pieces.begin(), pieces.end()};
}

TEST(OnigurumaClasses, LettersAndDigitsNewerThanPcre2AreClassifiedAsOnigurumaDoes) {
  // U+105C0 is a Todhri letter and U+16130 a Gurung Khema digit (Unicode
  // 16), unknown to PCRE2 10.42: as a letter it joins " a"; as digits they
  // stand one by one, where punctuation would stay together.
  EXPECT_THAT(Pieces(" \U000105C0a"), ElementsAre(" \U000105C0a"));
  EXPECT_THAT(Pieces("\U00016130\U00016131"), ElementsAre("\U00016130", "\U00016131"));
}

TEST(OnigurumaClasses, MongolianVowelSeparatorIsNotWhitespace) {
  // PCRE2's \s takes U+180E; White_Space, and so Oniguruma, does not.
  EXPECT_THAT(Pieces("a\u180Eb"), ElementsAre("a", "\u180Eb"));
  EXPECT_THAT(Pieces("a \u2003b"), ElementsAre("a", " ", "\u2003b"));
}

TEST(OnigurumaClasses, KeepsLookaroundsGroupsAndTheCaseOption) {
  const std::string regex = R"((?i:'s)(?:x)(?!\S)(?<=a)(?-i:b)[$^])";
  absl::StatusOr<std::string> rewritten = OnigurumaClassesForPcre2(regex);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_THAT(*rewritten, StartsWith("(?i:'s)(?:x)(?![^"));
  EXPECT_THAT(*rewritten, testing::EndsWith("(?<=a)(?-i:b)[$^]"));
}

TEST(OnigurumaClasses, RewritesInsideAndOutsideBrackets) {
  absl::StatusOr<std::string> rewritten = OnigurumaClassesForPcre2(R"([^\s\p{N}]\p{M}\S\P{L}\\s)");
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_THAT(*rewritten, StartsWith(R"([^\t\n)"));
  EXPECT_THAT(*rewritten, HasSubstr(R"(\p{N}\x{10D40}-\x{10D49})"));
  EXPECT_THAT(*rewritten, HasSubstr(R"([\p{M}\x{897})"));
  EXPECT_THAT(*rewritten, HasSubstr(R"([^\t\n)"));
  EXPECT_THAT(*rewritten, HasSubstr(R"([^\p{L}\x{1C89})"));
  // An escaped backslash followed by 's' is a literal, left alone.
  EXPECT_THAT(*rewritten, testing::EndsWith(R"(\\s)"));
  // A ']' right after '[' is a literal and does not end the class.
  rewritten = OnigurumaClassesForPcre2(R"([]\s])");
  ASSERT_TRUE(rewritten.ok());
  EXPECT_THAT(*rewritten, StartsWith(R"([]\t)"));
}

TEST(OnigurumaClasses, RefusesEscapesWhoseSetsItDoesNotAlign) {
  for (const char* regex : {R"(\w+)", R"(\d)", R"(\b)", R"([\p{Lu}])", R"(\pL)", R"([\P{L}])",
                            R"([\S])", R"([[:alpha:]])", R"([a-z&&[^b]])", R"(^a)", R"(a$)",
                            R"((?m).)", R"((?x) a)", R"((?im:a))"}) {
    const absl::Status status = OnigurumaClassesForPcre2(regex).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << regex;
    EXPECT_THAT(status.message(), HasSubstr("is not supported")) << regex;
  }
  EXPECT_THAT(OnigurumaClassesForPcre2(R"(\p{Lu})").status().message(), HasSubstr("\\p{Lu}"));
}

}  // namespace
}  // namespace ballast::train
