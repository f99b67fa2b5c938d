// What `watch` shows in table mode. On a terminal: one live progress line,
// redrawn in place with \r, and every other event on its own line above it.
// Elsewhere (a pipe, a file): one line per step, so logs stay greppable.
#ifndef BALLAST_CLIENT_WATCH_VIEW_H_
#define BALLAST_CLIENT_WATCH_VIEW_H_

#include <deque>
#include <ostream>
#include <string>

#include "ballast/v1/job.pb.h"

namespace ballast::client {

// Renders events as they arrive. Not thread-safe.
class WatchView {
 public:
  // Steps kept for the sparkline and the mean step time behind the ETA.
  static constexpr size_t kHistory = 20;

  // `out` and `err` must outlive the view; `tty` selects the live line, cut
  // to `columns` characters when that is > 0.
  WatchView(std::ostream* out, std::ostream* err, bool tty, int columns = 0);

  // Updates the progress line for step metrics; prints EventLine() for the rest.
  void OnEvent(const v1::JobEvent& event);
  // Writes "ballast: TEXT" to err on its own line, keeping the progress line.
  void Notice(const std::string& text);
  // Ends the live line so later output starts on a fresh line. Idempotent.
  void Finish();

 private:
  // Clears the live line (terminal only) so a full line can be printed.
  void ClearLive();
  void DrawLive();

  std::ostream* out_;
  std::ostream* err_;
  bool tty_;
  int columns_;
  std::deque<double> grad_norms_;
  std::deque<double> step_times_;
  // The progress line on screen; empty when none is.
  std::string live_;
};

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_WATCH_VIEW_H_
