#include "client/loss_chart.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::client {
namespace {

// Layout, in SVG user units.
constexpr double kWidth = 960;
constexpr double kPanelHeight = 260;
constexpr double kLeft = 80;
constexpr double kRight = 24;
constexpr double kTop = 48;
constexpr double kGap = 56;
constexpr double kBottom = 48;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Number(double v) { return absl::StrFormat("%.1f", v); }

// A tick label: compact, and exact for round values.
std::string TickLabel(double v) { return absl::StrFormat("%.4g", v); }

// About `count` round tick values covering [lo, hi].
std::vector<double> Ticks(double lo, double hi, int count) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * magnitude) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

// One panel: its y range, where it sits, and how a value maps onto it.
struct Panel {
  double top;
  double lo;
  double hi;
  bool log;

  double Y(double v) const {
    const double a = log ? std::log10(v) : v;
    const double b = log ? std::log10(lo) : lo;
    const double c = log ? std::log10(hi) : hi;
    return top + kPanelHeight * (1.0 - (a - b) / (c - b));
  }
};

}  // namespace

void LossChart::Add(const v1::JobEvent& event) {
  if (!event.has_training()) return;
  const v1::TrainingEvent& t = event.training();
  if (t.has_step_metrics()) {
    const v1::StepMetrics& m = t.step_metrics();
    // A new attempt (a restart) or a step that does not follow the last one
    // (a rollback's re-run) starts a new line.
    if ((last_attempt_ >= 0 && event.attempt() != last_attempt_) ||
        (!points_.empty() && m.step() <= last_step_)) {
      ++segment_;
    }
    last_attempt_ = event.attempt();
    last_step_ = m.step();
    points_.push_back({.step = m.step(),
                       .loss = m.has_loss() ? std::optional<double>(m.loss()) : std::nullopt,
                       .grad_norm = m.grad_norm(),
                       .skipped = m.skipped(),
                       .segment = segment_});
  } else if (t.has_eval() && t.eval().has_loss()) {
    evals_.push_back({.step = t.eval().step(), .value = t.eval().loss(), .segment = segment_});
  } else if (t.has_eval() && t.eval().groups() > 0) {
    mrr_.push_back({.step = t.eval().step(), .value = t.eval().mrr_at_10(), .segment = segment_});
    ndcg_.push_back({.step = t.eval().step(), .value = t.eval().ndcg_at_10(), .segment = segment_});
  } else if (t.has_guard() && t.guard().kind() == v1::GuardEvent::KIND_ROLLBACK) {
    rollbacks_.push_back({.step = t.guard().step(), .to_step = t.guard().to_step()});
  }
}

