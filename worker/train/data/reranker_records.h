// Reranker records: a query with its positive and negative documents, in the
// shapes ms-swift and MTEB write them, and each (query, document) candidate
// rendered with the Qwen3-Reranker prompt (shared/REFERENCES.md):
//
//   prefix + "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" + suffix
//
// Only the document is cut to make a candidate fit; the model scores it by
// the logits of "yes" and "no" after the suffix's last token.
#ifndef BALLAST_WORKER_TRAIN_DATA_RERANKER_RECORDS_H_
#define BALLAST_WORKER_TRAIN_DATA_RERANKER_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {

struct RerankerRecord {
  std::string query;
  std::vector<std::string> positives;
  std::vector<std::string> negatives;
};

// One of
//   {"query", "positive" | "positives" | "pos", "negative" | "negatives" | "neg"}
//     (each a string or a list of strings; MTEB, older ms-swift),
//   {"query", "response", "rejected_response"} (ms-swift),
//   {"messages": [{"role": "user", "content": query}],
//    "positive_messages": [[{"role": "assistant", "content": doc}]],
//    "negative_messages": [[...], ...]} (ms-swift today).
// INVALID_ARGUMENT saying what is missing or mistyped; a record without a
// positive is refused.
absl::StatusOr<RerankerRecord> ParseRerankerRecord(const nlohmann::json& record);

struct RerankerPrompt {
  std::string prefix;
  std::string instruction;
  std::string suffix;
};

// The ids of one candidate, at most `max_tokens`, the document cut to fit.
// Tokenized whole, as transformers does, with special tokens matched in the
// prompt; a query's or document's special-token text is plain text (as
// `tokenizers` encodes it with encode_special_tokens=True). INVALID_ARGUMENT
// for a prompt that leaves no room for the document.
// `*cut` says whether the document was cut.
absl::StatusOr<std::vector<TokenId>> EncodeCandidate(const Tokenizer& tokenizer,
                                                     const RerankerPrompt& prompt,
                                                     const std::string& query,
                                                     const std::string& document,
                                                     int64_t max_tokens, bool* cut);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_RERANKER_RECORDS_H_
