// What this ballast-train binary can compute on: LibTorch, CUDA and NCCL.
#ifndef BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_
#define BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_

#include <string>

namespace ballast::train {

// Multi-line report for `ballast-train --version`: the LibTorch version, and
// for CUDA and NCCL whether they are compiled in and whether they are usable
// on this machine (a device is present and the driver loads).
std::string DescribeBackends();

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_