std::string LossChart::Svg() const {
  const int panels = mrr_.empty() ? 2 : 3;
  const double height = kTop + panels * kPanelHeight + (panels - 1) * kGap + kBottom;
  const double plot_width = kWidth - kLeft - kRight;
  int64_t first = std::numeric_limits<int64_t>::max();
  int64_t last = 0;
  double loss_lo = std::numeric_limits<double>::infinity();
  double loss_hi = -loss_lo;
  double norm_lo = loss_lo;
  double norm_hi = -loss_lo;
  for (const Point& p : points_) {
    first = std::min(first, p.step);
    last = std::max(last, p.step);
    if (p.loss && std::isfinite(*p.loss) && !p.skipped) {
      loss_lo = std::min(loss_lo, *p.loss);
      loss_hi = std::max(loss_hi, *p.loss);
    }
    if (std::isfinite(p.grad_norm) && p.grad_norm > 0 && !p.skipped) {
      norm_lo = std::min(norm_lo, p.grad_norm);
      norm_hi = std::max(norm_hi, p.grad_norm);
    }
  }
  for (const Eval& e : evals_) {
    if (std::isfinite(e.value)) {
      loss_lo = std::min(loss_lo, e.value);
      loss_hi = std::max(loss_hi, e.value);
    }
  }
  for (const std::vector<Eval>* evals : {&evals_, &mrr_}) {
    for (const Eval& e : *evals) {
      first = std::min(first, e.step);
      last = std::max(last, e.step);
    }
  }
  if (points_.empty() && evals_.empty() && mrr_.empty()) first = last = 0;
  if (last <= first) last = first + 1;
  if (!(loss_hi >= loss_lo)) loss_lo = 0, loss_hi = 1;
  if (loss_hi - loss_lo < 1e-12) loss_lo -= 0.5, loss_hi += 0.5;
  const double pad = (loss_hi - loss_lo) * 0.05;
  loss_lo -= pad;
  loss_hi += pad;
  if (!(norm_hi >= norm_lo)) norm_lo = 0.1, norm_hi = 10;
  // Whole decades, so the log axis reads 0.1, 1, 10...
  norm_lo = std::pow(10.0, std::floor(std::log10(norm_lo)));
  norm_hi = std::pow(10.0, std::ceil(std::log10(norm_hi) + 1e-12));

  const Panel loss_panel{kTop, loss_lo, loss_hi, false};
  const Panel norm_panel{kTop + kPanelHeight + kGap, norm_lo, norm_hi, true};
  const Panel ranking_panel{kTop + 2 * (kPanelHeight + kGap), 0, 1, false};
  const Panel& bottom_panel = mrr_.empty() ? norm_panel : ranking_panel;
  auto x = [&](int64_t step) {
    return kLeft +
           plot_width * static_cast<double>(step - first) / static_cast<double>(last - first);
  };

  std::string svg =
      absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", Number(kWidth),
                   "\" height=\"", Number(height), "\" viewBox=\"0 0 ", Number(kWidth), " ",
                   Number(height), "\" font-family=\"sans-serif\" font-size=\"12\">\n",
                   "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", "<text x=\"",
                   Number(kLeft), "\" y=\"28\" font-size=\"16\">", Escape(title_), "</text>\n");

  auto axes = [&](const Panel& panel, const std::string& name) {
    const double bottom = panel.top + kPanelHeight;
    absl::StrAppend(&svg, "<g class=\"axes\" stroke=\"#999\" fill=\"none\">\n", "<rect x=\"",
                    Number(kLeft), "\" y=\"", Number(panel.top), "\" width=\"", Number(plot_width),
                    "\" height=\"", Number(kPanelHeight), "\"/>\n</g>\n");
    std::vector<double> ticks;
    if (panel.log) {
      for (double t = panel.lo; t <= panel.hi * (1 + 1e-9); t *= 10) ticks.push_back(t);
    } else {
      ticks = Ticks(panel.lo, panel.hi, 5);
    }
    for (double t : ticks) {
      if (t < panel.lo || t > panel.hi) continue;
      const double y = panel.Y(t);
      absl::StrAppend(&svg, "<line x1=\"", Number(kLeft), "\" x2=\"", Number(kLeft + plot_width),
                      "\" y1=\"", Number(y), "\" y2=\"", Number(y),
                      "\" stroke=\"#eee\"/>\n<text x=\"", Number(kLeft - 6), "\" y=\"",
                      Number(y + 4), "\" text-anchor=\"end\">", TickLabel(t), "</text>\n");
    }
    for (double t : Ticks(static_cast<double>(first), static_cast<double>(last), 8)) {
      if (t != std::floor(t)) continue;
      absl::StrAppend(&svg, "<text x=\"", Number(x(static_cast<int64_t>(t))), "\" y=\"",
                      Number(bottom + 16), "\" text-anchor=\"middle\">", TickLabel(t), "</text>\n");
    }
    absl::StrAppend(&svg, "<text x=\"", Number(kLeft), "\" y=\"", Number(panel.top - 8), "\">",
                    name, "</text>\n");
  };
  axes(loss_panel, evals_.empty() ? "loss" : "loss, and eval_loss (dots)");
  axes(norm_panel, "grad_norm (log scale)");
  if (!mrr_.empty()) axes(ranking_panel, "held-out ranking: MRR@10, and NDCG@10 (dashed)");
  absl::StrAppend(&svg, "<text x=\"", Number(kLeft + plot_width / 2), "\" y=\"", Number(height - 8),
                  "\" text-anchor=\"middle\">step</text>\n");

  // One polyline per run of consecutive plottable points of a segment.
  auto lines = [&](const Panel& panel, const char* cls, const char* color,
                   const std::function<std::optional<double>(const Point&)>& value) {
    std::vector<std::string> runs;
    std::string run;
    int run_points = 0;
    int segment = -1;
    auto flush = [&] {
      if (run_points > 0) runs.push_back(run);
      run.clear();
      run_points = 0;
    };
    for (const Point& p : points_) {
      if (p.segment != segment) flush();
      segment = p.segment;
      const std::optional<double> v = value(p);
      if (!v) {
        flush();
        continue;
      }
      absl::StrAppend(&run, run_points > 0 ? " " : "", Number(x(p.step)), ",", Number(panel.Y(*v)));
      ++run_points;
    }
    flush();
    for (const std::string& points : runs) {
      absl::StrAppend(&svg, "<polyline class=\"", cls, "\" fill=\"none\" stroke=\"", color,
                      "\" stroke-width=\"1.5\" points=\"", points, "\"/>\n");
    }
  };
  lines(loss_panel, "loss", "#1f77b4", [](const Point& p) -> std::optional<double> {
    if (!p.loss || !std::isfinite(*p.loss) || p.skipped) return std::nullopt;
    return *p.loss;
  });
  // Evaluations: few points, each marked, one line per segment.
  auto marked = [&](const Panel& panel, const std::vector<Eval>& evals, const char* name,
                    const char* color, const char* dashes) {
    int segment = -1;
    std::string run;
    auto flush = [&] {
      if (run.find(' ') != std::string::npos) {
        absl::StrAppend(&svg, "<polyline class=\"", name, "\" fill=\"none\" stroke=\"", color,
                        "\" stroke-width=\"1.5\" stroke-dasharray=\"", dashes, "\" points=\"", run,
                        "\"/>\n");
      }
      run.clear();
    };
    for (const Eval& e : evals) {
      if (e.segment != segment) flush();
      segment = e.segment;
      if (!std::isfinite(e.value)) {
        flush();
        continue;
      }
      const std::string cx = Number(x(e.step)), cy = Number(panel.Y(e.value));
      absl::StrAppend(&run, run.empty() ? "" : " ", cx, ",", cy);
      absl::StrAppend(&svg, "<circle class=\"", name, "\" cx=\"", cx, "\" cy=\"", cy,
                      "\" r=\"3\" fill=\"", color, "\"><title>", name, " ", TickLabel(e.value),
                      " at step ", e.step, "</title></circle>\n");
    }
    flush();
  };
  marked(loss_panel, evals_, "eval_loss", "#9467bd", "none");
  marked(ranking_panel, mrr_, "mrr_at_10", "#ff7f0e", "none");
  marked(ranking_panel, ndcg_, "ndcg_at_10", "#8c564b", "5 3");
  lines(norm_panel, "grad_norm", "#2ca02c", [](const Point& p) -> std::optional<double> {
    if (!std::isfinite(p.grad_norm) || p.grad_norm <= 0 || p.skipped) return std::nullopt;
    return p.grad_norm;
  });

  for (const Point& p : points_) {
    if (!p.skipped) continue;
    for (const Panel* panel : {&loss_panel, &norm_panel}) {
      absl::StrAppend(&svg, "<circle class=\"skipped\" cx=\"", Number(x(p.step)), "\" cy=\"",
                      Number(panel->top + 6), "\" r=\"4\" fill=\"#ff7f0e\"><title>step ", p.step,
                      " skipped</title></circle>\n");
    }
  }
  for (const Rollback& r : rollbacks_) {
    const double rx = x(r.step);
    absl::StrAppend(
        &svg, "<g class=\"rollback\"><line x1=\"", Number(rx), "\" x2=\"", Number(rx), "\" y1=\"",
        Number(loss_panel.top), "\" y2=\"", Number(bottom_panel.top + kPanelHeight),
        "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"", Number(rx + 4), "\" y=\"",
        Number(loss_panel.top + 14), "\" fill=\"#d62728\">rollback to ", r.to_step,
        "</text><title>step ", r.step, ": rolled back to step ", r.to_step, "</title></g>\n");
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace ballast::client
