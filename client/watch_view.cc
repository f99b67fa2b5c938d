#include "client/watch_view.h"

#include <numeric>
#include <vector>

#include "client/job_format.h"
#include "client/progress.h"

namespace ballast::client {

namespace {

// Carriage return, then erase to the end of the line: a shorter redraw
// leaves nothing of the longer line before it.
constexpr char kClearLine[] = "\r\033[K";

}  // namespace

WatchView::WatchView(std::ostream* out, std::ostream* err, bool tty, int columns)
    : out_(out), err_(err), tty_(tty), columns_(columns) {}

void WatchView::OnEvent(const v1::JobEvent& event) {
  if (event.training().has_step_metrics()) {
    const v1::StepMetrics& m = event.training().step_metrics();
    grad_norms_.push_back(m.grad_norm());
    step_times_.push_back(m.step_time_s());
    if (grad_norms_.size() > kHistory) grad_norms_.pop_front();
    if (step_times_.size() > kHistory) step_times_.pop_front();
    const double mean_step_time =
        std::accumulate(step_times_.begin(), step_times_.end(), 0.0) / step_times_.size();
    if (!tty_) {
      *out_ << ProgressLine(m, mean_step_time, "") << "\n" << std::flush;
      return;
    }
    const std::vector<double> history(grad_norms_.begin(), grad_norms_.end());
    // One column short of the width: a line that fills it wraps on some terminals.
    live_ = FitColumns(ProgressLine(m, mean_step_time, Sparkline(history)), columns_ - 1);
    DrawLive();
    return;
  }
  if (std::optional<std::string> line = EventLine(event)) {
    ClearLive();
    *out_ << *line << "\n";
    DrawLive();
  }
}

void WatchView::Notice(const std::string& text) {
  ClearLive();
  *err_ << "ballast: " << text << "\n" << std::flush;
  DrawLive();
}

void WatchView::Finish() {
  if (tty_ && !live_.empty()) *out_ << "\n" << std::flush;
  live_.clear();
}

void WatchView::ClearLive() {
  if (tty_ && !live_.empty()) *out_ << kClearLine << std::flush;
}

void WatchView::DrawLive() {
  if (tty_ && !live_.empty()) {
    *out_ << kClearLine << live_;
  }
  *out_ << std::flush;
}

}  // namespace ballast::client
