#include "worker/train/trainer/straggler_watch.h"

#include <algorithm>

namespace ballast::train {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

}  // namespace

std::vector<v1::StragglerReport> StragglerWatch::Observe(int64_t step,
                                                         const std::vector<double>& own_s) {
  std::vector<v1::StragglerReport> out;
  if (own_s.size() < 2) return out;  // one rank has nobody to be slower than
  ranks_.resize(own_s.size());
  for (size_t r = 0; r < own_s.size(); ++r) {
    std::vector<double> others;
    for (size_t o = 0; o < own_s.size(); ++o) {
      if (o != r) others.push_back(own_s[o]);
    }
    const double others_median = Median(std::move(others));
    Rank& rank = ranks_[r];
    rank.recent.emplace_back(own_s[r], others_median);
    if (static_cast<int32_t>(rank.recent.size()) > window_) rank.recent.pop_front();
    const bool slow = own_s[r] > factor_ * others_median;
    rank.run = slow != rank.straggling ? rank.run + 1 : 0;
    if (rank.run < window_) continue;
    rank.straggling = !rank.straggling;
    rank.run = 0;
    std::vector<double> own_recent, others_recent;
    for (const auto& [own, others_at] : rank.recent) {
      own_recent.push_back(own);
      others_recent.push_back(others_at);
    }
    v1::StragglerReport& report = out.emplace_back();
    report.set_rank(static_cast<int32_t>(r));
    report.set_step(step);
    report.set_step_time_s(Median(std::move(own_recent)));
    report.set_others_step_time_s(Median(std::move(others_recent)));
    report.set_straggling(rank.straggling);
  }
  return out;
}

}  // namespace ballast::train
