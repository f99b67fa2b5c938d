// Block-diffusion noise (BD3-LM / SDAR SFT, shared/REFERENCES.md): a
// document becomes [x_t ; x_0], x_t a copy whose answer tokens (those with
// a label) are masked independently with probability
//   p = (1 − eps)·t + eps,   t ~ U(0, 1) per document,
// redrawn up to 10 times while none is masked, then one is forced. A masked
// position of x_t is trained to predict its own clean token with weight
// 1 / p (targets are not shifted); x_0 trains nothing. Positions restart at
// 0 in each half, as SDAR duplicates them. The caller seeds the draw from
// (job seed, epoch, document), so a resume at any world size, and packing or
// not, draws the same masks, and each epoch draws anew.
#ifndef BALLAST_WORKER_TRAIN_DATA_BLOCK_DIFFUSION_NOISE_H_
#define BALLAST_WORKER_TRAIN_DATA_BLOCK_DIFFUSION_NOISE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ballast::train {

struct DiffusionNoise {
  int64_t block_length = 0;  // > 0 turns block diffusion on
  int64_t mask_token_id = 0;
  double eps = 1e-3;
};

// Where a batch's per-token vectors are built.
struct NoisedTokens {
  std::vector<int64_t> ids, positions, targets;
  std::vector<float> weights;
};

// Appends document (ids, labels) as 2n tokens; returns its answer tokens
// (labels != -100), the count its loss is normalised by.
int64_t AppendNoisedDocument(absl::Span<const int32_t> ids, absl::Span<const int32_t> labels,
                             const DiffusionNoise& noise, uint64_t draw_seed, NoisedTokens* out);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_BLOCK_DIFFUSION_NOISE_H_
