#include "worker/train/text/bpe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Bpe Load(const nlohmann::json& model) {
  absl::StatusOr<Bpe> bpe = Bpe::FromJson(model);
  EXPECT_TRUE(bpe.ok()) << bpe.status();
  return *std::move(bpe);
}

std::vector<std::string> Tokens(const Bpe& bpe, const std::string& bytes) {
  std::vector<TokenId> ids;
  bpe.Tokenize(bytes, &ids);
  std::vector<std::string> tokens;
  for (const TokenId id : ids) tokens.push_back(*bpe.IdToToken(id));
  return tokens;
}

TEST(Bpe, LowestRankMergesFirst) {
  // "bc" (rank 0) wins over "ab" (rank 1), so "abc" becomes a + bc.
  const Bpe bpe = Load(BpeModel({{"b", "c"}, {"a", "b"}}));
  EXPECT_THAT(Tokens(bpe, "abc"), ElementsAre("a", "bc"));
  const Bpe reversed = Load(BpeModel({{"a", "b"}, {"b", "c"}}));
  EXPECT_THAT(Tokens(reversed, "abc"), ElementsAre("ab", "c"));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  const Bpe bpe = Load(BpeModel({{"a", "a"}}));
  EXPECT_THAT(Tokens(bpe, "aaa"), ElementsAre("aa", "a"));
  EXPECT_THAT(Tokens(bpe, "aaaaa"), ElementsAre("aa", "aa", "a"));
}

TEST(Bpe, MergedTokensMergeAgain) {
  const Bpe bpe = Load(BpeModel({{" ", "t"}, {"h", "e"}, {" t", "he"}}));
  EXPECT_THAT(Tokens(bpe, " the"), ElementsAre(Symbols(" the")));
  EXPECT_THAT(Tokens(bpe, " th"), ElementsAre(Symbols(" t"), "h"));
}

TEST(Bpe, BytesWithoutMergesAreOneTokenEach) {
  const Bpe bpe = Load(BpeModel({}));
  std::vector<TokenId> ids;
  bpe.Tokenize("\xE4\xB8\xAD", &ids);  // 中
  EXPECT_THAT(ids, ElementsAre(0xE4, 0xB8, 0xAD));
}

TEST(Bpe, IgnoreMergesEmitsAPreTokenInTheVocabularyWhole) {
  // "abc" is in the vocabulary, but no merge path reaches it: with
  // ignore_merges it is still one token.
  nlohmann::json model = BpeModel({{"b", "c"}});
  model["vocab"]["abc"] = 999;
  EXPECT_THAT(Tokens(Load(model), "abc"), ElementsAre("a", "bc"));
  model["ignore_merges"] = true;
  EXPECT_THAT(Tokens(Load(model), "abc"), ElementsAre("abc"));
  EXPECT_THAT(Tokens(Load(model), "abcc"), ElementsAre("a", "bc", "c"));
}

TEST(Bpe, EndsSayWhereEachIdsBytesEnd) {
  const Bpe bpe = Load(BpeModel({{"b", "c"}, {"a", "bc"}}));
  std::vector<TokenId> ids;
  std::vector<size_t> ends;
  bpe.Tokenize("xabcbc", &ids, &ends);
  EXPECT_THAT(ids, ElementsAre('x', bpe.TokenToId("abc"), bpe.TokenToId("bc")));
  EXPECT_THAT(ends, ElementsAre(1, 4, 6));
  // A pre-token that ignore_merges emits whole ends where it does.
  nlohmann::json model = BpeModel({});
  model["vocab"]["abc"] = 999;
  model["ignore_merges"] = true;
  ids.clear();
  ends.clear();
  Load(model).Tokenize("abc", &ids, &ends);
  EXPECT_THAT(ends, ElementsAre(3));
}

TEST(Bpe, LegacyMergeStringsRankAsPairs) {
  nlohmann::json model = BpeModel({{"b", "c"}, {"a", "b"}});
  model["merges"] = {"#version: 0.2", "b c", "a b"};
  EXPECT_THAT(Tokens(Load(model), "abc"), ElementsAre("a", "bc"));
}

TEST(Bpe, ARepeatedMergeTakesItsLastRank) {
  // As in tokenizers, whose merge map keeps the last entry: "ab" ends up at
  // rank 2, after "bc".
  nlohmann::json model = BpeModel({{"a", "b"}, {"b", "c"}});
  model["merges"].push_back({"a", "b"});
  EXPECT_THAT(Tokens(Load(model), "abc"), ElementsAre("a", "bc"));
}

absl::Status LoadError(const nlohmann::json& model) { return Bpe::FromJson(model).status(); }

TEST(Bpe, RefusesWhatItDoesNotImplementByName) {
  EXPECT_THAT(LoadError({{"type", "WordPiece"}}).message(),
              HasSubstr("model type \"WordPiece\" is not supported"));
  for (const char* setting : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    nlohmann::json model = BpeModel({});
    model[setting] = "##";
    EXPECT_THAT(LoadError(model).message(), HasSubstr(setting));
  }
  nlohmann::json dropout = BpeModel({});
  dropout["dropout"] = 0.1;
  EXPECT_THAT(LoadError(dropout).message(), HasSubstr("dropout=0.1"));
  nlohmann::json byte_fallback = BpeModel({});
  byte_fallback["byte_fallback"] = true;
  EXPECT_THAT(LoadError(byte_fallback).message(), HasSubstr("byte_fallback"));
  EXPECT_EQ(LoadError(dropout).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Bpe, RefusesAVocabularyWithoutEveryByte) {
  nlohmann::json model = BpeModel({});
  model["vocab"].erase(Symbols("\n"));
  EXPECT_THAT(LoadError(model).message(), HasSubstr("no token for byte 0x0A"));
}

TEST(Bpe, RefusesAMergeOutsideTheVocabulary) {
  nlohmann::json model = BpeModel({});
  model["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"})});
  EXPECT_THAT(LoadError(model).message(), HasSubstr("\"ab\" is not in model.vocab"));
  model["merges"] = nlohmann::json::array({"a b c"});
  EXPECT_THAT(LoadError(model).message(), HasSubstr("neither"));
}

}  // namespace
}  // namespace ballast::train
