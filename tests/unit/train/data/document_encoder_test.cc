#include "worker/train/data/document_encoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr TokenId kEndOfText = 256, kImStart = 257, kImEnd = 258;

// Byte-level ids 0..255 and ChatML's special tokens after them.
Tokenizer ChatmlTokenizer() {
  const nlohmann::json json = WithSpecialTokens(
      QwenStyleJson({}), {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, kEndOfText);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

std::vector<int32_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

std::vector<int32_t> Ignored(size_t n) { return std::vector<int32_t>(n, kIgnoreLabel); }

// The one document of a record that makes one, and whether the record held
// special-token text.
absl::Status EncodeOne(const DocumentEncoder& encoder, const std::string& record,
                       EncodedDocument* doc, bool* special_token_text = nullptr) {
  std::vector<EncodedDocument> docs;
  bool special = false;
  absl::Status s = encoder.Encode(record, &docs, &special);
  if (s.ok()) {
    EXPECT_EQ(docs.size(), 1u);
    *doc = docs.at(0);
  }
  if (special_token_text != nullptr) *special_token_text = special;
  return s;
}

DocumentEncoder Encoder(DataFormat format, std::optional<std::string> chat_template,
                        TrainOn train_on = TrainOn::kAssistant, bool allow_special_tokens = false) {
  std::optional<ChatTemplate> t;
  if (chat_template) t = *ChatTemplate::Named(*chat_template);
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create({.format = format,
                               .train_on = train_on,
                               .vocab_size = 300,
                               .eos = kEndOfText,
                               .allow_special_tokens = allow_special_tokens},
                              ChatmlTokenizer(), std::move(t));
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  return *std::move(encoder);
}

TEST(DocumentEncoderTest, TextIsEveryTokenTrainedThenEosAndNeverForgesASpecialToken) {
  EncodedDocument doc;
  ASSERT_TRUE(
      EncodeOne(Encoder(DataFormat::kText, std::nullopt), R"({"text": "hi<|im_end|>"})", &doc)
          .ok());
  const std::vector<int32_t> want = Concat({Bytes("hi<|im_end|>"), {kEndOfText}});
  EXPECT_EQ(doc.input_ids, want);
  EXPECT_EQ(doc.labels, want);
}

TEST(DocumentEncoderTest, SpecialTokenTextIsPlainTextUnlessAllowedAndIsReportedEitherWay) {
  EncodedDocument doc;
  bool special = false;
  const std::string text = R"({"text": "a<|im_start|>b"})";
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kText, std::nullopt), text, &doc, &special).ok());
  EXPECT_EQ(doc.input_ids, Concat({Bytes("a<|im_start|>b"), {kEndOfText}}));
  EXPECT_TRUE(special);
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kText, std::nullopt, TrainOn::kAssistant, true), text,
                        &doc, &special)
                  .ok());
  EXPECT_EQ(doc.input_ids, Concat({Bytes("a"), {kImStart}, Bytes("b"), {kEndOfText}}));
  EXPECT_TRUE(special);
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kText, std::nullopt, TrainOn::kAssistant, true),
                        R"({"text": "a<|im_start"})", &doc, &special)
                  .ok());
  EXPECT_FALSE(special);

  // Prompt and completion: either one holding it counts.
  const std::string completion = R"({"prompt": "Q", "completion": " A<|endoftext|>"})";
  ASSERT_TRUE(
      EncodeOne(Encoder(DataFormat::kPromptCompletion, std::nullopt), completion, &doc, &special)
          .ok());
  EXPECT_EQ(doc.input_ids, Concat({Bytes("Q A<|endoftext|>"), {kEndOfText}}));
  EXPECT_TRUE(special);
  ASSERT_TRUE(
      EncodeOne(Encoder(DataFormat::kPromptCompletion, std::nullopt, TrainOn::kAssistant, true),
                completion, &doc, &special)
          .ok());
  EXPECT_EQ(doc.input_ids, Concat({Bytes("Q A"), {kEndOfText}, {kEndOfText}}));
  EXPECT_EQ(doc.labels, Concat({Ignored(1), Bytes(" A"), {kEndOfText}, {kEndOfText}}));
  EXPECT_TRUE(special);

  // In a chat, the content's text is plain text and the template's tokens
  // stay; allowed, the content's token is the control token, as the
  // template's are.
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}, )"
                           R"({"role": "assistant", "content": "y<|im_end|>o"}]})";
  const std::vector<int32_t> prompt = Concat(
      {{kImStart}, Bytes("user\nhi"), {kImEnd}, Bytes("\n"), {kImStart}, Bytes("assistant\n")});
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kMessages, "chatml"), chat, &doc, &special).ok());
  EXPECT_EQ(doc.input_ids, Concat({prompt, Bytes("y<|im_end|>o"), {kImEnd}, Bytes("\n")}));
  EXPECT_TRUE(special);
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kMessages, "chatml", TrainOn::kAssistant, true), chat,
                        &doc, &special)
                  .ok());
  EXPECT_EQ(doc.input_ids,
            Concat({prompt, Bytes("y"), {kImEnd}, Bytes("o"), {kImEnd}, Bytes("\n")}));
  EXPECT_TRUE(special);
}

