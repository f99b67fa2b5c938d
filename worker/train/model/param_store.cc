#include "worker/train/model/param_store.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ballast::train {

void ParamStore::Add(const std::string& name, at::Tensor value, int64_t layer, bool trainable) {
  TORCH_CHECK(index_.count(name) == 0, "ParamStore: duplicate tensor ", name);
  value.set_requires_grad(trainable);
  index_.emplace(name, Entry{std::move(value), layer, trainable});
  names_.push_back(name);
  num_layers_ = std::max(num_layers_, layer + 1);
}

void ParamStore::AddPieces(const std::string& name, const std::vector<int64_t>& shape,
                           std::vector<at::Tensor> pieces, int64_t layer, bool trainable) {
  TORCH_CHECK(!pieces.empty(), "ParamStore: ", name, " has no pieces");
  at::Tensor meta =
      at::empty(shape, at::TensorOptions().device(at::kMeta).dtype(pieces.front().scalar_type()));
  int64_t numel = 0;
  for (const at::Tensor& piece : pieces) numel += piece.numel();
  TORCH_CHECK(numel == meta.numel(), "ParamStore: the pieces of ", name, " have ", numel,
              " elements, its shape ", meta.sizes(), " has ", meta.numel());
  Add(name, std::move(meta), layer, trainable);
  index_.at(name).pieces = std::move(pieces);
}

void ParamStore::CopyFlatRange(const std::string& name, int64_t begin, at::Tensor out) const {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "ParamStore: no tensor named ", name);
  const Entry& e = it->second;
  at::NoGradGuard no_grad;
  if (e.pieces.empty()) {
    out.copy_(e.value.detach().reshape({-1}).narrow(0, begin, out.numel()));
    return;
  }
  const int64_t end = begin + out.numel();
  int64_t offset = 0;  // of the current piece in the flat tensor
  for (const at::Tensor& piece : e.pieces) {
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + piece.numel());
    if (lo < hi) {
      out.narrow(0, lo - begin, hi - lo).copy_(piece.reshape({-1}).narrow(0, lo - offset, hi - lo));
    }
    offset += piece.numel();
  }
}

const at::Tensor& ParamStore::get(const std::string& name) const {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "ParamStore: no tensor named ", name);
  return it->second.value;
}

void ParamStore::Assign(const std::string& name, const at::Tensor& value) {
  const at::Tensor& dst = get(name);
  TORCH_CHECK(dst.sizes() == value.sizes(), "ParamStore: ", name, " has shape ", dst.sizes(),
              ", got ", value.sizes());
  at::NoGradGuard no_grad;
  const_cast<at::Tensor&>(dst).copy_(value);
}

void ParamStore::Rebind(const std::string& name, at::Tensor value) {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "ParamStore: no tensor named ", name);
  it->second.value = std::move(value);
}

void ParamStore::MoveTo(c10::Device device, at::ScalarType frozen_dtype) {
  at::NoGradGuard no_grad;
  for (auto& [name, e] : index_) {
    TORCH_CHECK(e.pieces.empty(), "ParamStore: ", name,
                " is in pieces, which only a sharded model copies from");
    const at::ScalarType dtype = e.trainable ? e.value.scalar_type() : frozen_dtype;
    if (e.value.device() == device && e.value.scalar_type() == dtype) continue;
    // One tensor at a time, so the store never holds two copies of the model.
    at::Tensor moved = e.value.to(device, dtype);
    moved.set_requires_grad(e.trainable);
    e.value = std::move(moved);
  }
}

c10::Device ParamStore::device() const {
  return names_.empty() ? c10::Device(c10::kCPU) : index_.at(names_.front()).value.device();
}

std::vector<std::string> ParamStore::TrainableNames() const {
  std::vector<std::string> out;
  for (const auto& n : names_) {
    if (index_.at(n).trainable) out.push_back(n);
  }
  return out;
}

std::vector<std::string> ParamStore::LayerNames(int64_t layer) const {
  std::vector<std::string> out;
  for (const auto& n : names_) {
    if (index_.at(n).layer == layer) out.push_back(n);
  }
  return out;
}

bool ParamStore::trainable(const std::string& name) const {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "ParamStore: no tensor named ", name);
  return it->second.trainable;
}

void ParamStore::SetTrainable(const std::string& name) {
  auto it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "ParamStore: no tensor named ", name);
  it->second.trainable = true;
  it->second.value.set_requires_grad(true);
}

int64_t ParamStore::Numel() const {
  int64_t n = 0;
  for (const auto& [name, e] : index_) n += e.value.numel();
  return n;
}

int64_t ParamStore::TrainableNumel() const {
  int64_t n = 0;
  for (const auto& [name, e] : index_) n += e.trainable ? e.value.numel() : 0;
  return n;
}

}  // namespace ballast::train
