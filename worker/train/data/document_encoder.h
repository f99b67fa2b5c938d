// DocumentEncoder: one JSONL record of a training set into one document's
// token ids and labels, in the record's DataFormat.
//
//   messages           the chat template renders the conversation; labels
//                      on the assistant turns (data.train_on: assistant) or
//                      on every token (all).
//   prompt_completion  with a template, a user turn and an assistant turn;
//                      with none, prompt then completion as plain text, then
//                      EOS. Labels on the completion (or all).
//   text               the post-processor's prefix (Llama 3's BOS), the text,
//                      EOS; every token trained.
//   tokens             the ids and labels as written.
//   reranker           a group of candidates per positive document: the
//                      positive, then the negatives, each rendered with the
//                      reranker prompt (reranker_records.h); no labels, a
//                      relevance (1 positive, 0 negative) instead.
//
// Special-token text: a special added token's content (say "<|im_start|>")
// inside a record's text, prompt, completion or message. With
// allow_special_tokens off (data.allow_special_tokens, default false), so
// that a record cannot forge a control token:
//   text, prompt_completion and messages: encoded as plain text, as
//     `tokenizers` encodes with encode_special_tokens=True; through a chat
//     template, only the messages' text is, and the template's own control
//     tokens stay (ChatTemplate::Encode);
//   reranker: the query's and the documents' text as plain text
//     (EncodeCandidate), the prompt's tokens kept.
// With it on (text, prompt_completion and messages only), the text becomes
// the special token, as `tokenizers`' default encode and transformers'
// apply_chat_template do. Either way the template's own tokens, the prefix
// and EOS are control tokens, and Encode says whether the record held such
// text, for the data report's count.
//
// labels[t] is the token trained at position t or -100; the trainer shifts
// them (position t predicts labels[t + 1]).
//
// Thread-safe: Encode is const, and many threads share one encoder.
#ifndef BALLAST_WORKER_TRAIN_DATA_DOCUMENT_ENCODER_H_
#define BALLAST_WORKER_TRAIN_DATA_DOCUMENT_ENCODER_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "worker/train/data/data_format.h"
#include "worker/train/data/reranker_records.h"
#include "worker/train/text/chat_template.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {

inline constexpr int32_t kIgnoreLabel = -100;

struct EncodedDocument {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length; kIgnoreLabel = not trained
  // Reranker candidates only: 1 for a positive, 0 for a negative, and the
  // group within the record (one per positive); -1 and 0 otherwise.
  int32_t relevance = -1;
  int32_t group = 0;
  bool cut = false;  // a reranker document cut to fit max_tokens
};

struct DocumentEncoderOptions {
  DataFormat format = DataFormat::kTokens;
  TrainOn train_on = TrainOn::kAssistant;
  int64_t vocab_size = 0;  // the model's: every id must lie in [0, vocab_size)
  // Ends text documents and template-less completions; -1 for none.
  TokenId eos = -1;
  // Reranker records: the prompt, how many candidates a record keeps, whether
  // a group needs a negative (listwise), and the most tokens a candidate may
  // have (its document is cut to fit).
  RerankerPrompt reranker;
  int max_positives = 1;
  int max_negatives = 7;
  bool needs_negative = false;
  int64_t max_tokens = 0;
  // Special-token text in records becomes special tokens (the file comment).
  bool allow_special_tokens = false;
};

// The messages of a record's `list` (its "messages", or whatever `key`
// names in errors). INVALID_ARGUMENT naming the message and the field when
// it is not a non-empty list of {role, content?, reasoning_content?} with
// string values (content and reasoning_content may be null).
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const nlohmann::json& list,
                                                       absl::string_view key);

// The ids of a record's `text`: special tokens matched only with
// `allow_special`. Sets *special_token_text to whether `text` holds a
// special token's text (Tokenizer::FindSpecialToken), either way. Errors as
// Tokenizer::Encode.
absl::StatusOr<std::vector<TokenId>> EncodeRecordText(const Tokenizer& tokenizer,
                                                      std::string_view text, bool allow_special,
                                                      bool* special_token_text);

class DocumentEncoder {
 public:
  // `tokenizer` is required by every format but tokens; `chat_template` by
  // messages (prompt_completion without one concatenates). INVALID_ARGUMENT
  // saying which is missing, and for allow_special_tokens with the tokens or
  // reranker format.
  static absl::StatusOr<DocumentEncoder> Create(DocumentEncoderOptions options,
                                                std::optional<Tokenizer> tokenizer,
                                                std::optional<ChatTemplate> chat_template);

  // The documents of one record (a JSONL line): one, or a reranker record's
  // groups of candidates, in order. INVALID_ARGUMENT for a bad
  // record, saying what is wrong with it (the caller adds file and line):
  // malformed JSON, a missing or mistyped key, an id outside the vocabulary
  // in a tokens record, fewer than 2 tokens, or (but in a tokens record) no
  // trained token.
  // FAILED_PRECONDITION when the tokenizer yields an id the model does not
  // have: the tokenizer does not belong to the model, whatever the record.
  // Sets *special_token_text to whether the record, encoded, held
  // special-token text (the file comment).
  absl::Status Encode(absl::string_view line, std::vector<EncodedDocument>* documents,
                      bool* special_token_text) const;
  // The same for a record already parsed (a JSONL line's, or a parquet
  // row's: record_reader.h); errors as Encode's but for the JSON's.
  absl::Status EncodeParsed(const nlohmann::json& record, std::vector<EncodedDocument>* documents,
                            bool* special_token_text) const;

  const DocumentEncoderOptions& options() const { return options_; }
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }

 private:
  DocumentEncoder(DocumentEncoderOptions options, std::optional<Tokenizer> tokenizer,
                  std::optional<ChatTemplate> chat_template)
      : options_(options),
        tokenizer_(std::move(tokenizer)),
        chat_template_(std::move(chat_template)) {}

  // The encoders of one record set *special_token_text as Encode does.
  absl::Status EncodeRecord(const nlohmann::json& record, EncodedDocument* document,
                            bool* special_token_text) const;
  absl::Status EncodeReranker(const nlohmann::json& record, std::vector<EncodedDocument>* documents,
                              bool* special_token_text) const;
  absl::Status EncodeChat(const std::vector<ChatMessage>& messages, EncodedDocument* document,
                          bool* special_token_text) const;
  // Appends `text` (EncodeRecordText), labelled or not; ORs into
  // *special_token_text.
  absl::Status AppendText(absl::string_view text, bool trained, EncodedDocument* document,
                          bool* special_token_text) const;

  DocumentEncoderOptions options_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_DOCUMENT_ENCODER_H_
