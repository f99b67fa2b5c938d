#include "worker/train/model/rng_state.h"

#include <ATen/Context.h>

#include <mutex>

namespace ballast::train {

at::Tensor GeneratorState(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetGeneratorState(const at::Tensor& state, c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::map<std::string, at::Tensor> GeneratorStates(c10::Device device) {
  std::map<std::string, at::Tensor> states = {{"cpu", GeneratorState()}};
  if (device.is_cuda()) states["cuda"] = GeneratorState(device);
  return states;
}

void SetGeneratorStates(const std::map<std::string, at::Tensor>& states, c10::Device device) {
  if (auto cpu = states.find("cpu"); cpu != states.end()) SetGeneratorState(cpu->second);
  if (!device.is_cuda()) return;
  if (auto cuda = states.find("cuda"); cuda != states.end())
    SetGeneratorState(cuda->second, device);
}

}  // namespace ballast::train
