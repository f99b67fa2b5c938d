#include "worker/train/data/reranker_records.h"

#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

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
  const std::string head_before_query =
      absl::StrCat(prompt.prefix, "<Instruct>: ", prompt.instruction, "\n<Query>: ");
  const std::string head = absl::StrCat(head_before_query, query, "\n<Document>: ");
  // The query and the document are the data's: their special-token text is
  // plain text, while the prompt's own tokens stay control tokens.
  const ByteRange plain[] = {{head_before_query.size(), head_before_query.size() + query.size()},
                             {head.size(), head.size() + document.size()}};
  // One pass over head + document, as transformers tokenizes the whole text:
  // the space after "<Document>:" joins the document's first word.
  absl::StatusOr<Tokenizer::Encoding> whole =
      tokenizer.EncodeWithOffsets(head + document, SpecialTokens{.allow = true, .plain = plain});
  if (!whole.ok()) return whole.status();
  // The head's normalized length, piece by piece: each piece borders on
  // ASCII, so the pieces normalize as the whole does.
  size_t head_normalized = 0;
  for (const auto& [piece, is_plain] :
       {std::pair<std::string_view, bool>{head_before_query, false},
        {query, true},
        {std::string_view(head).substr(head_before_query.size() + query.size()), false}}) {
    absl::StatusOr<std::string> normalized = tokenizer.Normalize(piece, !is_plain);
    if (!normalized.ok()) return normalized.status();
    head_normalized += normalized->size();
  }
  size_t first_document_token = 0;
  while (first_document_token < whole->ends.size() &&
         whole->ends[first_document_token] <= head_normalized) {
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
