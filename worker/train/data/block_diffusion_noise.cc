#include "worker/train/data/block_diffusion_noise.h"

#include "worker/train/data/document_encoder.h"
#include "worker/train/data/split_mix.h"

namespace ballast::train {

int64_t AppendNoisedDocument(absl::Span<const int32_t> ids, absl::Span<const int32_t> labels,
                             const DiffusionNoise& noise, uint64_t draw_seed, NoisedTokens* out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> answers;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] != kIgnoreLabel) answers.push_back(i);
  }
  uint64_t state = draw_seed;
  const double p = (1 - noise.eps) * SplitMixUniform(state) + noise.eps;
  std::vector<bool> masked(n, false);
  int64_t count = 0;
  for (int attempt = 0; attempt < 10 && count == 0 && !answers.empty(); ++attempt) {
    for (const int64_t i : answers) count += masked[i] = SplitMixUniform(state) < p;
  }
  if (count == 0 && !answers.empty()) {
    masked[answers[SplitMix64(state) % answers.size()]] = true;
  }
  const float weight = static_cast<float>(1.0 / p);
  for (int64_t i = 0; i < n; ++i) {  // x_t
    out->ids.push_back(masked[i] ? noise.mask_token_id : ids[i]);
    out->positions.push_back(i);
    out->targets.push_back(masked[i] ? ids[i] : kIgnoreLabel);
    out->weights.push_back(masked[i] ? weight : 0.0f);
  }
  for (int64_t i = 0; i < n; ++i) {  // x_0
    out->ids.push_back(ids[i]);
    out->positions.push_back(i);
    out->targets.push_back(kIgnoreLabel);
    out->weights.push_back(0.0f);
  }
  return static_cast<int64_t>(answers.size());
}

}  // namespace ballast::train
