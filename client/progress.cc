#include "client/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::client {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = std::llround(seconds);
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string FormatEta(int64_t step, int64_t max_steps, double step_time_s) {
  if (!std::isfinite(step_time_s) || step_time_s <= 0) return "-";
  const int64_t left = std::max<int64_t>(0, max_steps - step);
  return FormatDuration(static_cast<double>(left) * step_time_s);
}

std::string FormatThousands(double value) {
  if (!std::isfinite(value)) return "-";
  const int64_t n = std::llround(value);
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string Sparkline(std::span<const double> values) {
  static constexpr const char* kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  double lo = INFINITY;
  double hi = -INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  std::string out;
  for (double v : values) {
    if (!std::isfinite(v)) {
      out += "!";
    } else if (hi == lo) {
      out += kBars[3];
    } else {
      out += kBars[std::lround((v - lo) / (hi - lo) * 7.0)];
    }
  }
  return out;
}

std::string FitColumns(const std::string& line, int columns) {
  if (columns <= 0) return line;
  int seen = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    // A code point starts at every byte that is not a continuation (10xxxxxx).
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80 && seen++ == columns) {
      return line.substr(0, i);
    }
  }
  return line;
}

std::string FormatLoss(const v1::StepMetrics& m) {
  return m.has_loss() ? absl::StrFormat("%.4f", m.loss()) : "-";
}

std::string ProgressLine(const v1::StepMetrics& m, double mean_step_time_s,
                         const std::string& sparkline) {
  std::string line = absl::StrFormat("step %d/%d loss %s grad_norm %.4g lr %.1e tok/s %s ETA %s",
                                     m.step(), m.max_steps(), FormatLoss(m), m.grad_norm(), m.lr(),
                                     FormatThousands(m.tokens_per_s()),
                                     FormatEta(m.step(), m.max_steps(), mean_step_time_s));
  if (m.skipped()) line += " skipped";
  if (!sparkline.empty()) absl::StrAppend(&line, " ", sparkline);
  return line;
}

}  // namespace ballast::client
