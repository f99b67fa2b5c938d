#include "worker/train/io/safetensors_header.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast::train {
namespace {

// The header size is read as a little-endian u64 in place.
static_assert(std::endian::native == std::endian::little, "safetensors needs a little-endian host");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  SafetensorsDtype dtype;
  absl::string_view name;
  uint64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF64, "F64", 8}, {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2}, {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8}, {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kI16, "I16", 2}, {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU8, "U8", 1},   {SafetensorsDtype::kBool, "BOOL", 1},
};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  return *std::find_if(std::begin(kDtypes), std::end(kDtypes),
                       [dtype](const DtypeInfo& d) { return d.dtype == dtype; });
}

const DtypeInfo* DtypeByName(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return &d;
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

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                            const json& value, uint64_t buffer_size) {
  if (!value.is_object()) return TensorDataLoss(path, name, "header entry is not a JSON object");
  SafetensorsEntry e{.name = name};

  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return TensorDataLoss(path, name, "dtype must be a string");
  }
  const DtypeInfo* info = DtypeByName(dtype->get<std::string>());
  if (info == nullptr) {
    return TensorDataLoss(
        path, name,
        absl::StrCat("dtype '", dtype->get<std::string>(),
                     "' is not supported (supported: ", SupportedSafetensorsDtypes(), ")"));
  }
  e.dtype = info->dtype;

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
  if (!CheckedByteLength(e.shape, info->size, &want)) {
    return TensorDataLoss(path, name,
                          absl::StrCat("shape ", ShapeString(e.shape), " overflows 64-bit size"));
  }
  if (want != e.end - e.begin) {
    return TensorDataLoss(
        path, name,
        absl::StrCat("data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin,
                     " bytes but ", info->name, " ", ShapeString(e.shape), " needs ", want));
  }
  return e;
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }

uint64_t SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

std::string SupportedSafetensorsDtypes() {
  std::vector<absl::string_view> names;
  for (const DtypeInfo& d : kDtypes) names.push_back(d.name);
  return absl::StrJoin(names, " ");
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file,
                                                         const std::string& path) {
  const uint64_t file_size = file.size();
  if (file_size < 8) {
    return DataLoss(
        path, absl::StrCat("file is ", file_size, " bytes, shorter than the 8-byte header size"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, file.data(), sizeof(header_size));
  if (header_size > kMaxHeaderBytes) {
    return DataLoss(path, absl::StrCat("header size ", header_size, " exceeds the ",
                                       kMaxHeaderBytes, "-byte limit"));
  }
  if (8 + header_size > file_size) {
    return DataLoss(path, absl::StrCat("header size ", header_size, " runs past the end of the ",
                                       file_size, "-byte file"));
  }
  SafetensorsHeader header;
  header.data_start = 8 + header_size;
  const uint64_t buffer_size = file_size - header.data_start;

  DuplicateKeyFinder duplicates;
  json parsed;
  try {
    parsed = json::parse(file.data() + 8, file.data() + header.data_start, std::ref(duplicates));
  } catch (const json::exception& e) {
    return DataLoss(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!duplicates.duplicate.empty()) {
    if (duplicates.duplicate_is_tensor_name) {
      return TensorDataLoss(path, duplicates.duplicate, "name appears more than once in header");
    }
    return DataLoss(path, absl::StrCat("header repeats key '", duplicates.duplicate, "'"));
  }
  if (!parsed.is_object()) return DataLoss(path, "header is not a JSON object");

  for (const auto& [name, value] : parsed.items()) {
    if (name == kSafetensorsMetadataKey) {
      if (!value.is_object()) return DataLoss(path, "__metadata__ must be an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) {
          return DataLoss(path, absl::StrCat("__metadata__ value for '", key,
                                             "' must be a string, got ", v.dump()));
        }
        header.metadata.emplace(key, v.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> entry = ParseEntry(path, name, value, buffer_size);
    if (!entry.ok()) return entry.status();
    header.entries.push_back(*std::move(entry));
  }

  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;
  for (const SafetensorsEntry& e : header.entries) {
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
  return header;
}

}  // namespace ballast::train
