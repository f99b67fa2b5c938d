// A job's training curves as an SVG chart, for reports: loss (and the
// validation loss, when the job evaluates a held-out set) and the global
// grad_norm over the steps, a reranker's held-out ranking when it has one,
// with the guard's rollbacks and skipped steps marked (`ballast plot`).
// Built from the job's events, so it works for any job the coordinator
// still holds, from any machine.
#ifndef BALLAST_CLIENT_LOSS_CHART_H_
#define BALLAST_CLIENT_LOSS_CHART_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ballast/v1/job.pb.h"

namespace ballast::client {

// The curves of one job, in the order its steps were reported. A rollback
// re-runs steps, so a step may appear twice: each run after a rollback (or a
// restart) is its own segment, drawn as its own line.
class LossChart {
 public:
  explicit LossChart(std::string title) : title_(std::move(title)) {}

  // Takes the step metrics, evaluations and guard events of `event`;
  // ignores the rest.
  void Add(const v1::JobEvent& event);

  int64_t steps() const { return static_cast<int64_t>(points_.size()); }
  int64_t evals() const { return static_cast<int64_t>(evals_.size()); }
  int64_t rankings() const { return static_cast<int64_t>(mrr_.size()); }
  int64_t rollbacks() const { return static_cast<int64_t>(rollbacks_.size()); }

  // The chart: two panels sharing the step axis, loss above (linear), with
  // eval_loss as a second line of marked points, and grad_norm below
  // (log10, because one spike would flatten a linear axis); below them, for
  // a reranker that evaluated, a third panel of its MRR@10 and NDCG@10 (0 to
  // 1) as lines of marked points.
  // A step without a loss leaves a gap; a non-finite or skipped step is a
  // marker at the panel's top; a rollback is a vertical line from the step
  // it was taken at, labelled with the step it went back to. Deterministic:
  // the same events give the same bytes.
  std::string Svg() const;

 private:
  struct Point {
    int64_t step;
    std::optional<double> loss;
    double grad_norm;
    bool skipped;
    int segment;
  };
  // An evaluation's value: eval_loss, or a reranker's MRR@10 or NDCG@10.
  struct Eval {
    int64_t step;
    double value;
    int segment;
  };
  struct Rollback {
    int64_t step;
    int64_t to_step;
  };

  std::string title_;
  std::vector<Point> points_;
  std::vector<Eval> evals_;
  std::vector<Eval> mrr_, ndcg_;  // a reranker's evaluations
  std::vector<Rollback> rollbacks_;
  int segment_ = 0;
  int last_attempt_ = -1;
  int64_t last_step_ = 0;
};

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_LOSS_CHART_H_
