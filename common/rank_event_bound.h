// The size bound on one rank event, kept by the worker that relays it
// (worker/agent/event_relay) and again by the coordinator that stores it
// (server/coordinator), which cannot trust a worker to have kept it.
//
// Why: a rank may send frames of up to kMaxRankFrameBytes, but the worker
// batches events into ReportEvents calls that ballastd accepts only up to
// 4 MiB. One oversized event would make every retry of its batch fail alike,
// and the worker's later events would never arrive. Stored, it would also
// be replayed to every watcher of the job and held in the job's history.
#ifndef BALLAST_COMMON_RANK_EVENT_BOUND_H_
#define BALLAST_COMMON_RANK_EVENT_BOUND_H_

#include <cstddef>

#include "ballast/v1/worker_service.pb.h"

namespace ballast {

// Far above what a trainer reports (a step's metrics with per-module grad
// norms, a data report with its first bad records: tens of KiB), far below
// the 4 MiB message limit of ballastd.
inline constexpr size_t kMaxRankEventBytes = 256 << 10;

// The stderr tail that a RankExited carries, at most (rank_process keeps it).
inline constexpr size_t kMaxStderrTailBytes = 4 << 10;

// Brings `event` within kMaxRankEventBytes, saying so rather than cutting
// silently: an oversized training event becomes a warning log line of the
// same job, attempt and rank that names its kind and size; an exit keeps its
// code and the last kMaxStderrTailBytes of its stderr tail (cut on a UTF-8
// character boundary), since its exit must still free the rank. Returns
// whether it changed the event.
bool BoundRankEvent(v1::RankEvent* event);

}  // namespace ballast

#endif  // BALLAST_COMMON_RANK_EVENT_BOUND_H_
