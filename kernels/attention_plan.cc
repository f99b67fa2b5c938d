// MaskPlan and its process-wide cache (kernels/attention_plan.h).
#include "kernels/attention_plan.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>

namespace ballast::kernels {

std::vector<TileItem> make_tile_items(const at::Tensor& segments, const at::Tensor& ranges,
                                      int64_t block) {
  const at::Tensor seg = segments.contiguous();
  const at::Tensor rng = ranges.contiguous();
  const int64_t* s = seg.const_data_ptr<int64_t>();
  const int64_t* r = rng.const_data_ptr<int64_t>();
  std::vector<TileItem> items;
  std::vector<int64_t> cost;
  for (int64_t i = 0; i + 1 < seg.numel(); ++i) {
    for (int64_t b = s[i]; b < s[i + 1]; b += block) {
      TileItem item{b, std::min(b + block, s[i + 1]), {0, 0}, {0, 0}, 0};
      int64_t lo[2], hi[2];
      bool seen[2] = {false, false};
      for (int64_t row = item.begin; row < item.end; ++row) {
        for (int slot = 0; slot < 2; ++slot) {
          const int64_t a = r[4 * row + 2 * slot];
          const int64_t z = r[4 * row + 2 * slot + 1];
          if (a >= z) continue;
          lo[slot] = seen[slot] ? std::min(lo[slot], a) : a;
          hi[slot] = seen[slot] ? std::max(hi[slot], z) : z;
          seen[slot] = true;
        }
      }
      for (int slot = 0; slot < 2; ++slot) {
        if (!seen[slot]) continue;
        item.span_begin[item.span_count] = lo[slot];
        item.span_end[item.span_count] = hi[slot];
        ++item.span_count;
      }
      if (item.span_count == 2) {
        int64_t& b0 = item.span_begin[0];
        int64_t& e0 = item.span_end[0];
        const int64_t b1 = item.span_begin[1];
        const int64_t e1 = item.span_end[1];
        if (b0 <= e1 && b1 <= e0) {
          // Overlapping or touching spans merge, so no tile is visited twice.
          b0 = std::min(b0, b1);
          e0 = std::max(e0, e1);
          item.span_count = 1;
        } else if (b1 < b0) {
          std::swap(item.span_begin[0], item.span_begin[1]);
          std::swap(item.span_end[0], item.span_end[1]);
        }
      }
      int64_t total = 0;
      for (int64_t sp = 0; sp < item.span_count; ++sp)
        total += item.span_end[sp] - item.span_begin[sp];
      items.push_back(item);
      cost.push_back(total * (item.end - item.begin));
    }
  }
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  std::vector<TileItem> sorted;
  sorted.reserve(items.size());
  for (int64_t i : order) sorted.push_back(items[i]);
  return sorted;
}

MaskPlan::MaskPlan(IntervalMask intervals) : intervals_(std::move(intervals)) {}

at::Tensor MaskPlan::Use(const at::Device& device, int64_t key,
                         const std::function<at::Tensor()>& host, int64_t* count) {
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream current = guard.getStream(device);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = copies_.try_emplace({device.index(), key});
  DeviceCopy& copy = it->second;
  if (fresh) {
    copy.host = host();
    copy.count = *count;
    if (device.is_cuda()) copy.host = copy.host.pin_memory();
    copy.device = copy.host.to(device, /*non_blocking=*/true);
    copy.stream = current;
    if (device.is_cuda()) {
      copy.ready = std::make_shared<c10::Event>(device.type());
      copy.ready->record(current);
    }
  } else if (copy.ready != nullptr && current != copy.stream) {
    copy.ready->block(current);
  }
  *count = copy.count;
  return copy.device;
}

at::Tensor MaskPlan::key_ranges_on(const at::Device& device) {
  int64_t count = intervals_.key_ranges.size(0);
  return Use(
      device, -1, [&] { return intervals_.key_ranges.contiguous(); }, &count);
}

MaskPlan::DeviceTiles MaskPlan::tiles_on(const at::Device& device, TileSide side, int64_t block) {
  const int64_t key = (static_cast<int64_t>(side) << 32) + block;
  std::vector<TileItem> items;
  int64_t count = 0;
  DeviceTiles tiles;
  tiles.items = Use(
      device, key,
      [&] {
        items = make_tile_items(
            intervals_.segments,
            side == TileSide::kQueryTiles ? intervals_.key_ranges : intervals_.query_ranges, block);
        count = static_cast<int64_t>(items.size());
        at::Tensor bytes = at::empty({count * static_cast<int64_t>(sizeof(TileItem))}, at::kByte);
        if (count > 0) std::memcpy(bytes.mutable_data_ptr(), items.data(), bytes.numel());
        return bytes;
      },
      &count);
  tiles.count = count;
  return tiles;
}

namespace {

constexpr size_t kKeptPlans = 4;

struct CachedPlan {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> cu_seqlens;
  uint32_t version;
  MaskKind kind;
  int64_t window;
  int64_t block_size;
  int64_t num_tokens;
  c10::intrusive_ptr<MaskPlan> plan;
};

std::mutex cache_mu;
std::deque<CachedPlan>& Cache() {
  static auto* cache = new std::deque<CachedPlan>();
  return *cache;
}
std::atomic<int64_t> plans_built{0};

}  // namespace

c10::intrusive_ptr<MaskPlan> mask_plan(const AttentionMask& mask, int64_t num_tokens) {
  // Inference tensors keep no version counter; they cannot be edited outside
  // inference mode, so 0 stands for "unmodified".
  const uint32_t version = mask.cu_seqlens.is_inference() ? 0 : mask.cu_seqlens._version();
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    for (const CachedPlan& c : Cache()) {
      if (c.cu_seqlens.lock().get() == mask.cu_seqlens.unsafeGetTensorImpl() &&
          c.version == version && c.kind == mask.kind && c.window == mask.window &&
          c.block_size == mask.block_size && c.num_tokens == num_tokens) {
        return c.plan;
      }
    }
  }
  // Built outside the lock: O(T) work that other threads need not wait for.
  auto plan = c10::make_intrusive<MaskPlan>(interval_mask(mask, num_tokens));
  ++plans_built;
  std::lock_guard<std::mutex> lock(cache_mu);
  Cache().push_front(CachedPlan{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                                    mask.cu_seqlens.getIntrusivePtr()),
                                version, mask.kind, mask.window, mask.block_size, num_tokens,
                                plan});
  if (Cache().size() > kKeptPlans) Cache().pop_back();
  return plan;
}

int64_t mask_plans_built() { return plans_built.load(); }

}  // namespace ballast::kernels
