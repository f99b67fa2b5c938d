// Fuzzes the safetensors header parser (worker/train/io/safetensors_header.h)
// that SafetensorsFile::Open runs on every mapped checkpoint file.
//
// Input: the bytes of a whole .safetensors file.
//
// Invariants beyond not crashing: errors are DATA_LOSS; an accepted header
// has its data buffer inside the file, and its tensors, in offset order,
// cover that buffer exactly, each with as many bytes as its dtype and shape
// need, so the reader's views never leave the mapping.
#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "tests/fuzz/invariant.h"
#include "worker/train/io/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ballast::fuzz::Require;
  absl::StatusOr<ballast::train::SafetensorsHeader> header =
      ballast::train::ParseSafetensorsHeader(absl::MakeConstSpan(data, size), "fuzz.safetensors");
  if (!header.ok()) {
    Require(absl::IsDataLoss(header.status()), "errors are DATA_LOSS", header.status());
    return 0;
  }
  Require(header->data_start >= 8 && header->data_start <= size, "the buffer lies in the file");
  uint64_t covered = 0;
  for (const ballast::train::SafetensorsEntry& e : header->entries) {
    Require(e.begin == covered && e.begin <= e.end, "tensors follow each other");
    uint64_t bytes = ballast::train::SafetensorsDtypeSize(e.dtype);
    for (const int64_t d : e.shape) {
      Require(d >= 0, "dims are non-negative");
      bytes *= static_cast<uint64_t>(d);
    }
    Require(bytes == e.end - e.begin, "a tensor has the bytes its shape needs");
    covered = e.end;
  }
  Require(header->data_start + covered == size, "the tensors cover the buffer");
  return 0;
}
