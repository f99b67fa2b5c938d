#include "worker/train/data/tokenized_dataset.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "worker/train/data/split_mix.h"

namespace ballast::train {
namespace {

// Fisher-Yates from `state`, in place.
void Permute(uint64_t state, std::vector<int64_t>* items) {
  for (int64_t i = static_cast<int64_t>(items->size()) - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
    std::swap((*items)[i], (*items)[j]);
  }
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Whether each of `groups` groups is held out by `split`.
std::vector<bool> HeldOut(int64_t groups, const GroupSplit& split) {
  std::vector<bool> held(groups, false);
  std::vector<int64_t> order = Iota(groups);
  Permute(split.seed ^ 0x8ebc6af09c88c6e3ULL, &order);
  for (int64_t k = 0; k < HeldOutGroups(groups, split.fraction); ++k) held[order[k]] = true;
  return held;
}

}  // namespace

int64_t HeldOutGroups(int64_t groups, double fraction) {
  return std::clamp<int64_t>(std::llround(fraction * static_cast<double>(groups)), 1, groups - 1);
}

TokenizedDataset::TokenizedDataset(TokenCache cache, DataOrder order)
    : cache_(std::move(cache)), order_(order) {
  std::vector<int64_t> starts, lengths;
  for (int64_t d = 0; d < cache_.documents(); ++d) {
    if (d == 0 || cache_.group(d) != cache_.group(d - 1)) {
      starts.push_back(d);
      lengths.push_back(0);
    }
    // A block-diffusion document takes its tokens twice: [x_t ; x_0].
    lengths.back() += cache_.length(d) * (order_.diffusion.block_length > 0 ? 2 : 1);
  }
  starts.push_back(cache_.documents());
  const int64_t groups = static_cast<int64_t>(lengths.size());
  const bool split = order_.split.fraction > 0;
  const std::vector<bool> held = split ? HeldOut(groups, order_.split) : std::vector<bool>();
  for (int64_t g = 0; g < groups; ++g) {
    if (split && held[g] != order_.split.held_out) continue;
    group_starts_.push_back(starts[g]);
    group_ends_.push_back(starts[g + 1]);
    group_lengths_.push_back(lengths[g]);
  }
  PlanEpoch(0);
  rows_per_epoch_ = rows_.rows();
}

absl::StatusOr<TokenizedDataset> TokenizedDataset::Load(const std::string& path, int64_t vocab_size,
                                                        int64_t seq_len) {
  absl::StatusOr<DocumentEncoder> encoder = DocumentEncoder::Create(
      {.format = DataFormat::kTokens, .vocab_size = vocab_size}, std::nullopt, std::nullopt);
  if (!encoder.ok()) return encoder.status();
  // A valid line holds at most seq_len ids and as many labels, each at most
  // 21 characters with its separator; a longer line is refused unread.
  absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
      *encoder, {.data_path = path, .seq_len = seq_len, .max_line_bytes = 4096 + 2 * 24 * seq_len});
  if (!cache.ok()) return cache.status();
  return TokenizedDataset(*std::move(cache), {.seq_len = seq_len, .shuffle = false});
}

void TokenizedDataset::PlanEpoch(int64_t epoch) {
  if (epoch == planned_epoch_) return;
  std::vector<int64_t> groups = Iota(static_cast<int64_t>(group_lengths_.size()));
  if (order_.shuffle) {
    Permute(order_.seed ^ (0xa0761d6478bd642fULL * static_cast<uint64_t>(epoch + 1)), &groups);
  }
  if (order_.packing) {
    rows_ = PackBestFitDecreasing(groups, group_lengths_, order_.seq_len);
  } else {
    rows_.items = std::move(groups);
    rows_.row_offsets = Iota(static_cast<int64_t>(rows_.items.size()) + 1);
  }
  row_order_ = Iota(rows_.rows());
  // Without packing the groups are already in their epoch's order.
  if (order_.shuffle && order_.packing) {
    Permute(order_.seed ^ (0xe7037ed1a0b428dbULL * static_cast<uint64_t>(epoch + 1)), &row_order_);
  }
  planned_epoch_ = epoch;
}

EpochPacking TokenizedDataset::packing() const {
  EpochPacking p;
  p.rows = rows_per_epoch_;
  p.tokens = cache_.statistics().tokens * (order_.diffusion.block_length > 0 ? 2 : 1);
  p.efficiency = static_cast<double>(p.tokens) /
                 (static_cast<double>(p.rows) * static_cast<double>(order_.seq_len));
  return p;
}

std::vector<int64_t> TokenizedDataset::RowDocuments(int64_t cursor) {
  PlanEpoch(cursor / rows_per_epoch_);
  const int64_t row = row_order_[cursor % rows_per_epoch_];
  std::vector<int64_t> documents;
  for (int64_t k = rows_.row_offsets[row]; k < rows_.row_offsets[row + 1]; ++k) {
    const int64_t group = rows_.items[k];
    for (int64_t d = group_starts_[group]; d < group_ends_[group]; ++d) {
      documents.push_back(d);
    }
  }
  return documents;
}

std::vector<int64_t> TokenizedDataset::DocumentLines(int64_t cursor, int64_t rows) {
  std::vector<int64_t> lines;
  for (int64_t r = cursor; r < cursor + rows; ++r) {
    for (const int64_t d : RowDocuments(r)) lines.push_back(cache_.line(d));
  }
  return lines;
}

PackedBatch TokenizedDataset::Pack(int64_t cursor, int64_t rows) {
  const bool diffusion = order_.diffusion.block_length > 0;
  NoisedTokens tokens;
  std::vector<int64_t> cu = {0}, group_offsets = {0};
  std::vector<int64_t> document_ids;
  std::vector<float> relevance;
  int64_t supervised = 0;
  for (int64_t r = cursor; r < cursor + rows; ++r) {
    const std::vector<int64_t> documents = RowDocuments(r);
    for (size_t k = 0; k < documents.size(); ++k) {
      const int64_t d = documents[k];
      if (cache_.relevance(d) >= 0) {
        relevance.push_back(static_cast<float>(cache_.relevance(d)));
        if (k + 1 == documents.size() || cache_.group(documents[k + 1]) != cache_.group(d)) {
          group_offsets.push_back(static_cast<int64_t>(relevance.size()));
        }
      }
      document_ids.push_back(cache_.line(d));
      const absl::Span<const int32_t> input = cache_.input_ids(d);
      const absl::Span<const int32_t> labels = cache_.labels(d);
      const int64_t n = static_cast<int64_t>(input.size());
      if (diffusion) {
        // Drawn from the epoch and the document: the same masks whatever row
        // or rank the document lands in, fresh ones each epoch.
        const uint64_t epoch = static_cast<uint64_t>(r / rows_per_epoch_);
        const uint64_t draw = order_.seed ^ (0x9e3779b97f4a7c15ULL * (epoch + 1)) ^
                              (0xc2b2ae3d27d4eb4fULL * static_cast<uint64_t>(d + 1));
        supervised += AppendNoisedDocument(input, labels, order_.diffusion, draw, &tokens);
        cu.push_back(cu.back() + 2 * n);
        continue;
      }
      for (int64_t t = 0; t < n; ++t) {
        tokens.ids.push_back(input[t]);
        tokens.positions.push_back(t);
        const int64_t target = t + 1 < n ? labels[t + 1] : kIgnoreLabel;
        supervised += target != kIgnoreLabel;
        tokens.targets.push_back(target);
      }
      cu.push_back(cu.back() + n);
    }
  }
  PackedBatch b;
  b.input_ids = torch::tensor(tokens.ids, torch::kLong);
  b.position_ids = torch::tensor(tokens.positions, torch::kLong);
  b.targets = torch::tensor(tokens.targets, torch::kLong);
  b.cu_seqlens = torch::tensor(cu, torch::kLong);
  b.document_ids = std::move(document_ids);
  b.supervised_tokens = supervised;
  if (diffusion) {
    b.loss_weights = torch::tensor(tokens.weights, torch::kFloat);
    b.mask = {kernels::MaskKind::kBlockDiffusion, order_.diffusion.block_length};
  }
  if (!relevance.empty()) {
    b.group_offsets = torch::tensor(group_offsets, torch::kLong);
    b.relevance = torch::tensor(relevance, torch::kFloat);
  }
  return b;
}

}  // namespace ballast::train
