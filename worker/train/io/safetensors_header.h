// The header of a safetensors file, parsed and checked without LibTorch, so
// that the reader (safetensors.h) and the fuzzer (tests/fuzz) run one parser.
//
// Format: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}},
// then the byte buffer the offsets point into. A header is accepted only
// when it is whole: header size cap (100 MB), JSON shape, known dtype,
// offsets inside the buffer, no overlaps and no holes, dtype size x shape ==
// byte length, no duplicate names, __metadata__ values are strings.
// Thread-safe (no state).
#ifndef BALLAST_WORKER_TRAIN_IO_SAFETENSORS_HEADER_H_
#define BALLAST_WORKER_TRAIN_IO_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ballast::train {

enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// The header's spelling of `dtype`: "F64", "BF16", "BOOL"...
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
// Bytes per element of `dtype`.
uint64_t SafetensorsDtypeSize(SafetensorsDtype dtype);
// Every dtype's name, space-separated, for error messages.
std::string SupportedSafetensorsDtypes();

// One tensor as the header describes it.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  // [begin, end): its bytes in the data buffer.
  uint64_t begin;
  uint64_t end;
};

struct SafetensorsHeader {
  // Where the data buffer starts in the file: 8 + the header's size.
  uint64_t data_start = 0;
  // In ascending data offset; together they cover the buffer exactly.
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

// The key of the header that holds metadata; no tensor may take its name.
inline constexpr absl::string_view kSafetensorsMetadataKey = "__metadata__";

// Parses and checks the header of `file`, a whole safetensors file's bytes;
// `path` names it in errors. DATA_LOSS naming the file and, where it
// applies, the tensor, when the file is truncated or the header breaks any
// rule above. Never reads outside `file`.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::Span<const uint8_t> file,
                                                         const std::string& path);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_SAFETENSORS_HEADER_H_
