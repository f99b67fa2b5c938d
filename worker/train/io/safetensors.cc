#include "worker/train/io/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/regular_file.h"
#include "worker/train/io/durable_file.h"
#include "worker/train/io/mapped_file.h"
#include "worker/train/io/safetensors_header.h"

namespace ballast::train {
namespace {

using json = nlohmann::json;

// A model.safetensors.index.json maps each tensor name to its shard: some
// hundred KiB for the largest models; one past this is corrupt.
constexpr int64_t kMaxIndexJsonBytes = int64_t{64} << 20;

// The LibTorch type of each safetensors dtype (safetensors_header.h).
constexpr std::pair<SafetensorsDtype, at::ScalarType> kScalarTypes[] = {
    {SafetensorsDtype::kF64, at::kDouble}, {SafetensorsDtype::kF32, at::kFloat},
    {SafetensorsDtype::kF16, at::kHalf},   {SafetensorsDtype::kBF16, at::kBFloat16},
    {SafetensorsDtype::kI64, at::kLong},   {SafetensorsDtype::kI32, at::kInt},
    {SafetensorsDtype::kI16, at::kShort},  {SafetensorsDtype::kI8, at::kChar},
    {SafetensorsDtype::kU8, at::kByte},    {SafetensorsDtype::kBool, at::kBool},
};

at::ScalarType ScalarTypeOf(SafetensorsDtype dtype) {
  for (const auto& [d, t] : kScalarTypes) {
    if (d == dtype) return t;
  }
  return at::ScalarType::Undefined;
}

const SafetensorsDtype* DtypeByScalarType(at::ScalarType t) {
  for (const auto& [d, s] : kScalarTypes) {
    if (s == t) return &d;
  }
  return nullptr;
}

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const MappedFile> mapping;
  SafetensorsHeader header;
  std::vector<std::string> names;
  // Into header.entries.
  std::unordered_map<std::string, const SafetensorsEntry*> entries;
};

SafetensorsFile::SafetensorsFile(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapping = MappedFile::Open(path);
  if (!mapping.ok()) return mapping.status();
  impl->mapping = *std::move(mapping);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(
      absl::MakeConstSpan(impl->mapping->data(), impl->mapping->size()), path);
  if (!header.ok()) return header.status();
  impl->header = *std::move(header);
  for (const SafetensorsEntry& e : impl->header.entries) {
    impl->names.push_back(e.name);
    impl->entries.emplace(e.name, &e);
  }
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(impl)));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }

const std::vector<std::string>& SafetensorsFile::names() const { return impl_->names; }

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_->entries.contains(name);
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->header.metadata;
}

