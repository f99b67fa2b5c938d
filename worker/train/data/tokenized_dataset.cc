#include "worker/train/data/tokenized_dataset.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"

namespace ballast::train {
namespace {

constexpr int64_t kIgnore = -100;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::Status LineError(const std::string& path, int64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

}  // namespace

absl::StatusOr<TokenizedDataset> TokenizedDataset::Load(const std::string& path, int64_t vocab_size,
                                                        int64_t seq_len) {
  // A valid line holds at most seq_len ids and as many labels, each at most
  // 21 characters with its separator; a longer line is refused before it is
  // read whole (one of 200 MB exhausted memory in the JSON parser).
  absl::StatusOr<LineReader> reader = LineReader::Open(path, 4096 + 2 * 24 * seq_len);
  if (!reader.ok()) return reader.status();
  TokenizedDataset ds;
  std::string text;
  int64_t line = 0;
  for (;;) {
    absl::StatusOr<bool> more = reader->Next(&text);
    if (!more.ok()) return more.status();
    if (!*more) break;
    line = reader->line_number();
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return LineError(path, line, "not a JSON object");
    if (!j.contains("input_ids") || !j["input_ids"].is_array()) {
      return LineError(path, line, "input_ids must be a list of token ids");
    }
    Example ex;
    for (const auto& v : j["input_ids"]) {
      if (!v.is_number_integer()) return LineError(path, line, "input_ids must be integers");
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab_size) {
        return LineError(
            path, line,
            absl::StrCat("token id ", id, " outside the vocabulary [0, ", vocab_size, ")"));
      }
      ex.input_ids.push_back(id);
    }
    if (j.contains("labels")) {
      if (!j["labels"].is_array()) return LineError(path, line, "labels must be a list");
      for (const auto& v : j["labels"]) {
        if (!v.is_number_integer()) return LineError(path, line, "labels must be integers");
        const int64_t id = v.get<int64_t>();
        if (id != kIgnore && (id < 0 || id >= vocab_size)) {
          return LineError(
              path, line,
              absl::StrCat("label ", id, " is neither -100 nor in [0, ", vocab_size, ")"));
        }
        ex.labels.push_back(id);
      }
      if (ex.labels.size() != ex.input_ids.size()) {
        return LineError(path, line,
                         absl::StrCat("labels has ", ex.labels.size(), " entries, input_ids ",
                                      ex.input_ids.size()));
      }
    } else {
      ex.labels = ex.input_ids;
    }
    const int64_t n = static_cast<int64_t>(ex.input_ids.size());
    if (n < 2) return LineError(path, line, "an example needs at least 2 tokens");
    if (n > seq_len) {
      return LineError(path, line,
                       absl::StrCat("example has ", n, " tokens, more than data.seq_len = ",
                                    seq_len, "; split it or raise seq_len"));
    }
    ds.examples_.push_back(std::move(ex));
  }
  if (ds.examples_.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return ds;
}

int64_t TokenizedDataset::IndexAt(int64_t cursor, bool shuffle, uint64_t seed) {
  const int64_t n = size();
  const int64_t epoch = cursor / n;
  if (!shuffle) return cursor % n;
  if (epoch != cached_epoch_) {
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    uint64_t state = seed ^ (0xa0761d6478bd642fULL * static_cast<uint64_t>(epoch + 1));
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
      std::swap(order_[i], order_[j]);
    }
    cached_epoch_ = epoch;
  }
  return order_[cursor % n];
}

PackedBatch TokenizedDataset::Pack(int64_t cursor, int64_t count, bool shuffle, uint64_t seed) {
  std::vector<int64_t> ids, positions, targets, cu = {0};
  std::vector<int64_t> document_ids;
  int64_t supervised = 0;
  for (int64_t i = 0; i < count; ++i) {
    document_ids.push_back(IndexAt(cursor + i, shuffle, seed));
    const Example& ex = examples_[document_ids.back()];
    const int64_t n = static_cast<int64_t>(ex.input_ids.size());
    for (int64_t t = 0; t < n; ++t) {
      ids.push_back(ex.input_ids[t]);
      positions.push_back(t);
      const int64_t target = t + 1 < n ? ex.labels[t + 1] : kIgnore;
      supervised += target != kIgnore;
      targets.push_back(target);
    }
    cu.push_back(cu.back() + n);
  }
  PackedBatch b;
  b.input_ids = torch::tensor(ids, torch::kLong);
  b.position_ids = torch::tensor(positions, torch::kLong);
  b.targets = torch::tensor(targets, torch::kLong);
  b.cu_seqlens = torch::tensor(cu, torch::kLong);
  b.document_ids = std::move(document_ids);
  b.supervised_tokens = supervised;
  return b;
}

}  // namespace ballast::train
