#include "worker/train/text/tokenizer.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "worker/train/text/byte_level.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

std::string TypeOf(const nlohmann::json& component) {
  return component.is_object() ? component.value("type", "") : component.dump();
}

// The ByteLevel decoder is the only one a byte-level vocabulary reads back
// with; without one, `tokenizers` would join the raw tokens with spaces.
absl::Status CheckDecoder(const nlohmann::json& decoder) {
  if (TypeOf(decoder) == "ByteLevel") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("decoder type \"", TypeOf(decoder), "\" is not supported (only ByteLevel)"));
}

// Collects what the post-processor adds around a single sequence. ByteLevel
// only trims offsets, which ids do not carry.
absl::Status ReadPostProcessor(const nlohmann::json& post_processor, std::vector<TokenId>* prefix,
                               std::vector<TokenId>* suffix) {
  if (post_processor.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(post_processor);
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && post_processor.contains("processors")) {
    for (const nlohmann::json& step : post_processor["processors"]) {
      if (absl::Status status = ReadPostProcessor(step, prefix, suffix); !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") {
    bool after_sequence = false;
    for (const nlohmann::json& piece : post_processor.at("single")) {
      if (piece.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      for (const nlohmann::json& value : post_processor.at("special_tokens").at(name).at("ids")) {
        absl::StatusOr<TokenId> id =
            TokenIdFromJson(value, absl::StrCat("post_processor special token ", name));
        if (!id.ok()) return id.status();
        (after_sequence ? suffix : prefix)->push_back(*id);
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("post_processor type \"", type,
                   "\" is not supported (only TemplateProcessing, ByteLevel and Sequence)"));
}

absl::Status WithPrefix(const std::string& prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path_or_dir) {
  std::filesystem::path path(path_or_dir);
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) path /= "tokenizer.json";
  // Without blocking: a FIFO here once held a rank in open() for good.
  absl::StatusOr<std::string> text = ReadRegularFile(path.string(), kMaxTokenizerJsonBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": no such tokenizer file"));
  }
  if (!text.ok()) return text.status();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON: ", e.what()));
  }
  absl::StatusOr<Tokenizer> tokenizer = FromJson(json);
  if (!tokenizer.ok()) return WithPrefix(path.string(), tokenizer.status());
  return tokenizer;
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(const nlohmann::json& json) try {
  if (!json.is_object()) return absl::InvalidArgumentError("not a tokenizer.json object");
  for (const char* key : {"truncation", "padding"}) {
    if (json.contains(key) && !json[key].is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " is not supported (only null): ", json[key].dump()));
    }
  }
  absl::StatusOr<Bpe> bpe = Bpe::FromJson(json.value("model", nlohmann::json()));
  if (!bpe.ok()) return bpe.status();
  absl::StatusOr<Normalizer> normalizer =
      Normalizer::FromJson(json.value("normalizer", nlohmann::json()));
  if (!normalizer.ok()) return normalizer.status();
  absl::StatusOr<PreTokenizer> pre_tokenizer =
      PreTokenizer::FromJson(json.value("pre_tokenizer", nlohmann::json()));
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  if (absl::Status status = CheckDecoder(json.value("decoder", nlohmann::json())); !status.ok()) {
    return status;
  }
  Tokenizer tokenizer(*std::move(bpe), *std::move(normalizer), *std::move(pre_tokenizer));
  if (absl::Status status =
          ReadPostProcessor(json.value("post_processor", nlohmann::json()),
                            &tokenizer.template_prefix_, &tokenizer.template_suffix_);
      !status.ok()) {
    return status;
  }

  // `tokenizers` does not take an added token's id from the json: it keeps
  // the vocabulary's id of the same string, else hands out the next id from
  // the vocabulary's size on. A json that says otherwise would decode
  // differently there, so it is refused.
  auto next_id = static_cast<TokenId>(tokenizer.bpe_.vocab_size());
  for (const nlohmann::json& entry : json.value("added_tokens", nlohmann::json::array())) {
    AddedToken token;
    token.content = entry.at("content").get<std::string>();
    absl::StatusOr<TokenId> id = TokenIdFromJson(entry.at("id"), "added_tokens id");
    if (!id.ok()) return id.status();
    token.id = *id;
    token.single_word = entry.value("single_word", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.normalized = entry.value("normalized", true);
    token.special = entry.value("special", false);
    if (token.content.empty() || tokenizer.added_ids_.contains(token.content)) {
      return absl::InvalidArgumentError(
          absl::StrCat("added_tokens: \"", token.content,
                       "\" is empty or listed twice, which is not supported"));
    }
    const TokenId in_vocab = tokenizer.bpe_.TokenToId(token.content);
    const TokenId expected = in_vocab >= 0 ? in_vocab : next_id++;
    if (token.id != expected) {
      return absl::InvalidArgumentError(absl::StrCat("added_tokens: \"", token.content,
                                                     "\" has id ", token.id, " but tokenizers ",
                                                     "would give it ", expected));
    }
    if (token.normalized) {
      absl::StatusOr<std::string> pattern = tokenizer.normalizer_.Normalize(token.content);
      if (!pattern.ok()) return pattern.status();
      tokenizer.normalized_added_.Add(*pattern, token);
      tokenizer.normalized_special_ = tokenizer.normalized_special_ || token.special;
    } else {
      tokenizer.raw_added_.Add(token.content, token);
    }
    tokenizer.added_content_[token.id] = token.content;
    tokenizer.added_ids_[token.content] = token.id;
  }
  return tokenizer;
} catch (const nlohmann::json::exception& e) {
  // A field of the wrong json type or a missing one, deep in a component.
  return absl::InvalidArgumentError(absl::StrCat("malformed tokenizer.json: ", e.what()));
}

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(std::string_view text,
                                                       bool allow_special) const {
  std::vector<TokenId> ids;
  if (absl::Status status = EncodeInto(text, SpecialTokens{.allow = allow_special}, &ids, nullptr);
      !status.ok()) {
    return status;
  }
  return ids;
}

absl::StatusOr<Tokenizer::Encoding> Tokenizer::EncodeWithOffsets(std::string_view text,
                                                                 bool allow_special) const {
  return EncodeWithOffsets(text, SpecialTokens{.allow = allow_special});
}

absl::StatusOr<Tokenizer::Encoding> Tokenizer::EncodeWithOffsets(
    std::string_view text, const SpecialTokens& special) const {
  Encoding encoding;
  if (absl::Status status = EncodeInto(text, special, &encoding.ids, &encoding); !status.ok()) {
    return status;
  }
  return encoding;
}

absl::Status Tokenizer::EncodeInto(std::string_view text, const SpecialTokens& special,
                                   std::vector<TokenId>* ids, Encoding* offsets) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  std::vector<TextSegment> segments;
  raw_added_.Split(text, special, &segments);
  for (const TextSegment& segment : segments) {
    if (segment.id < 0) {
      const size_t begin = segment.text.data() - text.data();
      if (absl::Status status = EncodeStretch(
              segment.text, special.Within(begin, begin + segment.text.size()), ids, offsets);
          !status.ok()) {
        return status;
      }
      continue;
    }
    ids->push_back(segment.id);
    if (offsets != nullptr) {
      offsets->normalized.append(segment.text);
      offsets->ends.push_back(offsets->normalized.size());
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeStretch(std::string_view text, const SpecialTokens& special,
                                      std::vector<TokenId>* ids, Encoding* offsets) const {
  std::string normalized;
  if (normalizer_.active()) {
    absl::StatusOr<std::string> result = normalizer_.Normalize(text);
    if (!result.ok()) return result.status();
    normalized = *std::move(result);
    text = normalized;
  }
  // Offsets in `text` become offsets in offsets->normalized from here on.
  const size_t base = offsets != nullptr ? offsets->normalized.size() : 0;
  std::vector<size_t>* ends = offsets != nullptr ? &offsets->ends : nullptr;
  std::vector<TextSegment> segments;
  normalized_added_.Split(text, special, &segments);
  std::vector<std::string_view> pieces;
  for (const TextSegment& segment : segments) {
    const size_t segment_start = base + (segment.text.data() - text.data());
    if (segment.id >= 0) {
      ids->push_back(segment.id);
      if (ends != nullptr) ends->push_back(segment_start + segment.text.size());
      continue;
    }
    pieces.clear();
    if (absl::Status status = pre_tokenizer_.Split(segment.text, &pieces); !status.ok()) {
      return status;
    }
    for (const std::string_view piece : pieces) {
      const size_t first = ends != nullptr ? ends->size() : 0;
      bpe_.Tokenize(piece, ids, ends);
      if (ends == nullptr) continue;
      const size_t piece_start = segment_start + (piece.data() - segment.text.data());
      for (size_t i = first; i < ends->size(); ++i) (*ends)[i] += piece_start;
    }
  }
  if (offsets != nullptr) offsets->normalized.append(text);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Normalize(std::string_view text, bool allow_special) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  if (!normalizer_.active()) return std::string(text);
  std::string normalized;
  std::vector<TextSegment> segments;
  raw_added_.Split(text, SpecialTokens{.allow = allow_special}, &segments);
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      normalized.append(segment.text);
      continue;
    }
    absl::StatusOr<std::string> stretch = normalizer_.Normalize(segment.text);
    if (!stretch.ok()) return stretch.status();
    normalized.append(*stretch);
  }
  return normalized;
}

absl::StatusOr<std::optional<std::string>> Tokenizer::FindSpecialToken(
    std::string_view text) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  if (const AddedToken* token = raw_added_.FindSpecial(text); token != nullptr) {
    return token->content;
  }
  if (!normalized_special_) return std::nullopt;
  absl::StatusOr<std::string> normalized = normalizer_.Normalize(text);
  if (!normalized.ok()) return normalized.status();
  if (const AddedToken* token = normalized_added_.FindSpecial(*normalized); token != nullptr) {
    return token->content;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const TokenId> ids) const {
  std::string bytes;
  for (const TokenId id : ids) {
    if (const auto added = added_content_.find(id); added != added_content_.end()) {
      AppendTokenBytes(added->second, &bytes);
    } else if (const std::string* token = bpe_.IdToToken(id); token != nullptr) {
      AppendTokenBytes(*token, &bytes);
    } else {
      return absl::OutOfRangeError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  return Utf8Lossy(bytes);
}

TokenId Tokenizer::TokenToId(std::string_view token) const {
  if (const auto added = added_ids_.find(absl::string_view(token.data(), token.size()));
      added != added_ids_.end())
    return added->second;
  return bpe_.TokenToId(token);
}

}  // namespace ballast::train
