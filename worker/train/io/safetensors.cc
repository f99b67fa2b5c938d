#include "worker/train/io/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "worker/train/io/durable_file.h"
#include "worker/train/io/mapped_file.h"

namespace ballast::train {
namespace {

// The format is little-endian; mapped bytes are handed out as tensors unchanged.
static_assert(std::endian::native == std::endian::little, "safetensors needs a little-endian host");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr absl::string_view kMetadataKey = "__metadata__";

struct DtypeInfo {
  absl::string_view name;
  at::ScalarType scalar_type;
  uint64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8},    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8},  {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},     {"I8", at::kChar, 1},   {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

std::string SupportedDtypes() {
  std::vector<absl::string_view> names;
  for (const DtypeInfo& d : kDtypes) names.push_back(d.name);
  return absl::StrJoin(names, " ");
}

const DtypeInfo* DtypeByName(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

const DtypeInfo* DtypeByScalarType(at::ScalarType t) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.scalar_type == t) return &d;
  }
  return nullptr;
}

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

absl::Status TensorDataLoss(const std::string& path, const std::string& name,
                            absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': ", what));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// nlohmann keeps the last of duplicate keys without a word, so the parser
// callback records the first duplicate at any depth.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool duplicate_is_tensor_name = false;

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
          duplicate_is_tensor_name = open_objects.size() == 1;
        }
        break;
      default:
        break;
    }
    return true;
  }
};

// Overflow-checked product of non-negative dims times the element size.
bool CheckedByteLength(const std::vector<int64_t>& shape, uint64_t element_size, uint64_t* out) {
  uint64_t n = element_size;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                                 const json& value, uint64_t buffer_size) {
  if (!value.is_object()) return TensorDataLoss(path, name, "header entry is not a JSON object");
  Entry e{.name = name};

  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return TensorDataLoss(path, name, "dtype must be a string");
  }
  e.dtype = DtypeByName(dtype->get<std::string>());
  if (e.dtype == nullptr) {
    return TensorDataLoss(path, name,
                          absl::StrCat("dtype '", dtype->get<std::string>(),
                                       "' is not supported (supported: ", SupportedDtypes(), ")"));
  }

  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return TensorDataLoss(path, name, "shape must be an array of non-negative integers");
  }
  for (const json& d : *shape) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorDataLoss(
          path, name,
          absl::StrCat("shape ", shape->dump(), " must be an array of non-negative integers"));
    }
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return TensorDataLoss(path, name,
                          "data_offsets must be [begin, end] with non-negative integers");
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  if (e.begin > e.end || e.end > buffer_size) {
    return TensorDataLoss(
        path, name,
        absl::StrCat("data_offsets [", e.begin, ", ", e.end, ") do not fit in the ", buffer_size,
                     "-byte data buffer (file truncated?)"));
  }

  uint64_t want = 0;
  if (!CheckedByteLength(e.shape, e.dtype->size, &want)) {
    return TensorDataLoss(path, name,
                          absl::StrCat("shape ", ShapeString(e.shape), " overflows 64-bit size"));
  }
  if (want != e.end - e.begin) {
    return TensorDataLoss(
        path, name,
        absl::StrCat("data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin,
                     " bytes but ", e.dtype->name, " ", ShapeString(e.shape), " needs ", want));
  }
  return e;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::move(s).str();
}

// Writes all of `data`, retrying short writes and EINTR.

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const MappedFile> mapping;
  // Where the data buffer starts inside the mapping: 8 + header size.
  uint64_t data_start = 0;
  std::vector<std::string> names;
  std::unordered_map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
};

