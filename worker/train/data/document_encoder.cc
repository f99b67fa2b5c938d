#include "worker/train/data/document_encoder.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

absl::StatusOr<absl::string_view> StringField(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end()) return Bad(absl::StrCat("no \"", key, "\""));
  if (!it->is_string()) return Bad(absl::StrCat("\"", key, "\" is not a string"));
  return absl::string_view(it->get_ref<const std::string&>());
}

absl::Status ParseTokens(const nlohmann::json& record, int64_t vocab_size,
                         EncodedDocument* document) {
  const auto ids = record.find("input_ids");
  if (ids == record.end() || !ids->is_array()) {
    return Bad("input_ids must be a list of token ids");
  }
  for (const nlohmann::json& v : *ids) {
    if (!v.is_number_integer()) return Bad("input_ids must be integers");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      return Bad(absl::StrCat("token id ", id, " outside the vocabulary [0, ", vocab_size, ")"));
    }
    document->input_ids.push_back(static_cast<int32_t>(id));
  }
  const auto labels = record.find("labels");
  if (labels == record.end()) {
    document->labels = document->input_ids;
    return absl::OkStatus();
  }
  if (!labels->is_array()) return Bad("labels must be a list");
  for (const nlohmann::json& v : *labels) {
    if (!v.is_number_integer()) return Bad("labels must be integers");
    const int64_t id = v.get<int64_t>();
    if (id != kIgnoreLabel && (id < 0 || id >= vocab_size)) {
      return Bad(absl::StrCat("label ", id, " is neither -100 nor in [0, ", vocab_size, ")"));
    }
    document->labels.push_back(static_cast<int32_t>(id));
  }
  if (document->labels.size() != document->input_ids.size()) {
    return Bad(absl::StrCat("labels has ", document->labels.size(), " entries, input_ids ",
                            document->input_ids.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const nlohmann::json& list,
                                                       absl::string_view key) {
  if (!list.is_array() || list.empty()) {
    return Bad(absl::StrCat("\"", key, "\" is not a non-empty list of messages"));
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& m = list[i];
    const std::string where = absl::StrCat(key, "[", i, "]");
    if (!m.is_object()) return Bad(absl::StrCat(where, " is not an object"));
    ChatMessage message;
    absl::StatusOr<absl::string_view> role = StringField(m, "role");
    if (!role.ok()) return Bad(absl::StrCat(where, ": ", role.status().message()));
    message.role = std::string(*role);
    // content may be null on an assistant turn that only reasons.
    if (const auto content = m.find("content"); content != m.end() && !content->is_null()) {
      if (!content->is_string()) return Bad(absl::StrCat(where, ".content is not a string"));
      message.content = content->get<std::string>();
    }
    if (const auto reasoning = m.find("reasoning_content");
        reasoning != m.end() && !reasoning->is_null()) {
      if (!reasoning->is_string()) {
        return Bad(absl::StrCat(where, ".reasoning_content is not a string"));
      }
      message.reasoning = reasoning->get<std::string>();
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

absl::StatusOr<std::vector<TokenId>> EncodeRecordText(const Tokenizer& tokenizer,
                                                      std::string_view text, bool allow_special,
                                                      bool* special_token_text) {
  absl::StatusOr<std::optional<std::string>> special = tokenizer.FindSpecialToken(text);
  if (!special.ok()) return special.status();
  *special_token_text = special->has_value();
  return tokenizer.Encode(text, allow_special);
}

absl::StatusOr<DocumentEncoder> DocumentEncoder::Create(DocumentEncoderOptions options,
                                                        std::optional<Tokenizer> tokenizer,
                                                        std::optional<ChatTemplate> chat_template) {
  const absl::string_view format = DataFormatName(options.format);
  if (options.format != DataFormat::kTokens && !tokenizer) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.format ", format,
                     " needs a tokenizer: a tokenizer.json in model.path or data.tokenizer"));
  }
  if (options.format == DataFormat::kMessages && !chat_template) {
    return absl::InvalidArgumentError(
        "data.format messages needs a chat template: set data.template to qwen3, qwen3_5, chatml "
        "or llama3");
  }
  if (options.allow_special_tokens &&
      (options.format == DataFormat::kTokens || options.format == DataFormat::kReranker)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.allow_special_tokens is for the text, prompt_completion and messages "
                     "formats, not ",
                     format));
  }
  return DocumentEncoder(options, std::move(tokenizer), std::move(chat_template));
}

