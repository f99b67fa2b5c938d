// MaskPlan: a structural mask compiled once per batch and shared by every
// attention call that uses it, forward and backward, every layer.
//
// attention() compiles an AttentionMask to key intervals (interval_mask(),
// O(T)), and on CUDA also cuts them into work items per tile shape and copies
// both to the device. A decoder calls attention() once per layer with the
// same mask, and the backward (or an activation-checkpointed recompute) calls
// it again. mask_plan() keeps recent plans keyed by the identity of the
// mask's cu_seqlens tensor (plus its version counter and the mask's scalars),
// so every one of those calls finds the plan built by the first. Device
// copies are made once per device and tile shape, from pinned host memory,
// non-blocking on the current stream; a later call on another stream waits
// for the copy with an event, not with a host sync.
//
// Thread-safe: plans may be shared between threads; their device caches are
// guarded by a mutex.
#ifndef BALLAST_KERNELS_ATTENTION_PLAN_H_
#define BALLAST_KERNELS_ATTENTION_PLAN_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/attention_cpu.h"

namespace ballast::kernels {

// One tile of one segment: rows [begin, end) (queries for the forward and dQ,
// keys for dK/dV) and up to two spans of the other side that some row of the
// tile meets (the hull of its rows' intervals), ordered and disjoint. Tiles
// outside the spans are never visited; a tile with no span only writes its
// empty-row result. Copied to the device as bytes.
struct TileItem {
  int64_t begin;
  int64_t end;
  int64_t span_begin[2];
  int64_t span_end[2];
  int64_t span_count;
};
static_assert(sizeof(TileItem) == 7 * sizeof(int64_t), "TileItem is copied to the device as bytes");

// Cuts every segment into tiles of `block` rows and gives each the union of
// the intervals `ranges` (T, 4) lists for its rows, as at most two spans,
// most costly tiles first so that the longest causal tiles start first.
std::vector<TileItem> make_tile_items(const at::Tensor& segments, const at::Tensor& ranges,
                                      int64_t block);

// Which intervals a tile list is cut from: the keys each query sees (forward,
// dQ) or the queries that see each key (dK/dV).
enum class TileSide { kQueryTiles, kKeyTiles };

class MaskPlan : public torch::CustomClassHolder {
 public:
  explicit MaskPlan(IntervalMask intervals);

  // The compiled mask, on the host.
  const IntervalMask& intervals() const { return intervals_; }

  struct DeviceTiles {
    at::Tensor items;   // (count * sizeof(TileItem)) bytes on the device
    int64_t count = 0;  // number of tiles; 0 for T = 0
  };

  // key_ranges (T, 4) int64 on `device`, copied on first use.
  at::Tensor key_ranges_on(const at::Device& device);
  // The tile list of `side` with `block` rows per tile, on `device`.
  DeviceTiles tiles_on(const at::Device& device, TileSide side, int64_t block);

 private:
  struct DeviceCopy {
    at::Tensor host;    // pinned for a CUDA device, so that the copy can be asynchronous
    at::Tensor device;  // the copy
    int64_t count = 0;
    c10::Stream stream{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};  // the copy's stream
    std::shared_ptr<c10::Event> ready;                                 // recorded after it
  };
  // The copy of `host` (made by the caller when absent) under `key`, ready
  // for use on the current stream of `device`.
  at::Tensor Use(const at::Device& device, int64_t key, const std::function<at::Tensor()>& host,
                 int64_t* count);

  const IntervalMask intervals_;
  std::mutex mu_;
  // (device index, key) -> copy; key -1 is key_ranges, else side * 2^32 + block.
  std::map<std::pair<int, int64_t>, DeviceCopy> copies_;
};

// The plan of a validated mask over num_tokens tokens: a recent one when the
// mask's cu_seqlens is the same tensor, unmodified, with the same scalars;
// else a new one, which replaces the oldest of the few kept.
c10::intrusive_ptr<MaskPlan> mask_plan(const AttentionMask& mask, int64_t num_tokens);

// How many plans mask_plan() has built in this process (for tests).
int64_t mask_plans_built();

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_ATTENTION_PLAN_H_
