// The default CPU generator's state: a forward that is recomputed in
// backward (activation checkpointing, a sharded layer) runs under the state
// its first run saw, so that its dropout masks repeat.
#ifndef BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_
#define BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_

#include <ATen/core/Tensor.h>

namespace ballast::train {

at::Tensor GeneratorState();
void SetGeneratorState(const at::Tensor& state);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_