absl::StatusOr<at::Tensor> SafetensorsFile::tensor(const std::string& name) const {
  const auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) {
    return absl::NotFoundError(absl::StrCat(impl_->path, ": no tensor '", name, "'"));
  }
  const SafetensorsEntry& e = *it->second;
  const auto options = at::TensorOptions().dtype(ScalarTypeOf(e.dtype)).device(at::kCPU);
  const uint64_t offset = impl_->header.data_start + e.begin;
  try {
    if (e.begin == e.end) return at::empty(e.shape, options);
    void* data = const_cast<uint8_t*>(impl_->mapping->data() + offset);
    // The mapping is page-aligned, but an odd header size can misalign the
    // data; ATen kernels assume element alignment, so those get a copy.
    if (offset % SafetensorsDtypeSize(e.dtype) != 0) {
      at::Tensor copy = at::empty(e.shape, options);
      std::memcpy(copy.data_ptr(), data, e.end - e.begin);
      return copy;
    }
    return at::from_blob(
        data, e.shape, [mapping = impl_->mapping](void*) {}, options);
  } catch (const std::exception& ex) {
    return absl::InternalError(absl::StrCat(impl_->path, ": tensor '", name, "': ", ex.what()));
  }
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::Open(const std::string& dir,
                                                                  const std::string& file_name) {
  namespace fs = std::filesystem;
  const std::string single = (fs::path(dir) / file_name).string();
  const std::string index = single + ".index.json";
  SafetensorsCheckpoint checkpoint;

  std::error_code ec;
  if (fs::exists(single, ec)) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(single);
    if (!file.ok()) return file.status();
    std::shared_ptr<SafetensorsFile> shared = *std::move(file);
    for (const std::string& name : shared->names()) checkpoint.by_name_.emplace(name, shared);
    return checkpoint;
  }
  if (!fs::exists(index, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in ", dir, ": neither ", single, " nor ", index, " exists"));
  }

  absl::StatusOr<std::string> text = ReadRegularFile(index, kMaxIndexJsonBytes);
  if (!text.ok()) return text.status();
  json parsed;
  try {
    parsed = json::parse(*text);
  } catch (const json::exception& e) {
    return DataLoss(index, absl::StrCat("not valid JSON: ", e.what()));
  }
  const auto weight_map = parsed.is_object() ? parsed.find("weight_map") : parsed.end();
  if (!parsed.is_object() || weight_map == parsed.end() || !weight_map->is_object()) {
    return DataLoss(index, "weight_map must be an object of tensor name -> shard file");
  }

  std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      return DataLoss(index, absl::StrCat("weight_map entry for tensor '", name,
                                          "' must be a shard file name"));
    }
    const std::string shard_name = shard.get<std::string>();
    // Shards live beside the index; a path could reach outside the checkpoint.
    if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "." ||
        shard_name == "..") {
      return DataLoss(index, absl::StrCat("weight_map maps tensor '", name, "' to '", shard_name,
                                          "', which is not a file name in ", dir));
    }
    auto it = shards.find(shard_name);
    if (it == shards.end()) {
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
          SafetensorsFile::Open((fs::path(dir) / shard_name).string());
      if (!file.ok()) {
        return absl::Status(file.status().code(),
                            absl::StrCat(file.status().message(), " (shard of tensor '", name,
                                         "' in ", index, ")"));
      }
      it = shards.emplace(shard_name, *std::move(file)).first;
    }
    if (!it->second->contains(name)) {
      return DataLoss(index, absl::StrCat("weight_map puts tensor '", name, "' in shard ",
                                          it->second->path(), ", which does not contain it"));
    }
    checkpoint.by_name_.emplace(name, it->second);
  }
  return checkpoint;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, file] : by_name_) out.push_back(name);
  return out;
}

bool SafetensorsCheckpoint::contains(const std::string& name) const {
  return by_name_.contains(name);
}

absl::StatusOr<at::Tensor> SafetensorsCheckpoint::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
  }
  return it->second->tensor(name);
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsDtype> dtypes;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kSafetensorsMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", kSafetensorsMetadataKey,
                                                     "' is reserved and cannot name a tensor"));
    }
    if (!t.defined() || t.layout() != at::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' must be a defined dense tensor"));
    }
    const SafetensorsDtype* dtype = DtypeByScalarType(t.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' has dtype ", c10::toString(t.scalar_type()),
                       "; supported: ", SupportedSafetensorsDtypes()));
    }
    dtypes.push_back(*dtype);
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * SafetensorsDtypeSize(*dtype);
    header[name] = {{"dtype", std::string(SafetensorsDtypeName(*dtype))},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", json::array({offset, offset + nbytes})}};
    offset += nbytes;
  }
  if (!metadata.empty()) header[std::string(kSafetensorsMetadataKey)] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  // Pad with spaces (still valid JSON) so the data buffer starts 8-aligned and
  // readers can view every dtype in place.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_size = header_text.size();

  absl::StatusOr<DurableFile> file = DurableFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(&header_size, sizeof(header_size)); !s.ok()) return s;
  if (absl::Status s = file->Append(header_text.data(), header_text.size()); !s.ok()) return s;
  size_t i = 0;
  for (const auto& [name, t] : tensors) {
    const SafetensorsDtype dtype = dtypes[i++];
    if (t.numel() == 0) continue;
    at::Tensor cpu;
    try {
      // One tensor at a time, so peak host memory is the largest tensor.
      cpu = t.detach().to(at::kCPU).contiguous();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(path, ": cannot copy tensor '", name, "' to CPU: ", e.what()));
    }
    if (absl::Status s = file->Append(
            cpu.data_ptr(), static_cast<size_t>(cpu.numel()) * SafetensorsDtypeSize(dtype));
        !s.ok()) {
      return s;
    }
  }
  return file->Commit();
}

}  // namespace ballast::train
