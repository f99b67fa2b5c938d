#include "worker/train/data/data_check.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/model_config.h"
#include "worker/train/data/training_data.h"

namespace ballast::train {
namespace {

// One line per document: control characters written as escapes, so that
// the layout stays readable and nothing in the data moves the terminal.
std::string Escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

// The document's tokens decoded in runs, the trained ones between marks; the
// ids themselves when there is no tokenizer (a tokens file).
std::string ShowDocument(const Tokenizer* tokenizer, absl::Span<const int32_t> ids,
                         absl::Span<const int32_t> labels) {
  std::string shown;
  size_t begin = 0;
  while (begin < ids.size()) {
    const bool trained = labels[begin] != kIgnoreLabel;
    size_t end = begin;
    while (end < ids.size() && (labels[end] != kIgnoreLabel) == trained) ++end;
    const absl::Span<const int32_t> run = ids.subspan(begin, end - begin);
    std::string text;
    if (tokenizer != nullptr) {
      absl::StatusOr<std::string> decoded =
          tokenizer->Decode(std::vector<TokenId>(run.begin(), run.end()));
      text = decoded.ok() ? Escaped(*decoded) : absl::StrCat("<", decoded.status().message(), ">");
    } else {
      text = absl::StrJoin(run, " ");
      if (end < ids.size()) text += " ";
    }
    absl::StrAppend(&shown, trained ? kTrainedOpen : "", text, trained ? kTrainedClose : "");
    begin = end;
  }
  return shown;
}

}  // namespace

absl::Status WriteDataCheck(const v1::JobSpec& spec, int64_t rows, std::ostream& out) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(spec.model().path());
  if (!config.ok()) return config.status();
  absl::StatusOr<TrainingData> data =
      OpenTrainingData(spec, {.cache_dir = "", .vocab_size = config->vocab_size});
  if (!data.ok()) return data.status();
  const v1::DataReport& r = data->report;
  const v1::DataSpec& d = spec.data();
  out << "data: " << d.path() << " as " << r.format()
      << (d.format().empty() ? " (detected from its first record)" : "");
  if (!r.template_().empty()) {
    out << ", template " << r.template_()
        << (d.template_().empty() && r.template_() != "none" ? " (from tokenizer_config.json)"
                                                             : "");
  }
  out << ", train_on " << d.train_on() << "\n";
  out << "records " << r.records() << ", documents " << r.documents() << ", bad records skipped "
      << r.skipped_records() << ", cut " << r.cut_documents() << ", dropped "
      << r.dropped_documents() << " (data.truncate " << d.truncate() << ")\n";
  out << "tokens " << r.tokens() << ", trained " << r.trained_tokens()
      << absl::StrFormat(" (%.1f%%)", r.tokens() > 0 ? 100.0 * r.trained_tokens() / r.tokens() : 0)
      << "\n";
  out << "rows of " << d.seq_len() << " tokens per epoch " << r.rows()
      << (d.packing() ? " (packed)" : " (one document each)")
      << absl::StrFormat(", packing efficiency %.1f%%", 100 * r.packing_efficiency()) << "\n";
  if (const std::string note = SpecialTokenRecordsNote(r); !note.empty()) out << note << "\n";
  for (const std::string& bad : r.bad_record_examples()) out << "bad record: " << bad << "\n";

  TokenizedDataset& dataset = *data->dataset;
  const TokenCache& cache = dataset.cache();
  out << "the first " << std::min(rows, dataset.rows_per_epoch()) << " rows, " << kTrainedOpen
      << "marked" << kTrainedClose << ": the tokens the loss trains on\n";
  for (int64_t row = 0; row < rows && row < dataset.rows_per_epoch(); ++row) {
    const std::vector<int64_t> documents = dataset.RowDocuments(row);
    int64_t tokens = 0;
    for (const int64_t doc : documents) tokens += cache.length(doc);
    out << "row " << row << ": " << documents.size() << " documents, " << tokens << " tokens\n";
    for (const int64_t doc : documents) {
      out << "  line " << cache.line(doc) + 1 << ", " << cache.length(doc) << " tokens"
          << (cache.relevance(doc) == 1   ? ", positive"
              : cache.relevance(doc) == 0 ? ", negative"
                                          : "")
          << ": "
          << ShowDocument(data->encoder->tokenizer(), cache.input_ids(doc), cache.labels(doc))
          << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
