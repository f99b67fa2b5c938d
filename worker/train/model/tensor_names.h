// The names of a decoder's tensors in HF checkpoints, which are the
// ParamStore's names too.
#ifndef BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_
#define BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace ballast::train {

// "model.layers.<layer>.": the prefix of one decoder layer's tensors.
inline std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_
