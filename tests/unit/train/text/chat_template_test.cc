#include "worker/train/text/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/unit/train/text/tokenizer_json.h"
#include "worker/train/text/chat_render.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ----------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------

ChatMessage Message(std::string role, std::string content,
                    std::optional<std::string> reasoning = std::nullopt) {
  return ChatMessage{std::move(role), std::move(content), std::move(reasoning)};
}

ChatTemplate Named(std::string_view name) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Named(name);
  EXPECT_TRUE(chat_template.ok()) << chat_template.status();
  return *chat_template;
}

std::string Render(std::string_view name, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = false) {
  absl::StatusOr<std::string> text = Named(name).Render(messages, add_generation_prompt);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.value_or("");
}

nlohmann::json AddedToken(const std::string& content, TokenId id, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// BpeModel numbers the merges' tokens from 256 on: "hi" 256, "\n\n" 257.
constexpr TokenId kVocab = 256 + 2;
const std::vector<std::pair<std::string, std::string>> kMerges = {{"h", "i"}, {"\n", "\n"}};

// Qwen-style (NFC, the Qwen regex) with ChatML's tokens and Qwen3's
// <think>, </think>, which are added but not special.
nlohmann::json QwenJson() {
  nlohmann::json json = QwenStyleJson(kMerges);
  json["added_tokens"] = {
      AddedToken("<|im_start|>", kVocab, true), AddedToken("<|im_end|>", kVocab + 1, true),
      AddedToken("<think>", kVocab + 2, false), AddedToken("</think>", kVocab + 3, false)};
  return json;
}

// Llama-3-style: no normalizer, the \p{N}{1,3} regex, Llama 3's tokens.
nlohmann::json LlamaJson() {
  nlohmann::json json = QwenStyleJson(kMerges);
  json["normalizer"] = nullptr;
  json["pre_tokenizer"] = SplitThenByteLevel(kLlama3Regex);
  json["added_tokens"] = {AddedToken("<|begin_of_text|>", kVocab, true),
                          AddedToken("<|start_header_id|>", kVocab + 1, true),
                          AddedToken("<|end_header_id|>", kVocab + 2, true),
                          AddedToken("<|eot_id|>", kVocab + 3, true)};
  return json;
}

Tokenizer Make(const nlohmann::json& json) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

EncodedChat Encode(const Tokenizer& tokenizer, std::string_view name,
                   const std::vector<ChatMessage>& messages,
                   TrainOn train_on = TrainOn::kAssistant) {
  absl::StatusOr<EncodedChat> chat =
      Named(name).Encode(tokenizer, messages, train_on, /*allow_special=*/false);
  EXPECT_TRUE(chat.ok()) << chat.status();
  if (!chat.ok()) return {};
  EXPECT_EQ(chat->ids.size(), chat->supervised.size());
  return *std::move(chat);
}

// The supervised tokens decoded, one string per run of them.
std::vector<std::string> SupervisedRuns(const Tokenizer& tokenizer, const EncodedChat& chat) {
  std::vector<std::string> runs;
  std::vector<TokenId> run;
  for (size_t i = 0; i <= chat.ids.size(); ++i) {
    if (i < chat.ids.size() && chat.supervised[i]) {
      run.push_back(chat.ids[i]);
      continue;
    }
    if (run.empty()) continue;
    runs.push_back(tokenizer.Decode(run).value_or("?"));
    run.clear();
  }
  return runs;
}

// ----------------------------------------------------------------------------
// Render
// ----------------------------------------------------------------------------

TEST(ChatTemplateRender, ChatmlWritesEveryRoleBetweenImStartAndImEnd) {
  EXPECT_EQ(Render("chatml",
                   {Message("system", "s"), Message("user", "u"),
                    Message("assistant", "a", "ignored"), Message("tool", "t")},
                   /*add_generation_prompt=*/true),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
            "<|im_start|>assistant\na<|im_end|>\n<|im_start|>tool\nt<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateRender, Llama3StartsWithBosAndTrimsWhatPythonCallsWhitespace) {
  // U+001C and U+0085 are whitespace to str.strip(); U+200B is not.
  EXPECT_EQ(Render("llama3",
                   {Message("system", " s\n"), Message("user", "\x1c\u3000u\u200b\u0085"),
                    Message("assistant", "\n\na\t")},
                   /*add_generation_prompt=*/true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\ns<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nu\u200b<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateRender, TrimPythonWhitespaceTakesExactlyStrIsspace) {
  EXPECT_EQ(TrimPythonWhitespace("\u2028\u202F\u1680 x y \u205F\u3000\x1f"), "x y");
  EXPECT_EQ(TrimPythonWhitespace("\u200B x\u180E"), "\u200B x\u180E");
  EXPECT_EQ(TrimPythonWhitespace(" \n\t "), "");
}

TEST(ChatTemplateRender, Qwen3DropsReasoningBeforeTheLastQueryAndShowsItAfter) {
  EXPECT_EQ(Render("qwen3",
                   {Message("system", "S"), Message("user", "q1"), Message("assistant", "a1", "r1"),
                    Message("user", "q2"), Message("assistant", "a2", "\nr2\n")}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3GivesTheLastTurnAnEmptyThinkBlockWithoutReasoning) {
  EXPECT_EQ(Render("qwen3", {Message("user", "q"), Message("assistant", "\n\na")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n");
  EXPECT_EQ(Render("qwen3", {Message("user", "q")}, /*add_generation_prompt=*/true),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateRender, Qwen3SplitsReasoningWrittenIntoTheContent) {
  EXPECT_EQ(Render("qwen3", {Message("user", "q"),
                             Message("assistant", "<think>\nplan\n</think>\n\nanswer")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nplan\n</think>\n\nanswer<|im_end|>\n");
  // Reasoning before the first </think>, after its last <think>; content
  // after the last </think>. In an earlier turn the reasoning is dropped.
  EXPECT_EQ(Render("qwen3", {Message("user", "q1"), Message("assistant", "<think>p1</think>a1"),
                             Message("user", "q2"),
                             Message("assistant", "x<think>y</think>mid</think>\nz")}),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\ny\n</think>\n\nz<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3TakesGivenReasoningEvenEmptyOverTheContentsThinkTags) {
  EXPECT_EQ(Render("qwen3", {Message("user", "q"), Message("assistant", "a</think>b", "")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na</think>b<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3GroupsToolResultsAndShowsReasoningOfTurnsAfterTheQuery) {
  EXPECT_EQ(Render("qwen3",
                   {Message("user", "q"), Message("assistant", "call", "r1"), Message("tool", "t1"),
                    Message("tool", "t2"), Message("assistant", "done", "r2")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr1\n</think>\n\ncall<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nt1\n</tool_response>\n<tool_response>\nt2\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\ndone<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3DoesNotCountAToolResponseUserTurnAsAQuery) {
  EXPECT_EQ(Render("qwen3", {Message("user", "q"), Message("assistant", "a", "r"),
                             Message("user", "<tool_response>x</tool_response>"),
                             Message("assistant", "b")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
            "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3WithoutAQueryShowsNoThinkBlock) {
  EXPECT_EQ(Render("qwen3", {Message("system", "s"), Message("assistant", "a", "r")}),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
  // A later system message reads like a user turn.
  EXPECT_EQ(Render("qwen3", {Message("user", "q"), Message("system", "s2")}),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>system\ns2<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3ClosesAnEmptyThinkBlockInThePromptWithoutThinking) {
  EXPECT_EQ(Named("qwen3").Render({Message("user", "q")}, true, /*enable_thinking=*/false).value(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// The expected texts below are transformers 5.23's apply_chat_template with
// Qwen3.5's template (tests/parity/qwen3_5_chat_template.jinja).

TEST(ChatTemplateRender, Qwen3_5TrimsEveryMessageAndThinksInEveryTurnAfterTheLastQuery) {
  EXPECT_EQ(Render("qwen3_5",
                   {Message("system", "  S \n"), Message("user", "\tq1 "),
                    Message("assistant", " a1 ", "r1"), Message("user", "q2\n"),
                    Message("assistant", "\n a2 \n", " \nr2\u3000"), Message("assistant", "a3")}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na3<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3_5PromptOpensTheThinkBlockOrClosesAnEmptyOne) {
  EXPECT_EQ(Render("qwen3_5", {Message("user", "q")}, /*add_generation_prompt=*/true),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(
      Named("qwen3_5").Render({Message("user", "q")}, true, /*enable_thinking=*/false).value(),
      "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Without a generation prompt, enable_thinking changes nothing.
  const std::vector<ChatMessage> chat = {Message("user", "q"), Message("assistant", "a")};
  EXPECT_EQ(Named("qwen3_5").Render(chat, false, false).value(), Render("qwen3_5", chat));
}

TEST(ChatTemplateRender, Qwen3_5SplitsReasoningWrittenIntoTheContentAndTrimsIt) {
  EXPECT_EQ(
      Render("qwen3_5", {Message("user", "q"),
                         Message("assistant", "x<think>\n y \n</think>\n\n mid</think>\n z ")}),
      "<|im_start|>user\nq<|im_end|>\n"
      "<|im_start|>assistant\n<think>\ny\n</think>\n\n z<|im_end|>\n");
  // Given reasoning, even empty, wins over the content's tags.
  EXPECT_EQ(Render("qwen3_5", {Message("user", "q"), Message("assistant", "a</think>b", "")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na</think>b<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3_5GroupsToolResultsAndGivesAFirstOneNoHeader) {
  EXPECT_EQ(Render("qwen3_5", {Message("tool", " t0 "), Message("user", "q"),
                               Message("assistant", "call", "r1"), Message("tool", "t1"),
                               Message("tool", " t2\n"), Message("assistant", "done")}),
            "\n<tool_response>\nt0\n</tool_response><|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr1\n</think>\n\ncall<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nt1\n</tool_response>\n<tool_response>\nt2\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\ndone<|im_end|>\n");
}

TEST(ChatTemplateRender, Qwen3_5DoesNotCountATrimmedToolResponseUserTurnAsAQuery) {
  EXPECT_EQ(Render("qwen3_5", {Message("user", "q"), Message("assistant", "a", "r"),
                               Message("user", " <tool_response>x</tool_response>\n"),
                               Message("assistant", "b")}),
            "<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
            "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n");
}

// ----------------------------------------------------------------------------
// Encode and its mask
// ----------------------------------------------------------------------------

TEST(ChatTemplateEncode, IdsAreTheWholeRenderingTokenizedAtOnce) {
  const Tokenizer tokenizer = Make(QwenJson());
  const std::vector<ChatMessage> messages = {Message("user", "hi"), Message("assistant", "\n\nhi")};
  for (const char* name : {"qwen3", "chatml"}) {
    const EncodedChat chat = Encode(tokenizer, name, messages);
    EXPECT_EQ(chat.ids,
              tokenizer.Encode(Render(name, messages), true).value_or(std::vector<TokenId>{}))
        << name;
  }
}

TEST(ChatTemplateEncode, ChatmlSupervisesAssistantContentAndImEndOnly) {
  const Tokenizer tokenizer = Make(QwenJson());
  const EncodedChat chat =
      Encode(tokenizer, "chatml",
             {Message("system", "hi"), Message("user", "hi"), Message("assistant", "hi w"),
              Message("user", "hi"), Message("assistant", "hi")});
  EXPECT_THAT(SupervisedRuns(tokenizer, chat), ElementsAre("hi w<|im_end|>", "hi<|im_end|>"));
  // The "\n" after <|im_end|> is not trained on.
  EXPECT_EQ(chat.ids.back(), '\n');
  EXPECT_EQ(chat.supervised.back(), 0);
}

TEST(ChatTemplateEncode, ATokenJoiningTheHeaderNewlineToContentIsSupervised) {
  // "assistant\n" + "\n\nhi": the regex makes "\n\n\n" one pre-token, which
  // BPE splits as "\n\n" (the header's "\n" and the content's first) and
  // "\n". The first ends in the content, so it is the content's.
  const Tokenizer tokenizer = Make(QwenJson());
  const EncodedChat chat =
      Encode(tokenizer, "chatml", {Message("user", "hi"), Message("assistant", "\n\nhi")});
  EXPECT_THAT(SupervisedRuns(tokenizer, chat), ElementsAre("\n\n\nhi<|im_end|>"));
}

TEST(ChatTemplateEncode, Qwen3SupervisesThinkBlocksWithReasoningButNotEmptyOnes) {
  const Tokenizer tokenizer = Make(QwenJson());
  const EncodedChat thinking = Encode(tokenizer, "qwen3",
                                      {Message("user", "hi"), Message("assistant", "a1", "r"),
                                       Message("user", "hi"), Message("assistant", "hi", "think")});
  EXPECT_THAT(SupervisedRuns(tokenizer, thinking),
              ElementsAre("a1<|im_end|>", "<think>\nthink\n</think>\n\nhi<|im_end|>"));
  const EncodedChat empty =
      Encode(tokenizer, "qwen3", {Message("user", "hi"), Message("assistant", "hi")});
  EXPECT_THAT(SupervisedRuns(tokenizer, empty), ElementsAre("hi<|im_end|>"));
}

TEST(ChatTemplateEncode, Qwen3_5TrainsWhatFollowsThePromptsThinkOpenerButNoEmptyBlock) {
  const Tokenizer tokenizer = Make(QwenJson());
  const EncodedChat chat =
      Encode(tokenizer, "qwen3_5",
             {Message("user", "hi"), Message("assistant", "a1", "r"), Message("user", "hi"),
              Message("assistant", "hi", "think"), Message("assistant", "hi w")});
  // The turn before the last query shows no block; after it, the prompt
  // "<|im_start|>assistant\n<think>\n" is given, and an empty block too.
  EXPECT_THAT(SupervisedRuns(tokenizer, chat),
              ElementsAre("a1<|im_end|>", "think\n</think>\n\nhi<|im_end|>", "hi w<|im_end|>"));
  EXPECT_EQ(
      chat.ids,
      tokenizer
          .Encode(Render("qwen3_5", {Message("user", "hi"), Message("assistant", "a1", "r"),
                                     Message("user", "hi"), Message("assistant", "hi", "think"),
                                     Message("assistant", "hi w")}),
                  true)
          .value_or(std::vector<TokenId>{}));
}

TEST(ChatTemplateEncode, Llama3SupervisesTrimmedContentAndEotButNotBosOrHeaders) {
  const Tokenizer tokenizer = Make(LlamaJson());
  const EncodedChat chat =
      Encode(tokenizer, "llama3",
             {Message("system", "s"), Message("user", "u"), Message("assistant", " hi \n")});
  EXPECT_EQ(chat.ids.front(), kVocab);  // <|begin_of_text|>
  EXPECT_THAT(SupervisedRuns(tokenizer, chat), ElementsAre("hi<|eot_id|>"));
}

TEST(ChatTemplateEncode, TrainOnAllSupervisesEveryToken) {
  const Tokenizer tokenizer = Make(LlamaJson());
  const EncodedChat chat =
      Encode(tokenizer, "llama3", {Message("user", "u"), Message("assistant", "a")}, TrainOn::kAll);
  EXPECT_FALSE(chat.ids.empty());
  EXPECT_EQ(chat.supervised, std::vector<uint8_t>(chat.ids.size(), 1));
}

TEST(ChatTemplateEncode, MapsTheMaskThroughNfc) {
  const Tokenizer tokenizer = Make(QwenJson());
  const std::vector<ChatMessage> messages = {Message("user", "e\u0301"),
                                             Message("assistant", "\u212B hi e\u0301")};
  const EncodedChat chat = Encode(tokenizer, "chatml", messages);
  EXPECT_EQ(chat.ids,
            tokenizer.Encode(Render("chatml", messages), true).value_or(std::vector<TokenId>{}));
  EXPECT_THAT(SupervisedRuns(tokenizer, chat), ElementsAre("\u00C5 hi \u00E9<|im_end|>"));
}

TEST(ChatTemplateEncode, AnLstripTokenThatEatsTheHeaderNewlineIsTheContents) {
  nlohmann::json json = QwenJson();
  nlohmann::json marker = AddedToken("[[x]]", kVocab + 4, false);
  marker["lstrip"] = true;
  json["added_tokens"].push_back(marker);
  const Tokenizer tokenizer = Make(json);
  const EncodedChat chat =
      Encode(tokenizer, "chatml", {Message("user", "hi"), Message("assistant", "[[x]]")});
  // ... "assistant" then [[x]], which took the header's "\n" with it.
  const std::vector<TokenId> tail(chat.ids.end() - 4, chat.ids.end());
  EXPECT_THAT(tail, ElementsAre('t', kVocab + 4, kVocab + 1, '\n'));
  EXPECT_THAT(SupervisedRuns(tokenizer, chat), ElementsAre("[[x]]<|im_end|>"));
}

TEST(ChatTemplateEncode, RefusesAMaskWhenNormalizationCrossesAPieceBoundary) {
  // A raw added token "\ne" straddles the header and the content, so "e" is
  // not normalized with the U+0301 after it as it would be in the content
  // alone; the pieces no longer line up with the tokens.
  nlohmann::json json = QwenJson();
  json["added_tokens"].push_back(AddedToken("\ne", kVocab + 4, false));
  const Tokenizer tokenizer = Make(json);
  absl::StatusOr<EncodedChat> chat =
      Named("chatml").Encode(tokenizer, {Message("user", "e\u0301")}, TrainOn::kAssistant, false);
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(chat.status().message(), HasSubstr("do not line up"));
}

// ----------------------------------------------------------------------------
// Refusals
// ----------------------------------------------------------------------------

TEST(ChatTemplateRefusals, AnUnknownRoleAnEmptyChatAndInvalidUtf8) {
  for (const char* name : {"qwen3", "qwen3_5", "chatml", "llama3"}) {
    absl::StatusOr<std::string> text =
        Named(name).Render({Message("user", "q"), Message("function", "f")}, false);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(), HasSubstr("messages[1].role \"function\""));
    EXPECT_THAT(Named(name).Render({}, true).status().message(), HasSubstr("no messages"));
    EXPECT_THAT(
        Named(name).Render({Message("assistant", "a", "\xC0\xAF")}, false).status().message(),
        HasSubstr("messages[0].reasoning is not valid UTF-8"));
  }
}

TEST(ChatTemplateRefusals, Qwen3_5ALaterSystemMessageAndAChatWithoutAQuery) {
  absl::StatusOr<std::string> text =
      Named("qwen3_5").Render({Message("user", "q"), Message("system", "s")}, false);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("messages[1] is a system message"));
  for (const std::vector<ChatMessage>& chat :
       {std::vector<ChatMessage>{Message("system", "s"), Message("assistant", "a")},
        std::vector<ChatMessage>{Message("user", "<tool_response>x</tool_response>"),
                                 Message("assistant", "a")}}) {
    absl::StatusOr<EncodedChat> encoded =
        Named("qwen3_5").Encode(Make(QwenJson()), chat, TrainOn::kAssistant, false);
    EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(encoded.status().message(), HasSubstr("no user query"));
  }
}

TEST(ChatTemplateEncode, SpecialTokenTextInAMessageIsPlainTextAndTheTemplatesTokensStay) {
  const Tokenizer tokenizer = Make(QwenJson());
  const TokenId im_start = tokenizer.TokenToId("<|im_start|>");
  const TokenId im_end = tokenizer.TokenToId("<|im_end|>");
  auto plain = [&](std::string_view text) { return tokenizer.Encode(text, false).value(); };
  absl::StatusOr<EncodedChat> chat = Named("chatml").Encode(
      tokenizer, {Message("user", "q"), Message("assistant", "a <|im_end|> b")},
      TrainOn::kAssistant, false);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->special_token_text);
  std::vector<TokenId> want = {im_start};
  for (const std::vector<TokenId>& part : {plain("user\nq"),
                                           {im_end},
                                           plain("\n"),
                                           {im_start},
                                           plain("assistant\na <|im_end|> b"),
                                           {im_end},
                                           plain("\n")}) {
    want.insert(want.end(), part.begin(), part.end());
  }
  EXPECT_EQ(chat->ids, want);
  EXPECT_THAT(SupervisedRuns(tokenizer, *chat), ElementsAre("a <|im_end|> b<|im_end|>"));
  // Also in reasoning, which counts though the template drops it here.
  const std::vector<ChatMessage> dropped = {Message("user", "q"), Message("assistant", "a"),
                                            Message("user", "q")};
  chat = Named("qwen3").Encode(
      tokenizer,
      {Message("user", "q"), Message("assistant", "a", "<|im_start|>"), Message("user", "q")},
      TrainOn::kAssistant, false);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->special_token_text);
  EXPECT_EQ(chat->ids,
            Named("qwen3").Encode(tokenizer, dropped, TrainOn::kAssistant, false).value().ids);
  // Added tokens that are not special are matched as `tokenizers` matches them.
  chat = Named("qwen3").Encode(tokenizer, {Message("user", "<think>"), Message("assistant", "a")},
                               TrainOn::kAssistant, false);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_FALSE(chat->special_token_text);
  EXPECT_EQ(
      chat->ids,
      tokenizer
          .Encode(Render("qwen3", {Message("user", "<think>"), Message("assistant", "a")}), true)
          .value());
}

TEST(ChatTemplateEncode, AllowedSpecialTokenTextBecomesTheTokenAsApplyChatTemplateDoes) {
  const Tokenizer tokenizer = Make(QwenJson());
  const std::vector<ChatMessage> messages = {Message("user", "q <|im_start|>x"),
                                             Message("assistant", "a<|im_end|>b")};
  absl::StatusOr<EncodedChat> chat =
      Named("chatml").Encode(tokenizer, messages, TrainOn::kAssistant, /*allow_special=*/true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->special_token_text);
  EXPECT_EQ(chat->ids, tokenizer.Encode(Render("chatml", messages), true).value());
  // The assistant's <|im_end|> inside its content is trained with the content.
  EXPECT_THAT(SupervisedRuns(tokenizer, *chat), ElementsAre("a<|im_end|>b<|im_end|>"));
  // A chat without such text says so, allowed or not.
  chat = Named("chatml").Encode(tokenizer, {Message("user", "q"), Message("assistant", "a")},
                                TrainOn::kAssistant, /*allow_special=*/true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_FALSE(chat->special_token_text);
}

TEST(ChatTemplateRefusals, AnUnknownTemplateNameListsTheBuiltIns) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Named("qwen2");
  EXPECT_EQ(chat_template.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chat_template.status().message(), HasSubstr("\"qwen2\""));
  EXPECT_THAT(chat_template.status().message(), HasSubstr("qwen3, qwen3_5, chatml, llama3"));
  EXPECT_EQ(Named("llama3").name(), "llama3");
}

TEST(ChatTemplateRefusals, ATokenizerWithoutTheTemplatesControlTokens) {
  absl::StatusOr<EncodedChat> chat =
      Named("llama3").Encode(Make(QwenJson()), {Message("user", "q")}, TrainOn::kAssistant, false);
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chat.status().message(), HasSubstr("no token <|begin_of_text|>"));
}

// ----------------------------------------------------------------------------
// Detect
// ----------------------------------------------------------------------------

class ChatTemplateDetect : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ballast-chat-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  void WriteConfig(const nlohmann::json& chat_template) {
    Write("tokenizer_config.json", nlohmann::json{{"chat_template", chat_template}}.dump());
  }
  absl::StatusOr<ChatTemplate> Detect() { return ChatTemplate::Detect(dir_.string()); }
  std::string DetectedName() {
    absl::StatusOr<ChatTemplate> detected = Detect();
    EXPECT_TRUE(detected.ok()) << detected.status();
    return detected.ok() ? std::string(detected->name()) : "";
  }

  fs::path dir_;
};

TEST_F(ChatTemplateDetect, TellsTheBuiltInsByTheirTokens) {
  WriteConfig("{{'<|im_start|>' + m}}{% if r %}<think>{% endif %}");
  EXPECT_EQ(DetectedName(), "qwen3");
  WriteConfig("{{'<|im_start|>' + message['role']}}");
  EXPECT_EQ(DetectedName(), "chatml");
  WriteConfig("{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>");
  EXPECT_EQ(DetectedName(), "llama3");
  // The config file itself may be given, and a list of named templates.
  WriteConfig(nlohmann::json::array({{{"name", "tool_use"}, {"template", "<|start_header_id|>"}},
                                     {{"name", "default"}, {"template", "<|im_start|>"}}}));
  absl::StatusOr<ChatTemplate> detected =
      ChatTemplate::Detect((dir_ / "tokenizer_config.json").string());
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ(detected->name(), "chatml");
}

TEST_F(ChatTemplateDetect, ReadsChatTemplateJinjaWhenTheConfigHasNone) {
  Write("tokenizer_config.json", "{}");
  EXPECT_EQ(Detect().status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Detect().status().message(), HasSubstr("has no chat_template"));
  Write("chat_template.jinja", "<|im_start|><think>");
  EXPECT_EQ(DetectedName(), "qwen3");
}

TEST_F(ChatTemplateDetect, TellsQwen3_5ByItsTrimmedReasoning) {
  // Qwen3.5's own template, as its checkpoints ship it.
  const char* root = std::getenv("BALLAST_SOURCE_DIR");
  ASSERT_NE(root, nullptr) << "run through ctest, which sets BALLAST_SOURCE_DIR";
  std::ifstream file(std::string(root) + "/tests/parity/qwen3_5_chat_template.jinja");
  const std::string jinja((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_THAT(jinja, HasSubstr("reasoning_content|trim"));
  Write("tokenizer_config.json", "{}");
  Write("chat_template.jinja", jinja);
  EXPECT_EQ(DetectedName(), "qwen3_5");
  WriteConfig(jinja);
  EXPECT_EQ(DetectedName(), "qwen3_5");
}

TEST_F(ChatTemplateDetect, AnUnknownTemplateAsksForDataTemplate) {
  WriteConfig("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}");
  EXPECT_EQ(Detect().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Detect().status().message(), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(Detect().status().message(), HasSubstr("set data.template"));
}

TEST_F(ChatTemplateDetect, AMissingFileIsNotFoundAndBadJsonInvalid) {
  EXPECT_EQ(Detect().status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Detect().status().message(), HasSubstr("tokenizer_config.json"));
  Write("tokenizer_config.json", "{\"chat_template\": ");
  EXPECT_EQ(Detect().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Detect().status().message(), HasSubstr("not valid JSON"));
}

}  // namespace
}  // namespace ballast::train
