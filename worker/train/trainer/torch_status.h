// CatchTorch: LibTorch reports through exceptions; they stop at the
// Trainer's API (trainer.h: "Never throws"), where each becomes an
// absl::Status, and an allocation failure keeps its own code so that the
// caller can tell it from a bug.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_TORCH_STATUS_H_
#define BALLAST_WORKER_TRAIN_TRAINER_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include <exception>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ballast::train {

// f() (an absl::Status or StatusOr), or what it threw: RESOURCE_EXHAUSTED for
// a failed allocation, with what to lower; INTERNAL for anything else.
template <typename F>
auto CatchTorch(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory: ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory: an allocation failed; lower data.micro_batch_size or data.seq_len");
  } catch (const c10::Error& e) {
    // The CPU allocator reports a failed allocation as a plain c10::Error
    // (an enforce in c10/core/impl/alloc_cpu.cpp), not as OutOfMemoryError:
    // its message is the only sign.
    if (absl::StrContains(e.what_without_backtrace(), "can't allocate memory")) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory: ", e.what_without_backtrace(),
                       "; lower data.micro_batch_size or data.seq_len"));
    }
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_TORCH_STATUS_H_