absl::Status DocumentEncoder::Encode(absl::string_view line,
                                     std::vector<EncodedDocument>* documents,
                                     bool* special_token_text) const {
  documents->clear();
  *special_token_text = false;
  absl::StatusOr<nlohmann::json> parsed = ParseRecord(line);
  if (!parsed.ok()) return parsed.status();
  return EncodeParsed(*parsed, documents, special_token_text);
}

absl::Status DocumentEncoder::EncodeParsed(const nlohmann::json& record,
                                           std::vector<EncodedDocument>* documents,
                                           bool* special_token_text) const {
  documents->clear();
  *special_token_text = false;
  if (options_.format == DataFormat::kReranker) {
    if (absl::Status status = EncodeReranker(record, documents, special_token_text); !status.ok()) {
      return status;
    }
  } else {
    documents->emplace_back();
    if (absl::Status status = EncodeRecord(record, &documents->back(), special_token_text);
        !status.ok()) {
      return status;
    }
  }
  for (const EncodedDocument& document : *documents) {
    for (const int32_t id : document.input_ids) {
      if (id >= options_.vocab_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the tokenizer gives token id ", id, ", outside the model's vocabulary [0, ",
            options_.vocab_size, "): the tokenizer does not belong to the model"));
      }
    }
    const int64_t n = static_cast<int64_t>(document.input_ids.size());
    if (n < 2) return Bad(absl::StrCat("a document needs at least 2 tokens, this one has ", n));
    // Position t learns labels[t + 1]: a label only on the first token trains
    // nothing. A text record that trains nothing is a mistake (a chat without
    // an answer); a tokens record keeps its labels as written, as it always
    // did; a reranker candidate trains through its relevance.
    if (options_.format != DataFormat::kTokens && options_.format != DataFormat::kReranker &&
        std::all_of(document.labels.begin() + 1, document.labels.end(),
                    [](int32_t label) { return label == kIgnoreLabel; })) {
      return Bad(options_.train_on == TrainOn::kAssistant
                     ? "no token to train on: the record has no assistant turn or completion"
                     : "no token to train on");
    }
  }
  return absl::OkStatus();
}

absl::Status DocumentEncoder::EncodeReranker(const nlohmann::json& record,
                                             std::vector<EncodedDocument>* documents,
                                             bool* special_token_text) const {
  absl::StatusOr<RerankerRecord> parsed = ParseRerankerRecord(record);
  if (!parsed.ok()) return parsed.status();

  const size_t negatives =
      std::min(parsed->negatives.size(), static_cast<size_t>(options_.max_negatives));
  if (options_.needs_negative && negatives == 0) {
    return Bad("a listwise group needs a negative document; the record has none");
  }
  const size_t positives =
      std::min(parsed->positives.size(), static_cast<size_t>(options_.max_positives));
  // The data report counts the record when a text it trains on holds
  // special-token text (plain text here, EncodeCandidate).
  std::vector<const std::string*> texts = {&parsed->query};
  for (size_t g = 0; g < positives; ++g) texts.push_back(&parsed->positives[g]);
  for (size_t k = 0; k < negatives; ++k) texts.push_back(&parsed->negatives[k]);
  for (const std::string* text : texts) {
    absl::StatusOr<std::optional<std::string>> special = tokenizer_->FindSpecialToken(*text);
    if (!special.ok()) return special.status();
    *special_token_text = *special_token_text || special->has_value();
  }
  for (size_t g = 0; g < positives; ++g) {
    for (size_t k = 0; k <= negatives; ++k) {
      const std::string& text = k == 0 ? parsed->positives[g] : parsed->negatives[k - 1];
      EncodedDocument candidate;
      absl::StatusOr<std::vector<TokenId>> ids = EncodeCandidate(
          *tokenizer_, options_.reranker, parsed->query, text, options_.max_tokens, &candidate.cut);
      if (!ids.ok()) {
        return absl::Status(ids.status().code(),
                            absl::StrCat(k == 0 ? "positive " : "negative ", k == 0 ? g : k - 1,
                                         ": ", ids.status().message()));
      }
      candidate.input_ids.assign(ids->begin(), ids->end());
      candidate.labels.assign(ids->size(), kIgnoreLabel);
      candidate.relevance = k == 0 ? 1 : 0;
      candidate.group = static_cast<int32_t>(g);
      documents->push_back(std::move(candidate));
    }
  }
  return absl::OkStatus();
}

