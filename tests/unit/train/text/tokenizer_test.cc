#include "worker/train/text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Ids 0..255 are the bytes; merges add " w" 256, "wo" ... as BpeModel
// numbers them. Added tokens come after the vocabulary.
constexpr TokenId kVocab = 256 + 2;

nlohmann::json AddedTokenJson(const std::string& content, TokenId id, bool special,
                              bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

nlohmann::json TestJson() {
  nlohmann::json json = QwenStyleJson({{" ", "w"}, {"h", "i"}});
  json["added_tokens"] = {AddedTokenJson("<|im_start|>", kVocab, true, false),
                          AddedTokenJson("<|im_end|>", kVocab + 1, true, false),
                          AddedTokenJson("<think>", kVocab + 2, false, false)};
  return json;
}

Tokenizer Make(const nlohmann::json& json) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

std::vector<TokenId> Encode(const Tokenizer& tokenizer, const std::string& text,
                            bool allow_special = true) {
  absl::StatusOr<std::vector<TokenId>> ids = tokenizer.Encode(text, allow_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.value_or(std::vector<TokenId>{});
}

// The ids of text that no merge touches: its bytes.
std::vector<TokenId> Bytes(const std::string& text) {
  std::vector<TokenId> ids;
  for (const char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(Tokenizer, SpecialTokensAreCutOutBeforeTheRegexAndBpe) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_THAT(Encode(tokenizer, "<|im_start|>hi<|im_end|>"), ElementsAre(kVocab, 257, kVocab + 1));
  EXPECT_EQ(Encode(tokenizer, "a<|im_start|>"), (std::vector<TokenId>{'a', kVocab}));
}

TEST(Tokenizer, SpecialTokensOffEncodesTheirTextButKeepsOtherAddedTokens) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_EQ(Encode(tokenizer, "<|im_end|>", /*allow_special=*/false),
            (std::vector<TokenId>{'<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>'}));
  // <think> is an added token but not a special one, as in Qwen3.
  EXPECT_THAT(Encode(tokenizer, "<think>", /*allow_special=*/false), ElementsAre(kVocab + 2));
}

TEST(Tokenizer, LongestAddedTokenWinsAtTheSamePlace) {
  nlohmann::json json = TestJson();
  json["added_tokens"].push_back(AddedTokenJson("<|im_start|>assistant", kVocab + 3, true, false));
  const Tokenizer tokenizer = Make(json);
  EXPECT_THAT(Encode(tokenizer, "<|im_start|>assistant<|im_start|>"),
              ElementsAre(kVocab + 3, kVocab));
}

TEST(Tokenizer, LstripAndRstripSwallowTheWhitespaceAround) {
  nlohmann::json json = TestJson();
  nlohmann::json tool = AddedTokenJson("<tool>", kVocab + 3, true, false);
  tool["lstrip"] = true;
  tool["rstrip"] = true;
  json["added_tokens"].push_back(tool);
  const Tokenizer tokenizer = Make(json);
  EXPECT_THAT(Encode(tokenizer, "a \t<tool>\n\n b"), ElementsAre('a', kVocab + 3, 'b'));
}

TEST(Tokenizer, SingleWordTokensMatchOnlyBetweenNonWordCharacters) {
  nlohmann::json json = TestJson();
  nlohmann::json word = AddedTokenJson("word", kVocab + 3, false, false);
  word["single_word"] = true;
  json["added_tokens"].push_back(word);
  const Tokenizer tokenizer = Make(json);
  EXPECT_THAT(Encode(tokenizer, "word"), ElementsAre(kVocab + 3));
  EXPECT_THAT(Encode(tokenizer, "(word)"), ElementsAre('(', kVocab + 3, ')'));
  EXPECT_EQ(Encode(tokenizer, "swords"), Bytes("swords"));
  EXPECT_EQ(Encode(tokenizer, "word_"), Bytes("word_"));  // '_' is a word character
  // A combining mark after it is a word character to Rust's \w too.
  EXPECT_EQ(Encode(tokenizer, "word\u0301"), Bytes("word\u0301"));
  // So is a Unicode 16 letter (Todhri), which utf8proc's tables predate.
  EXPECT_EQ(Encode(tokenizer, "word\U000105C0"), Bytes("word\U000105C0"));
  // And the circled letters, Alphabetic though So.
  EXPECT_EQ(Encode(tokenizer, "\u24B6word"), Bytes("\u24B6word"));
}

TEST(Tokenizer, NfcComposesBeforeBpe) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_EQ(Encode(tokenizer, "e\u0301"), Bytes("\u00E9"));
  EXPECT_EQ(Encode(tokenizer, "\u212B"), Bytes("\u00C5"));  // Angstrom sign to Å
  // Marks assigned after Unicode 9.0 are inert in tokenizers' NFC: U+0D3B
  // (class 9) is not moved before U+0351 (class 230).
  EXPECT_EQ(Encode(tokenizer, "\u0351\u0D3B"), Bytes("\u0351\u0D3B"));
  EXPECT_EQ(Encode(tokenizer, "a\u0301\u0323"), Bytes("\u1EA1\u0301"));
  // Hangul composes; U+11A7 is no trailing consonant and stays (utf8proc 2.6
  // would compose it away).
  EXPECT_EQ(Encode(tokenizer, "\u1100\u1161\u11A8"), Bytes("\uAC01"));
  EXPECT_EQ(Encode(tokenizer, "\uAC00\u11A7"), Bytes("\uAC00\u11A7"));
}

TEST(Tokenizer, NormalizedAddedTokensMatchTheNormalizedText) {
  nlohmann::json json = TestJson();
  json["added_tokens"].push_back(AddedTokenJson("cafe\u0301", kVocab + 3, false, true));
  const Tokenizer tokenizer = Make(json);
  EXPECT_THAT(Encode(tokenizer, "caf\u00E9"), ElementsAre(kVocab + 3));
  EXPECT_THAT(Encode(tokenizer, "cafe\u0301"), ElementsAre(kVocab + 3));
  // The same token with normalized:false needs its exact decomposed text.
  json["added_tokens"].back()["normalized"] = false;
  const Tokenizer raw = Make(json);
  EXPECT_THAT(Encode(raw, "cafe\u0301"), ElementsAre(kVocab + 3));
  EXPECT_EQ(Encode(raw, "caf\u00E9"), Bytes("caf\u00E9"));
}

TEST(Tokenizer, EncodeWithOffsetsGivesWhereEachIdEndsInTheNormalizedText) {
  const Tokenizer tokenizer = Make(TestJson());
  const std::string text = "hi e\u0301<|im_start|> w";
  absl::StatusOr<Tokenizer::Encoding> encoding = tokenizer.EncodeWithOffsets(text, true);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_EQ(encoding->ids, Encode(tokenizer, text));
  EXPECT_EQ(encoding->normalized, "hi \u00E9<|im_start|> w");
  // "hi", then " é" as its three bytes, <|im_start|>, " w".
  EXPECT_THAT(encoding->ends, ElementsAre(2, 3, 4, 5, 17, 19));
}

TEST(Tokenizer, EncodeWithOffsetsCountsTheWhitespaceAnLstripTokenTook) {
  nlohmann::json json = TestJson();
  nlohmann::json tool = AddedTokenJson("<tool>", kVocab + 3, true, false);
  tool["lstrip"] = true;
  tool["rstrip"] = true;
  json["added_tokens"].push_back(tool);
  const Tokenizer tokenizer = Make(json);
  absl::StatusOr<Tokenizer::Encoding> encoding =
      tokenizer.EncodeWithOffsets("a \t<tool>\n\n b", true);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_THAT(encoding->ids, ElementsAre('a', kVocab + 3, 'b'));
  EXPECT_THAT(encoding->ends, ElementsAre(1, 12, 13));
}

TEST(Tokenizer, NormalizeKeepsRawAddedTokensAndNormalizesBetweenThem) {
  nlohmann::json json = TestJson();
  json["added_tokens"].push_back(AddedTokenJson("cafe\u0301", kVocab + 3, false, false));
  const Tokenizer tokenizer = Make(json);
  EXPECT_EQ(tokenizer.Normalize("cafe\u0301 e\u0301", true).value_or(""), "cafe\u0301 \u00E9");
  EXPECT_EQ(tokenizer.Normalize("\xFF", true).status().code(), absl::StatusCode::kInvalidArgument);
  json["normalizer"] = nullptr;
  EXPECT_EQ(Make(json).Normalize("e\u0301", true).value_or(""), "e\u0301");
}

TEST(Tokenizer, FindSpecialTokenLooksForSpecialTokensOnly) {
  nlohmann::json json = TestJson();
  nlohmann::json word = AddedTokenJson("word", kVocab + 3, true, false);
  word["single_word"] = true;
  json["added_tokens"].push_back(word);
  json["added_tokens"].push_back(AddedTokenJson("cafe\u0301", kVocab + 4, true, true));
  const Tokenizer tokenizer = Make(json);
  const auto find = [&](std::string_view text) {
    absl::StatusOr<std::optional<std::string>> found = tokenizer.FindSpecialToken(text);
    EXPECT_TRUE(found.ok()) << found.status();
    return found.value_or(std::nullopt).value_or("");
  };
  EXPECT_EQ(find("a <|im_end|> b"), "<|im_end|>");
  EXPECT_EQ(find("<think> and <|im_end"), "");  // <think> is not special
  // Also where Encode would not match it: inside a word for single_word.
  EXPECT_EQ(find("swords"), "word");
  // A normalized token is looked for in the normalized text.
  EXPECT_EQ(find("caf\u00E9"), "cafe\u0301");
  EXPECT_EQ(tokenizer.FindSpecialToken("\xFF").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, DecodeGivesTheTextBack) {
  const Tokenizer tokenizer = Make(TestJson());
  const std::string text = "<|im_start|>hi w\u00F6rld \u65E5\u672C \U0001F600\n<think>";
  absl::StatusOr<std::string> decoded = tokenizer.Decode(Encode(tokenizer, text));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

TEST(Tokenizer, DecodeReplacesACutCharacterAndRefusesAnUnknownId) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_EQ(*tokenizer.Decode({0xE4, 0xB8}), "\uFFFD");
  const absl::Status unknown = tokenizer.Decode({1, kVocab + 3}).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(unknown.message(), HasSubstr("token id 261"));
}

TEST(Tokenizer, EncodeRefusesInvalidUtf8) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_EQ(tokenizer.Encode("ok \xC0\x80", true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, TemplateProcessingGivesTheBosItWouldAddButEncodeAddsNone) {
  nlohmann::json json = TestJson();
  json["pre_tokenizer"] = SplitThenByteLevel(kLlama3Regex);
  json["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", nlohmann::json::array()},
      {"special_tokens",
       {{"<|im_start|>",
         {{"id", "<|im_start|>"}, {"ids", {kVocab}}, {"tokens", {"<|im_start|>"}}}}}}};
  const Tokenizer tokenizer = Make(json);
  EXPECT_THAT(tokenizer.template_prefix(), ElementsAre(kVocab));
  EXPECT_TRUE(tokenizer.template_suffix().empty());
  EXPECT_EQ(Encode(tokenizer, "hi"), (std::vector<TokenId>{257}));
}

TEST(Tokenizer, TokenToIdKnowsAddedAndVocabularyTokens) {
  const Tokenizer tokenizer = Make(TestJson());
  EXPECT_EQ(tokenizer.TokenToId("<|im_end|>"), kVocab + 1);
  EXPECT_EQ(tokenizer.TokenToId("\u0120w"), 256);
  EXPECT_EQ(tokenizer.TokenToId("nope"), -1);
}

absl::Status LoadError(const nlohmann::json& json) { return Tokenizer::FromJson(json).status(); }

TEST(Tokenizer, RefusesUnsupportedComponentsByNameAndType) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"model", {{"type", "Unigram"}}, "model type \"Unigram\""},
      {"normalizer", {{"type", "NFKC"}}, "normalizer type \"NFKC\""},
      {"pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer type \"Whitespace\""},
      {"decoder", {{"type", "WordPiece"}}, "decoder type \"WordPiece\""},
      {"decoder", nullptr, "decoder type \"null\""},
      {"post_processor", {{"type", "BertProcessing"}}, "post_processor type \"BertProcessing\""},
      {"truncation", {{"max_length", 8}}, "truncation is not supported"},
      {"padding", {{"pad_id", 0}}, "padding is not supported"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = TestJson();
    json[c.key] = c.value;
    const absl::Status status = LoadError(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(Tokenizer, RefusesAddedTokenIdsThatTokenizersWouldReassign) {
  nlohmann::json json = TestJson();
  json["added_tokens"][1]["id"] = 5000;
  EXPECT_THAT(LoadError(json).message(),
              HasSubstr("\"<|im_end|>\" has id 5000 but tokenizers would give it 259"));
  json = TestJson();
  json["added_tokens"][0]["id"] = "258";
  EXPECT_THAT(LoadError(json).message(), HasSubstr("added_tokens id = \"258\" is not a token id"));
}

// A float id used to be converted to int32 (undefined behaviour for 1e30,
// which UBSan flags in the tokenizer fuzz target), and a negative
// vocabulary id went on to index the embedding.
TEST(Tokenizer, RefusesIdsThatAreNotTokenIdsWithoutConvertingThem) {
  nlohmann::json json = TestJson();
  json["added_tokens"][0]["id"] = 1e30;
  EXPECT_THAT(LoadError(json).message(),
              HasSubstr("added_tokens id = 1e+30 is not a token id (an integer in 0..2147483647)"));
  json = TestJson();
  json["model"]["vocab"]["a"] = -5;
  EXPECT_THAT(LoadError(json).message(), HasSubstr("model.vocab[\"a\"] = -5 is not a token id"));
  json = TestJson();
  json["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {2.5}}}}}}};
  EXPECT_THAT(LoadError(json).message(),
              HasSubstr("post_processor special token <|im_start|> = 2.5 is not a token id"));
}

class TokenizerFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ballast-tokenizer-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Write(const std::string& text) { std::ofstream(dir_ / "tokenizer.json") << text; }

  fs::path dir_;
};

TEST_F(TokenizerFileTest, LoadsAFileOrTheModelFolderHoldingIt) {
  Write(TestJson().dump());
  EXPECT_TRUE(Tokenizer::Load(dir_.string()).ok());
  EXPECT_TRUE(Tokenizer::Load((dir_ / "tokenizer.json").string()).ok());
}

TEST_F(TokenizerFileTest, AMissingFileIsNotFoundByName) {
  const absl::Status status = Tokenizer::Load(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr((dir_ / "tokenizer.json").string()));
}

TEST_F(TokenizerFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  // Opened plainly, a FIFO blocks until a writer comes: a rank held for good.
  ASSERT_EQ(mkfifo((dir_ / "tokenizer.json").c_str(), 0600), 0);
  const absl::Status status = Tokenizer::Load(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.json is a FIFO"));
}

TEST_F(TokenizerFileTest, MalformedJsonAndUnsupportedPartsNameTheFile) {
  Write("{\"model\": ");
  absl::Status status = Tokenizer::Load(dir_.string()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr((dir_ / "tokenizer.json").string() + ": not valid JSON"));
  nlohmann::json json = TestJson();
  json["normalizer"] = {{"type", "Lowercase"}};
  Write(json.dump());
  status = Tokenizer::Load(dir_.string()).status();
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.json: normalizer type \"Lowercase\""));
}

}  // namespace
}  // namespace ballast::train
