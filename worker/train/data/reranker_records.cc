#include "worker/train/data/reranker_records.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

// A string or a list of strings under the first of `keys` the record has.
absl::StatusOr<std::vector<std::string>> Texts(const nlohmann::json& record,
                                               std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const auto it = record.find(key);
    if (it == record.end() || it->is_null()) continue;
    if (it->is_string()) return std::vector<std::string>{it->get<std::string>()};
    if (!it->is_array()) return Bad(absl::StrCat("\"", key, "\" is neither a string nor a list"));
    std::vector<std::string> texts;
    for (const nlohmann::json& t : *it) {
      if (!t.is_string()) return Bad(absl::StrCat("\"", key, "\" holds a non-string"));
      texts.push_back(t.get<std::string>());
    }
    return texts;
  }
  return std::vector<std::string>{};
}

// The content of the one message of each conversation in `key` (ms-swift's
// positive_messages / negative_messages).
absl::StatusOr<std::vector<std::string>> Conversations(const nlohmann::json& record,
                                                       const char* key) {
  std::vector<std::string> texts;
  const auto it = record.find(key);
  if (it == record.end() || it->is_null()) return texts;
  if (!it->is_array()) return Bad(absl::StrCat("\"", key, "\" is not a list of conversations"));
  for (const nlohmann::json& conversation : *it) {
    if (!conversation.is_array() || conversation.empty() || !conversation.back().is_object() ||
        !conversation.back().contains("content") || !conversation.back()["content"].is_string()) {
      return Bad(
          absl::StrCat("\"", key, "\" holds something other than [{\"role\", \"content\"}]"));
    }
    texts.push_back(conversation.back()["content"].get<std::string>());
  }
  return texts;
}

}  // namespace

absl::StatusOr<RerankerRecord> ParseRerankerRecord(const nlohmann::json& record) {
  RerankerRecord r;
  absl::StatusOr<std::vector<std::string>> positives, negatives;
  if (record.contains("positive_messages")) {
    const auto messages = record.find("messages");
    if (messages == record.end() || !messages->is_array() || messages->empty() ||
        !messages->back().is_object() || !messages->back().contains("content") ||
        !messages->back()["content"].is_string()) {
      return Bad("\"messages\" must end with the query: [{\"role\": \"user\", \"content\": ...}]");
    }
    r.query = messages->back()["content"].get<std::string>();
    positives = Conversations(record, "positive_messages");
    negatives = Conversations(record, "negative_messages");
  } else {
    const auto query = record.find("query");
    if (query == record.end() || !query->is_string()) return Bad("no \"query\" string");
    r.query = query->get<std::string>();
    positives = Texts(record, {"positive", "positives", "pos", "response"});
    negatives = Texts(record, {"negative", "negatives", "neg", "rejected_response"});
  }
  if (!positives.ok()) return positives.status();
  if (!negatives.ok()) return negatives.status();
  r.positives = *std::move(positives);
  r.negatives = *std::move(negatives);
  if (r.positives.empty()) return Bad("a reranker record needs a positive document");
  return r;
}

absl::StatusOr<std::vector<TokenId>> EncodeCandidate(const Tokenizer& tokenizer,
                                                     const RerankerPrompt& prompt,
                                                     const std::string& query,
                                                     const std::string& document,
                                                     int64_t max_tokens, bool* cut) {
  for (const auto& [what, text] : {std::pair{"query", &query}, std::pair{"document", &document}}) {
    absl::StatusOr<std::optional<std::string>> special = tokenizer.FindSpecialToken(*text);
    if (!special.ok()) return special.status();
    if (*special) {
      return Bad(absl::StrCat("the ", what, " holds the special token ", **special));
    }
  }
  const std::string head = absl::StrCat(prompt.prefix, "<Instruct>: ", prompt.instruction,
                                        "\n<Query>: ", query, "\n<Document>: ");
  // One pass over head + document, as transformers tokenizes the whole text:
  // the space after "<Document>:" joins the document's first word.
  absl::StatusOr<Tokenizer::Encoding> whole =
      tokenizer.EncodeWithOffsets(head + document, /*allow_special=*/true);
  if (!whole.ok()) return whole.status();
  // The head ends in ASCII, so its normalized text is a prefix of the whole's.
  absl::StatusOr<std::string> head_normalized = tokenizer.Normalize(head, true);
  if (!head_normalized.ok()) return head_normalized.status();
  size_t first_document_token = 0;
  while (first_document_token < whole->ends.size() &&
         whole->ends[first_document_token] <= head_normalized->size()) {
    ++first_document_token;
  }
  // The suffix starts at a special token, which no regex piece crosses.
  absl::StatusOr<std::vector<TokenId>> suffix = tokenizer.Encode(prompt.suffix, true);
  if (!suffix.ok()) return suffix.status();
  const int64_t room = max_tokens - static_cast<int64_t>(suffix->size());
  if (static_cast<int64_t>(first_document_token) >= room) {
    return Bad(absl::StrCat("the prompt without its document is ",
                            first_document_token + suffix->size(), " tokens, no room in ",
                            max_tokens, "; shorten the query or raise data.seq_len"));
  }
  std::vector<TokenId> ids = std::move(whole->ids);
  *cut = static_cast<int64_t>(ids.size()) > room;
  if (*cut) ids.resize(room);
  ids.insert(ids.end(), suffix->begin(), suffix->end());
  return ids;
}

}  // namespace ballast::train
