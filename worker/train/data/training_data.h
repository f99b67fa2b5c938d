// OpenTrainingData: a job's data as its spec describes it, from the JSONL
// file to the rows the trainer takes.
//
// It resolves what the spec leaves open, and says what it chose in the
// DataReport: the format (from the first record), the tokenizer
// (data.tokenizer, else the model folder), the chat template (the built-in
// that matches tokenizer_config.json's chat_template) and EOS (its
// eos_token). Then it tokenizes the file once into the job's token cache, or
// finds it there, and orders the documents into rows.
#ifndef BALLAST_WORKER_TRAIN_DATA_TRAINING_DATA_H_
#define BALLAST_WORKER_TRAIN_DATA_TRAINING_DATA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/data/document_encoder.h"
#include "worker/train/data/tokenized_dataset.h"

namespace ballast::train {

struct TrainingDataOptions {
  // The job's token cache; empty keeps the documents in memory.
  std::string cache_dir;
  int64_t vocab_size = 0;  // the model's
};

struct TrainingData {
  std::unique_ptr<DocumentEncoder> encoder;  // holds the tokenizer, if any
  std::unique_ptr<TokenizedDataset> dataset;
  v1::DataReport report;  // for epoch 0
  // The held-out set, encoded as the training data is; null without one:
  // eval.path's documents in file order (packed as data.packing packs), or
  // a reranker's held-out groups (reranker.eval_path), one per row.
  std::unique_ptr<TokenizedDataset> eval;
};

// The encoder of `data` (format, tokenizer, template, EOS) resolved as the
// file comment says. INVALID_ARGUMENT or NOT_FOUND naming the file or the
// field when a part is missing or does not fit.
absl::StatusOr<std::unique_ptr<DocumentEncoder>> OpenDocumentEncoder(const v1::JobSpec& spec,
                                                                     int64_t vocab_size,
                                                                     v1::DataReport* report);

// The whole pipeline. Errors as OpenDocumentEncoder's and TokenCache's.
absl::StatusOr<TrainingData> OpenTrainingData(const v1::JobSpec& spec,
                                              const TrainingDataOptions& options);

// The data report's sentence on special-token text, "N records contained
// special-token text, encoded as plain text (data.allow_special_tokens:
// false)" or "... as special tokens (...: true)"; empty when N is 0.
std::string SpecialTokenRecordsNote(const v1::DataReport& report);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_TRAINING_DATA_H_
