#include "worker/train/data/step_batches.h"

#include <ATen/ATen.h>

#include <utility>

namespace ballast::train {
namespace {

at::Tensor ToDevice(const at::Tensor& t, c10::Device device) {
  // From pinned memory a non-blocking copy is queued on the current stream;
  // the host allocator keeps the pinned block until the copy has run.
  return t.defined() ? t.to(device, /*non_blocking=*/true) : t;
}

at::Tensor Pinned(const at::Tensor& t) { return t.defined() ? t.pin_memory() : t; }

}  // namespace

void MoveToDevice(c10::Device device, PackedBatch* b) {
  if (device.is_cpu()) return;
  b->input_ids = ToDevice(b->input_ids, device);
  b->position_ids = ToDevice(b->position_ids, device);
  b->targets = ToDevice(b->targets, device);
  b->loss_weights = ToDevice(b->loss_weights, device);
  b->relevance = ToDevice(b->relevance, device);
}

StepBatches::StepBatches(TokenizedDataset* data, StepBatchesOptions options)
    : data_(data), options_(options) {}

StepBatches::~StepBatches() {
  if (next_.valid()) next_.wait();
}

std::vector<PackedBatch> StepBatches::Pack(int64_t cursor) {
  std::vector<PackedBatch> batches;
  for (int64_t i = options_.rank; i < options_.grad_accum_steps; i += options_.world_size) {
    PackedBatch b = data_->Pack(cursor + i * options_.micro_batch_size, options_.micro_batch_size);
    if (options_.device.is_cuda()) {
      b.input_ids = Pinned(b.input_ids);
      b.position_ids = Pinned(b.position_ids);
      b.targets = Pinned(b.targets);
      b.loss_weights = Pinned(b.loss_weights);
      b.relevance = Pinned(b.relevance);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

std::vector<int64_t> StepBatches::DocumentLines(int64_t cursor, int64_t rows) {
  // The packing thread owns the dataset's order cache while it runs.
  if (next_.valid()) next_.wait();
  return data_->DocumentLines(cursor, rows);
}

std::vector<PackedBatch> StepBatches::Take(int64_t cursor) {
  std::vector<PackedBatch> batches;
  if (next_.valid()) {
    // Ready, or nearly: it had the whole previous step to finish.
    std::vector<PackedBatch> ahead = next_.get();
    if (next_cursor_ == cursor) batches = std::move(ahead);
  }
  if (batches.empty()) batches = Pack(cursor);
  next_cursor_ = cursor + rows_per_step();
  next_ = std::async(std::launch::async, [this, at = next_cursor_] { return Pack(at); });
  for (PackedBatch& b : batches) MoveToDevice(options_.device, &b);
  return batches;
}

}  // namespace ballast::train