SafetensorsFile::SafetensorsFile(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapping = MappedFile::Open(path);
  if (!mapping.ok()) return mapping.status();
  impl->mapping = *std::move(mapping);
  const uint8_t* bytes = impl->mapping->data();
  const uint64_t file_size = impl->mapping->size();

  if (file_size < 8) {
    return DataLoss(
        path, absl::StrCat("file is ", file_size, " bytes, shorter than the 8-byte header size"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, sizeof(header_size));
  if (header_size > kMaxHeaderBytes) {
    return DataLoss(path, absl::StrCat("header size ", header_size, " exceeds the ",
                                       kMaxHeaderBytes, "-byte limit"));
  }
  if (8 + header_size > file_size) {
    return DataLoss(path, absl::StrCat("header size ", header_size, " runs past the end of the ",
                                       file_size, "-byte file"));
  }
  impl->data_start = 8 + header_size;
  const uint64_t buffer_size = file_size - impl->data_start;

  DuplicateKeyFinder duplicates;
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_size, std::ref(duplicates));
  } catch (const json::exception& e) {
    return DataLoss(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!duplicates.duplicate.empty()) {
    if (duplicates.duplicate_is_tensor_name) {
      return TensorDataLoss(path, duplicates.duplicate, "name appears more than once in header");
    }
    return DataLoss(path, absl::StrCat("header repeats key '", duplicates.duplicate, "'"));
  }
  if (!header.is_object()) return DataLoss(path, "header is not a JSON object");

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) return DataLoss(path, "__metadata__ must be an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return DataLoss(path, absl::StrCat("__metadata__ value for '", key,
                                             "' must be a string, got ", v.dump()));
        }
        impl->metadata.emplace(key, v.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<Entry> entry = ParseEntry(path, name, value, buffer_size);
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      return TensorDataLoss(path, e.name,
                            absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                         ") overlap the previous tensor, which ends at ", covered));
    }
    if (e.begin > covered) {
      return TensorDataLoss(path, e.name,
                            absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                         ") leave a hole after byte ", covered));
    }
    covered = e.end;
  }
  if (covered != buffer_size) {
    return DataLoss(path, absl::StrCat("tensors cover ", covered, " bytes of the ", buffer_size,
                                       "-byte data buffer"));
  }

  for (Entry& e : entries) {
    impl->names.push_back(e.name);
    std::string name = e.name;
    impl->entries.emplace(std::move(name), std::move(e));
  }
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(impl)));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }

const std::vector<std::string>& SafetensorsFile::names() const { return impl_->names; }

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_->entries.contains(name);
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

absl::StatusOr<at::Tensor> SafetensorsFile::tensor(const std::string& name) const {
  const auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) {
    return absl::NotFoundError(absl::StrCat(impl_->path, ": no tensor '", name, "'"));
  }
  const Entry& e = it->second;
  const auto options = at::TensorOptions().dtype(e.dtype->scalar_type).device(at::kCPU);
  const uint64_t offset = impl_->data_start + e.begin;
  try {
    if (e.begin == e.end) return at::empty(e.shape, options);
    void* data = const_cast<uint8_t*>(impl_->mapping->data() + offset);
    // The mapping is page-aligned, but an odd header size can misalign the
    // data; ATen kernels assume element alignment, so those get a copy.
    if (offset % e.dtype->size != 0) {
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

  absl::StatusOr<std::string> text = ReadWholeFile(index);
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
  std::vector<const DtypeInfo*> dtypes;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", kMetadataKey, "' is reserved and cannot name a tensor"));
    }
    if (!t.defined() || t.layout() != at::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "' must be a defined dense tensor"));
    }
    const DtypeInfo* dtype = DtypeByScalarType(t.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has dtype ",
                                                     c10::toString(t.scalar_type()),
                                                     "; supported: ", SupportedDtypes()));
    }
    dtypes.push_back(dtype);
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * dtype->size;
    header[name] = {{"dtype", std::string(dtype->name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", json::array({offset, offset + nbytes})}};
    offset += nbytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

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
    const DtypeInfo* dtype = dtypes[i++];
    if (t.numel() == 0) continue;
    at::Tensor cpu;
    try {
      // One tensor at a time, so peak host memory is the largest tensor.
      cpu = t.detach().to(at::kCPU).contiguous();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(path, ": cannot copy tensor '", name, "' to CPU: ", e.what()));
    }
    if (absl::Status s =
            file->Append(cpu.data_ptr(), static_cast<size_t>(cpu.numel()) * dtype->size);
        !s.ok()) {
      return s;
    }
  }
  return file->Commit();
}

}  // namespace ballast::train