absl::Status DocumentEncoder::EncodeRecord(const nlohmann::json& record, EncodedDocument* document,
                                           bool* special_token_text) const {
  switch (options_.format) {
    case DataFormat::kTokens:
      return ParseTokens(record, options_.vocab_size, document);
    case DataFormat::kReranker:
      return absl::InternalError("reranker records are encoded by EncodeReranker");
    case DataFormat::kText: {
      absl::StatusOr<absl::string_view> text = StringField(record, "text");
      if (!text.ok()) return text.status();
      for (const TokenId id : tokenizer_->template_prefix()) {
        document->input_ids.push_back(id);
        document->labels.push_back(id);
      }
      if (absl::Status status = AppendText(*text, /*trained=*/true, document, special_token_text);
          !status.ok()) {
        return status;
      }
      if (options_.eos >= 0) {
        document->input_ids.push_back(options_.eos);
        document->labels.push_back(options_.eos);
      }
      return absl::OkStatus();
    }
    case DataFormat::kMessages: {
      const auto messages = record.find("messages");
      if (messages == record.end()) return Bad("no \"messages\"");
      absl::StatusOr<std::vector<ChatMessage>> parsed = ParseMessages(*messages, "messages");
      if (!parsed.ok()) return parsed.status();
      return EncodeChat(*parsed, document, special_token_text);
    }
    case DataFormat::kPromptCompletion: {
      absl::StatusOr<absl::string_view> prompt = StringField(record, "prompt");
      if (!prompt.ok()) return prompt.status();
      absl::StatusOr<absl::string_view> completion = StringField(record, "completion");
      if (!completion.ok()) return completion.status();
      if (chat_template_) {
        return EncodeChat({ChatMessage{"user", std::string(*prompt), std::nullopt},
                           ChatMessage{"assistant", std::string(*completion), std::nullopt}},
                          document, special_token_text);
      }
      const bool all = options_.train_on == TrainOn::kAll;
      for (const TokenId id : tokenizer_->template_prefix()) {
        document->input_ids.push_back(id);
        document->labels.push_back(all ? id : kIgnoreLabel);
      }
      if (absl::Status status = AppendText(*prompt, all, document, special_token_text);
          !status.ok()) {
        return status;
      }
      if (absl::Status status = AppendText(*completion, true, document, special_token_text);
          !status.ok()) {
        return status;
      }
      if (options_.eos >= 0) {
        document->input_ids.push_back(options_.eos);
        document->labels.push_back(options_.eos);
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown data format");
}

absl::Status DocumentEncoder::EncodeChat(const std::vector<ChatMessage>& messages,
                                         EncodedDocument* document,
                                         bool* special_token_text) const {
  absl::StatusOr<EncodedChat> chat = chat_template_->Encode(
      *tokenizer_, messages, options_.train_on, options_.allow_special_tokens);
  if (!chat.ok()) return chat.status();
  *special_token_text = chat->special_token_text;
  document->input_ids.assign(chat->ids.begin(), chat->ids.end());
  document->labels.resize(chat->ids.size());
  for (size_t t = 0; t < chat->ids.size(); ++t) {
    document->labels[t] = chat->supervised[t] ? chat->ids[t] : kIgnoreLabel;
  }
  return absl::OkStatus();
}

absl::Status DocumentEncoder::AppendText(absl::string_view text, bool trained,
                                         EncodedDocument* document,
                                         bool* special_token_text) const {
  bool special = false;
  absl::StatusOr<std::vector<TokenId>> ids =
      EncodeRecordText(*tokenizer_, std::string_view(text.data(), text.size()),
                       options_.allow_special_tokens, &special);
  if (!ids.ok()) return ids.status();
  *special_token_text = *special_token_text || special;
  for (const TokenId id : *ids) {
    document->input_ids.push_back(id);
    document->labels.push_back(trained ? id : kIgnoreLabel);
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
