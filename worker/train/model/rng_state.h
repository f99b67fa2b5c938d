// A device's default generator state: a forward that is recomputed in
// backward (activation checkpointing, a sharded layer) runs under the state
// its first run saw, so that its dropout masks repeat; checkpoints carry it
// so that a resumed run draws what an unbroken one would.
#ifndef BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_
#define BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>

namespace ballast::train {

// The state of the generator that ops on `device` draw from: the CPU's, or
// the GPU's own (a CUDA generator is per device).
at::Tensor GeneratorState(c10::Device device = c10::kCPU);
void SetGeneratorState(const at::Tensor& state, c10::Device device = c10::kCPU);

// Every generator a run on `device` draws from, by the key checkpoints keep
// it under: "cpu" always (data order, LoRA init), and "cuda" on a GPU
// (dropout there).
std::map<std::string, at::Tensor> GeneratorStates(c10::Device device);
// Restores the generators of `device` found in `states`. One missing (a
// checkpoint of a CPU run resumed on a GPU) keeps its current state.
void SetGeneratorStates(const std::map<std::string, at::Tensor>& states, c10::Device device);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_RNG_STATE_H_
