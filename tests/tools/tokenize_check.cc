// tokenize_check: the C++ tokenizer as a filter, for the parity test
// against Python's `tokenizers` (tests/parity/test_tokenizer.py).
//
//   tokenize_check TOKENIZER_JSON_OR_DIR < in.jsonl > out.jsonl
//
// Each input line is {"text": str, "allow_special": bool} or {"ids": [int]};
// each output line is {"ids": [...], "decoded": str} (the text encoded, and
// those ids decoded) or {"decoded": str}, or {"error": str} when that line
// fails. With --template it prints the post-processor's
// {"prefix": [...], "suffix": [...]} instead. With --pre-tokenize it runs
// only the json's pre_tokenizer on each {"text": str} and writes
// {"pieces": [...]}, in byte symbols as `tokenizers`' pre_tokenize_str does.
// With --chat TEMPLATE it runs a built-in chat template (chat_template.h) on
// each {"messages": [{"role", "content", "reasoning_content"?}],
// "train_on": "assistant" | "all", "add_generation_prompt": bool,
// "enable_thinking": bool (default true)} and writes
// {"text": str, "ids": [...], "supervised": [0 | 1, ...]}: the rendering,
// and the encoding with its mask (only without a generation prompt, which
// training data never has), or {"error": str}
// (tests/parity/test_chat_template.py).
// Exit code 2 when the tokenizer does not load, with the reason on stderr.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/train/text/byte_level.h"
#include "worker/train/text/chat_template.h"
#include "worker/train/text/pre_tokenizer.h"
#include "worker/train/text/tokenizer.h"

namespace {

nlohmann::json Process(const ballast::train::Tokenizer& tokenizer, const nlohmann::json& request) {
  std::vector<ballast::train::TokenId> ids;
  nlohmann::json reply;
  if (request.contains("text")) {
    absl::StatusOr<std::vector<ballast::train::TokenId>> encoded =
        tokenizer.Encode(request["text"].get<std::string>(), request.value("allow_special", true));
    if (!encoded.ok()) return {{"error", encoded.status().ToString()}};
    ids = *std::move(encoded);
    reply["ids"] = ids;
  } else {
    ids = request.at("ids").get<std::vector<ballast::train::TokenId>>();
  }
  absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
  if (!decoded.ok()) return {{"error", decoded.status().ToString()}};
  reply["decoded"] = *decoded;
  return reply;
}

int PreTokenize(const std::string& path) {
  absl::StatusOr<ballast::train::PreTokenizer> pre_tokenizer =
      ballast::train::PreTokenizer::FromJson(
          nlohmann::json::parse(std::ifstream(path))["pre_tokenizer"]);
  if (!pre_tokenizer.ok()) {
    std::cerr << pre_tokenizer.status() << "\n";
    return 2;
  }
  std::string line;
  std::vector<std::string_view> pieces;
  while (std::getline(std::cin, line)) {
    const std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
    pieces.clear();
    if (absl::Status status = pre_tokenizer->Split(text, &pieces); !status.ok()) {
      std::cout << nlohmann::json{{"error", status.ToString()}}.dump() << "\n";
      continue;
    }
    nlohmann::json symbols = nlohmann::json::array();
    for (const std::string_view piece : pieces)
      symbols.push_back(ballast::train::BytesToSymbols(piece));
    std::cout << nlohmann::json{{"pieces", symbols}}.dump() << "\n";
  }
  return 0;
}

nlohmann::json Chat(const ballast::train::ChatTemplate& chat_template,
                    const ballast::train::Tokenizer& tokenizer, const nlohmann::json& request) {
  std::vector<ballast::train::ChatMessage> messages;
  for (const nlohmann::json& message : request.at("messages")) {
    messages.push_back({message.at("role").get<std::string>(),
                        message.at("content").get<std::string>(), std::nullopt});
    if (message.contains("reasoning_content")) {
      messages.back().reasoning = message["reasoning_content"].get<std::string>();
    }
  }
  const bool generation_prompt = request.value("add_generation_prompt", false);
  absl::StatusOr<std::string> text =
      chat_template.Render(messages, generation_prompt, request.value("enable_thinking", true));
  if (!text.ok()) return {{"error", text.status().ToString()}};
  nlohmann::json reply = {{"text", *text}};
  if (generation_prompt) return reply;
  const auto train_on = request.value("train_on", "assistant") == "all"
                            ? ballast::train::TrainOn::kAll
                            : ballast::train::TrainOn::kAssistant;
  absl::StatusOr<ballast::train::EncodedChat> encoded =
      chat_template.Encode(tokenizer, messages, train_on, request.value("allow_special", false));
  if (!encoded.ok()) return {{"error", encoded.status().ToString()}};
  reply["ids"] = encoded->ids;
  reply["supervised"] = encoded->supervised;
  return reply;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool template_only = args.size() == 2 && args[0] == "--template";
  const bool chat = args.size() == 3 && args[0] == "--chat";
  if (args.size() == 2 && args[0] == "--pre-tokenize") return PreTokenize(args[1]);
  if (args.size() != 1 && !template_only && !chat) {
    std::cerr << "usage: tokenize_check [--template | --pre-tokenize | --chat TEMPLATE] "
                 "TOKENIZER_JSON_OR_DIR < in.jsonl\n";
    return 2;
  }
  absl::StatusOr<ballast::train::ChatTemplate> chat_template =
      ballast::train::ChatTemplate::Named(chat ? args[1] : "chatml");
  if (!chat_template.ok()) {
    std::cerr << chat_template.status() << "\n";
    return 2;
  }
  absl::StatusOr<ballast::train::Tokenizer> tokenizer =
      ballast::train::Tokenizer::Load(args.back());
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 2;
  }
  if (template_only) {
    std::cout << nlohmann::json{{"prefix", tokenizer->template_prefix()},
                                {"suffix", tokenizer->template_suffix()}}
                     .dump()
              << "\n";
    return 0;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    const nlohmann::json request = nlohmann::json::parse(line);
    std::cout
        << (chat ? Chat(*chat_template, *tokenizer, request) : Process(*tokenizer, request)).dump()
        << "\n";
  }
  return 0;
}
