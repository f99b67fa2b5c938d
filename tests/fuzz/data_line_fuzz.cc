// Fuzzes the trainer's per-line parser: one JSONL record of a training set
// into documents (worker/train/data/document_encoder.h), in every format,
// with the reranker record shapes of reranker_records.h.
//
// Input: one byte that picks the options, then the line. The byte's value
// mod 5 is the data format in DataFormat's order (messages,
// prompt_completion, text, tokens, reranker); its value / 5 mod 2 picks
// train_on (assistant, all); its value / 10 mod 2 whether a reranker group
// needs a negative (listwise); its value / 20 mod 2 the chat template (qwen3,
// qwen3_5).
//
// Invariants beyond not crashing: a bad record is INVALID_ARGUMENT (the
// tokenizer belongs to the model, so never FAILED_PRECONDITION), and every
// document the encoder returns is one the trainer can take: as many labels
// as ids, at least 2 ids, each in the vocabulary, each label -100 or an id,
// a reranker candidate within max_tokens and of relevance 0 or 1.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "tests/fuzz/fixed_tokenizer.h"
#include "tests/fuzz/invariant.h"
#include "worker/train/data/document_encoder.h"
#include "worker/train/text/chat_template.h"

namespace {

using ballast::fuzz::Require;
using ballast::train::DataFormat;
using ballast::train::DocumentEncoder;
using ballast::train::DocumentEncoderOptions;
using ballast::train::EncodedDocument;
using ballast::train::kIgnoreLabel;
using ballast::train::TrainOn;

constexpr int kFormats = 5;
constexpr int64_t kMaxTokens = 96;

// The model's vocabulary: every id of the fixed tokenizer, whose special
// tokens come last.
int64_t VocabSize() {
  static const int64_t size = ballast::fuzz::BuildFixedTokenizer().TokenToId("<|endoftext|>") + 1;
  return size;
}

DocumentEncoder MakeEncoder(int choice) {
  DocumentEncoderOptions options;
  options.format = static_cast<DataFormat>(choice % kFormats);
  options.train_on = (choice / kFormats) % 2 == 0 ? TrainOn::kAssistant : TrainOn::kAll;
  options.needs_negative = (choice / (2 * kFormats)) % 2 == 1;
  options.vocab_size = VocabSize();
  ballast::train::Tokenizer tokenizer = ballast::fuzz::BuildFixedTokenizer();
  options.eos = tokenizer.TokenToId("<|endoftext|>");
  // ApplyDefaults' Qwen3-Reranker prompt, shortened.
  options.reranker = {.prefix = "<|im_start|>system\nJudge.<|im_end|>\n<|im_start|>user\n",
                      .instruction = "Find the passage",
                      .suffix = "<|im_end|>\n<|im_start|>assistant\n"};
  options.max_positives = 2;
  options.max_negatives = 3;
  options.max_tokens = kMaxTokens;
  const char* name = (choice / (4 * kFormats)) % 2 == 0 ? "qwen3" : "qwen3_5";
  absl::StatusOr<ballast::train::ChatTemplate> chat = ballast::train::ChatTemplate::Named(name);
  Require(chat.ok(), "the chat template exists", chat.status());
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create(options, std::move(tokenizer), *std::move(chat));
  Require(encoder.ok(), "the encoder builds", encoder.status());
  return *std::move(encoder);
}

const DocumentEncoder& Encoder(uint8_t choice) {
  static const auto* encoders = [] {
    auto* built = new std::vector<DocumentEncoder>;
    for (int c = 0; c < 8 * kFormats; ++c) built->push_back(MakeEncoder(c));
    return built;
  }();
  return (*encoders)[choice % encoders->size()];
}

void CheckDocument(const EncodedDocument& document, DataFormat format) {
  Require(document.labels.size() == document.input_ids.size(), "a label per id");
  Require(document.input_ids.size() >= 2, "at least 2 ids");
  for (size_t t = 0; t < document.input_ids.size(); ++t) {
    const int32_t id = document.input_ids[t];
    const int32_t label = document.labels[t];
    Require(id >= 0 && id < VocabSize(), "ids lie in the vocabulary");
    Require(label == kIgnoreLabel || (label >= 0 && label < VocabSize()),
            "labels are -100 or in the vocabulary");
    // A tokens record keeps its labels as written; the others label an id
    // with itself.
    if (format != DataFormat::kTokens) {
      Require(label == kIgnoreLabel || label == id, "a label is its id or -100");
    }
  }
  if (format == DataFormat::kReranker) {
    Require(static_cast<int64_t>(document.input_ids.size()) <= kMaxTokens,
            "a candidate fits max_tokens");
    Require(document.relevance == 0 || document.relevance == 1, "relevance is 0 or 1");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const DocumentEncoder& encoder = Encoder(data[0]);
  const absl::string_view line(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<EncodedDocument> documents;
  bool special_token_text = false;
  const absl::Status status = encoder.Encode(line, &documents, &special_token_text);
  if (!status.ok()) {
    Require(absl::IsInvalidArgument(status), "a bad record is INVALID_ARGUMENT", status);
    return 0;
  }
  Require(!documents.empty(), "a good record gives a document");
  for (const EncodedDocument& document : documents) {
    CheckDocument(document, encoder.options().format);
  }
  return 0;
}
