// StepBatches: the micro-batches one rank takes in each optimizer step,
// packed a step ahead on a thread of its own while the current step
// computes, and handed to the device from pinned host memory without
// blocking the host.
//
// A step's batch is grad_accum_steps micro-batches of micro_batch_size
// rows from the data cursor on, at any world size; rank r takes
// micro-batches r, r + N, ... of them. Thread-compatible: one thread calls
// Take(); the packing thread touches only the dataset, and never while
// Take() does.
#ifndef BALLAST_WORKER_TRAIN_DATA_STEP_BATCHES_H_
#define BALLAST_WORKER_TRAIN_DATA_STEP_BATCHES_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <future>
#include <vector>

#include "worker/train/data/packed_batch.h"
#include "worker/train/data/tokenized_dataset.h"

namespace ballast::train {

struct StepBatchesOptions {
  int64_t micro_batch_size = 1;
  int64_t grad_accum_steps = 1;
  int rank = 0;
  int world_size = 1;
  // Where Take() hands the tensors; cu_seqlens stays on the host, where the
  // attention kernels read the mask's structure.
  c10::Device device = c10::kCPU;
};

// Moves the batch's per-token and per-document tensors to `device` (from
// pinned memory without blocking the host); cu_seqlens and group_offsets
// stay on the host, where the kernels read the mask's structure.
void MoveToDevice(c10::Device device, PackedBatch* batch);

class StepBatches {
 public:
  // `data` must outlive this object.
  StepBatches(TokenizedDataset* data, StepBatchesOptions options);
  // Waits for a packing in progress.
  ~StepBatches();
  StepBatches(const StepBatches&) = delete;
  StepBatches& operator=(const StepBatches&) = delete;

  // This rank's micro-batches of the step whose data starts at `cursor`.
  // They were packed during the previous step when it asked for the step
  // before (the steady case); otherwise (the first step, a resume or a
  // rollback) they are packed now. Then starts packing the step after. On
  // a GPU the copies are queued on the current stream and Take() returns
  // before they finish.
  std::vector<PackedBatch> Take(int64_t cursor);

  // The data-file lines (0-based) of the documents in the rows at data
  // positions [cursor, cursor + rows), over every rank's micro-batches: the
  // guard names the documents of a bad step with them. Waits for a packing
  // in progress.
  std::vector<int64_t> DocumentLines(int64_t cursor, int64_t rows);

  // Data positions (rows) one step consumes: micro_batch_size x grad_accum_steps.
  int64_t rows_per_step() const { return options_.micro_batch_size * options_.grad_accum_steps; }

 private:
  // The step's micro-batches on the host, in pinned memory for a GPU.
  std::vector<PackedBatch> Pack(int64_t cursor);

  TokenizedDataset* const data_;
  const StepBatchesOptions options_;
  // The step being packed ahead, and where its data starts.
  std::future<std::vector<PackedBatch>> next_;
  int64_t next_cursor_ = -1;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_STEP_BATCHES_H_