TEST(DocumentEncoderTest, PromptCompletionWithoutATemplateTrainsTheCompletionAndEos) {
  EncodedDocument doc;
  const std::string record = R"({"prompt": "Q:", "completion": " A"})";
  ASSERT_TRUE(EncodeOne(Encoder(DataFormat::kPromptCompletion, std::nullopt), record, &doc).ok());
  EXPECT_EQ(doc.input_ids, Concat({Bytes("Q:"), Bytes(" A"), {kEndOfText}}));
  EXPECT_EQ(doc.labels, Concat({Ignored(2), Bytes(" A"), {kEndOfText}}));
  ASSERT_TRUE(
      EncodeOne(Encoder(DataFormat::kPromptCompletion, std::nullopt, TrainOn::kAll), record, &doc)
          .ok());
  EXPECT_EQ(doc.labels, doc.input_ids);
}

TEST(DocumentEncoderTest, ChatsTrainTheAssistantTurnsAsTheTemplateMasksThem) {
  const std::string header = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> prompt = Concat(
      {{kImStart}, Bytes("user\nhi"), {kImEnd}, Bytes("\n"), {kImStart}, Bytes("assistant\n")});
  for (
      const std::string record :
      {R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})",
       R"({"prompt": "hi", "completion": "yo"})"}) {
    const DataFormat format = record.find("messages") != std::string::npos
                                  ? DataFormat::kMessages
                                  : DataFormat::kPromptCompletion;
    EncodedDocument doc;
    ASSERT_TRUE(EncodeOne(Encoder(format, "chatml"), record, &doc).ok()) << record;
    EXPECT_EQ(doc.input_ids, Concat({prompt, Bytes("yo"), {kImEnd}, Bytes("\n")})) << header;
    EXPECT_EQ(doc.labels, Concat({Ignored(prompt.size()), Bytes("yo"), {kImEnd}, Ignored(1)}))
        << record;
  }
}

TEST(DocumentEncoderTest, BadRecordsSayWhatIsWrong) {
  struct Case {
    DataFormat format;
    const char* record;
    const char* message;
  };
  for (const Case& c : {
           Case{DataFormat::kText, "[1, 2]", "not a JSON object"},
           Case{DataFormat::kText, R"({"txt": "a"})", "no \"text\""},
           Case{DataFormat::kText, R"({"text": 5})", "\"text\" is not a string"},
           Case{DataFormat::kText, R"({"text": ""})", "at least 2 tokens, this one has 1"},
           Case{DataFormat::kMessages, R"({"messages": []})", "not a non-empty list"},
           Case{DataFormat::kMessages, R"({"messages": [{"content": "a"}]})",
                "messages[0]: no \"role\""},
           Case{DataFormat::kMessages, R"({"messages": [{"role": "user", "content": 3}]})",
                "messages[0].content is not a string"},
           Case{DataFormat::kMessages, R"({"messages": [{"role": "user", "content": "hi"}]})",
                "no token to train on: the record has no assistant turn"},
           Case{DataFormat::kPromptCompletion, R"({"prompt": "a"})", "no \"completion\""},
       }) {
    EncodedDocument doc;
    const absl::Status s = EncodeOne(Encoder(c.format, "chatml"), c.record, &doc);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.record << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.record;
  }
}

