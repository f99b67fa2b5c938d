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
// Exit code 2 when the tokenizer does not load, with the reason on stderr.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/train/text/byte_level.h"
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

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool template_only = args.size() == 2 && args[0] == "--template";
  if (args.size() == 2 && args[0] == "--pre-tokenize") return PreTokenize(args[1]);
  if (args.size() != 1 && !template_only) {
    std::cerr << "usage: tokenize_check [--template | --pre-tokenize] TOKENIZER_JSON_OR_DIR "
                 "< in.jsonl\n";
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
    std::cout << Process(*tokenizer, nlohmann::json::parse(line)).dump() << "\n";
  }
  return 0;
}
