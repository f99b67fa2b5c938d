#include "worker/train/model/finite_weights.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast::train {
namespace {

// Elements of a tensor kept as pieces read at a time (8 MiB in fp32).
constexpr int64_t kChunk = 1 << 21;

// The flat index of the first non-finite element of `t`, or -1.
int64_t FirstNonFinite(const at::Tensor& t) {
  if (t.numel() == 0 || !t.is_floating_point()) return -1;
  // One pass, with no temporary the size of the tensor (isfinite().all()
  // makes several and is about 30 times slower).
  const auto [lo, hi] = at::aminmax(t);
  if (std::isfinite(lo.item<double>()) && std::isfinite(hi.item<double>())) return -1;
  return at::logical_not(at::isfinite(t.reshape({-1}))).to(torch::kByte).argmax().item<int64_t>();
}

// The same for `name` of `weights`: a tensor kept as pieces (a sharded
// rank's mapped experts, ParamStore::AddPieces) has no elements of its own
// and is read a chunk at a time.
int64_t FirstNonFinite(const ParamStore& weights, const std::string& name) {
  const at::Tensor& t = weights.get(name);
  if (!t.is_meta()) return FirstNonFinite(t);
  at::Tensor chunk = torch::empty({std::min(kChunk, t.numel())}, t.options().device(c10::kCPU));
  for (int64_t begin = 0; begin < t.numel(); begin += kChunk) {
    at::Tensor part = chunk.narrow(0, 0, std::min(kChunk, t.numel() - begin));
    weights.CopyFlatRange(name, begin, part);
    if (const int64_t bad = FirstNonFinite(part); bad >= 0) return begin + bad;
  }
  return -1;
}

// The element at flat `index` of `name`.
double ElementAt(const ParamStore& weights, const std::string& name, int64_t index) {
  const at::Tensor& t = weights.get(name);
  at::Tensor one = torch::empty({1}, t.options().device(c10::kCPU));
  weights.CopyFlatRange(name, index, one);
  return one.item<double>();
}

// "[3, 17]": flat `index` of a tensor of `shape`, row-major.
std::string Position(at::IntArrayRef shape, int64_t index) {
  std::vector<int64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = index % shape[d];
    index /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(at, ", "), "]");
}

}  // namespace

at::Tensor FirstNonFiniteElements(const ParamStore& weights, int rank, int world_size) {
  torch::NoGradGuard no_grad;
  const std::vector<std::string>& names = weights.names();
  at::Tensor first = torch::zeros({static_cast<int64_t>(names.size())}, torch::kLong);
  int64_t* out = first.data_ptr<int64_t>();
  for (size_t i = rank; i < names.size(); i += world_size) {
    out[i] = FirstNonFinite(weights, names[i]) + 1;
  }
  return first;
}

absl::Status RefuseNonFiniteWeights(const ParamStore& weights, const at::Tensor& first,
                                    const std::string& model_dir) {
  const at::Tensor found = first.cpu();
  const int64_t* entry = found.const_data_ptr<int64_t>();
  const std::vector<std::string>& names = weights.names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (entry[i] == 0) continue;
    const int64_t index = entry[i] - 1;
    int64_t bad = 0;
    for (size_t j = i + 1; j < names.size(); ++j) bad += entry[j] != 0;
    return absl::InvalidArgumentError(
        absl::StrCat("model.path ", model_dir, ": tensor ", names[i], " holds ",
                     ElementAt(weights, names[i], index), " at flat index ", index, " (element ",
                     Position(weights.get(names[i]).sizes(), index),
                     "); a base model with a NaN or an "
                     "infinity in its weights cannot train (every step would be skipped)",
                     bad > 0 ? absl::StrCat("; ", bad, " more tensors hold one too") : ""));
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