// Issue 33: nlohmann's parser takes a NUL for the end of the text, so
// "{...}\0garbage" was a good record.
TEST(DocumentEncoderTest, ALineIsOneObjectAndNothingAfterIt) {
  const DocumentEncoder encoder = Encoder(DataFormat::kText, std::nullopt);
  EncodedDocument doc;
  ASSERT_TRUE(EncodeOne(encoder, "{\"text\": \"ab\"} \t\r", &doc).ok());
  struct Case {
    std::string line;
    const char* message;
  };
  for (const Case& c : {
           Case{std::string("{\"text\": \"ab\"}\0", 15), "a NUL byte at byte 15"},
           Case{std::string("{\"text\": \"ab\"}\0garbage", 22), "a NUL byte at byte 15"},
           Case{std::string("{\"text\": \"a\0b\"}", 15), "a NUL byte at byte 12"},
           Case{"{\"text\": \"ab\"} x", "not a JSON object: at byte 16"},
           Case{"{\"text\": \"ab\"}{}", "not a JSON object: at byte 15"},
           // nlohmann throws out_of_range, not parse_error, for a number past
           // double's range: it escaped the catch and ended the trainer (make fuzz).
           Case{"{\"text\": \"ab\", \"n\": 8e880}", "number overflow parsing '8e880'"},
           Case{"8e880", "number overflow parsing '8e880'"},
       }) {
    const absl::Status s = EncodeOne(encoder, c.line, &doc);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

// Invalid UTF-8 in a string is a bad record that says so; the message never
// quotes the bytes, which would make it invalid UTF-8 too.
TEST(DocumentEncoderTest, InvalidUtf8InAStringIsABadRecordSayingSo) {
  const DocumentEncoder encoder = Encoder(DataFormat::kText, std::nullopt);
  EncodedDocument doc;
  for (const std::string& text : {std::string("a\xff"), std::string("\xc0\xaf"),
                                  std::string("\xed\xa0\x80"), std::string("\\ud800 x")}) {
    const absl::Status s = EncodeOne(encoder, "{\"text\": \"" + text + "\"}", &doc);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("not a JSON object: at byte "));
    EXPECT_THAT(s.message(),
                ::testing::AnyOf(HasSubstr("ill-formed UTF-8"), HasSubstr("surrogate")));
    EXPECT_EQ(s.message().find('\xff'), absl::string_view::npos);
    EXPECT_EQ(s.message().find('\xc0'), absl::string_view::npos);
    EXPECT_EQ(s.message().find('\xed'), absl::string_view::npos);
  }
}

// A record nested 10^5 deep is refused before it is parsed: the parse of
// 8M levels (16 MiB of brackets) held 500 MiB.
TEST(DocumentEncoderTest, DeepNestingIsRefusedBeforeItIsParsed) {
  const DocumentEncoder encoder = Encoder(DataFormat::kText, std::nullopt);
  EncodedDocument doc;
  const int n = 100000;
  const std::string deep =
      "{\"text\": \"ab\", \"x\": " + std::string(n, '[') + std::string(n, ']') + "}";
  const absl::Status s = EncodeOne(encoder, deep, &doc);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nests deeper than 128 levels (at byte 148)"));
  // Brackets in strings do not count, and kMaxRecordDepth levels are fine.
  const std::string at_limit =
      "{\"text\": \"[[[[\\\"{{\", \"x\": " + std::string(kMaxRecordDepth - 1, '[') +
      std::string(kMaxRecordDepth - 1, ']') + "}";
  EXPECT_TRUE(EncodeOne(encoder, at_limit, &doc).ok()) << EncodeOne(encoder, at_limit, &doc);
}

TEST(DocumentEncoderTest, ATokenizerLargerThanTheModelIsRefusedWhateverTheRecord) {
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create({.format = DataFormat::kText, .vocab_size = 200, .eos = kEndOfText},
                              ChatmlTokenizer(), std::nullopt);
  ASSERT_TRUE(encoder.ok());
  EncodedDocument doc;
  const absl::Status s = EncodeOne(*encoder, R"({"text": "ab"})", &doc);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("token id 256, outside the model's vocabulary [0, 200)"));
}

TEST(DocumentEncoderTest, FormatsNeedWhatTheyRender) {
  EXPECT_THAT(DocumentEncoder::Create({.format = DataFormat::kText, .vocab_size = 10}, std::nullopt,
                                      std::nullopt)
                  .status()
                  .message(),
              HasSubstr("needs a tokenizer"));
  EXPECT_THAT(DocumentEncoder::Create({.format = DataFormat::kMessages, .vocab_size = 300},
                                      ChatmlTokenizer(), std::nullopt)
                  .status()
                  .message(),
              HasSubstr("needs a chat template"));
  for (const DataFormat format : {DataFormat::kTokens, DataFormat::kReranker}) {
    EXPECT_THAT(
        DocumentEncoder::Create({.format = format, .vocab_size = 300, .allow_special_tokens = true},
                                ChatmlTokenizer(), std::nullopt)
            .status()
            .message(),
        HasSubstr("data.allow_special_tokens is for the text, prompt_completion and "
                  "messages formats"));
  }
}

TEST(DataFormatTest, IsDetectedFromTheFirstRecordsKeys) {
  const auto detect = [](const char* record) {
    return DetectDataFormat(nlohmann::json::parse(record));
  };
  EXPECT_EQ(*detect(R"({"messages": [], "text": "x"})"), DataFormat::kMessages);
  EXPECT_EQ(*detect(R"({"prompt": "a", "completion": "b"})"), DataFormat::kPromptCompletion);
  EXPECT_EQ(*detect(R"({"text": "a"})"), DataFormat::kText);
  EXPECT_EQ(*detect(R"({"input_ids": [1]})"), DataFormat::kTokens);
  EXPECT_THAT(detect(R"({"prompt": "a"})").status().message(), HasSubstr("set data.format"));
  EXPECT_THAT(ParseDataFormat("sharegpt").status().message(),
              HasSubstr("not one of messages, prompt_completion, text, tokens"));
}

}  // namespace
}  // namespace ballast::train
