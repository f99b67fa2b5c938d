// Tiny tokenizer.json documents for the text/ tests, built in code: the 256
// byte symbols as ids 0..255, then the tokens the merges make, in order.
#ifndef BALLAST_TESTS_UNIT_TRAIN_TEXT_TOKENIZER_JSON_H_
#define BALLAST_TESTS_UNIT_TRAIN_TEXT_TOKENIZER_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/train/text/byte_level.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {

// Qwen2/Qwen3's pre-tokenizer regex; Llama 3 has \p{N}{1,3} for \p{N}.
inline constexpr char kQwenRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline std::string Symbols(const std::string& bytes) { return BytesToSymbols(bytes); }

// A BPE model whose merges are given in raw bytes, e.g. {" ", "a"} for "Ġa".
inline nlohmann::json BpeModel(const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[Symbols(std::string(1, static_cast<char>(byte)))] = byte;
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [left, right] : merges) {
    const std::string merged = Symbols(left + right);
    if (!vocab.contains(merged)) vocab[merged] = vocab.size();
    merge_list.push_back({Symbols(left), Symbols(right)});
  }
  return {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
          {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
          {"vocab", vocab},    {"merges", merge_list}};
}

inline nlohmann::json SplitThenByteLevel(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", regex}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

// A whole Qwen-style tokenizer.json: NFC, the Qwen regex, ByteLevel decoder.
inline nlohmann::json QwenStyleJson(
    const std::vector<std::pair<std::string, std::string>>& merges) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", SplitThenByteLevel(kQwenRegex)},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", BpeModel(merges)}};
}

// `json` with `tokens` appended as special added tokens, ids from first_id on
// (which must follow the vocabulary, as tokenizers numbers them).
inline nlohmann::json WithSpecialTokens(nlohmann::json json, const std::vector<std::string>& tokens,
                                        int first_id) {
  for (const std::string& token : tokens) {
    json["added_tokens"].push_back({{"id", first_id++},
                                    {"content", token},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}});
  }
  return json;
}

}  // namespace ballast::train

#endif  // BALLAST_TESTS_UNIT_TRAIN_TEXT_TOKENIZER_JSON_H_
