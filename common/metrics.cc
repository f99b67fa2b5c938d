#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

// Prometheus spells the special values +Inf, -Inf and NaN. Other values get
// the shortest of %.15g and %.17g that reads back as the same double.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Label values escape backslash, newline and double quote; HELP text only
// the first two.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendLabels(const MetricLabels& labels, const std::pair<std::string, std::string>* extra,
                  std::string* out) {
  if (labels.empty() && extra == nullptr) return;
  *out += '{';
  bool first = true;
  auto append = [&](const std::pair<std::string, std::string>& kv) {
    if (!first) *out += ',';
    first = false;
    absl::StrAppend(out, kv.first, "=\"", EscapeLabelValue(kv.second), "\"");
  };
  for (const auto& kv : labels) append(kv);
  if (extra != nullptr) append(*extra);
  *out += '}';
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

void ObserveInto(const std::vector<double>& bounds, double value, HistogramValue* h) {
  h->bucket_counts.resize(bounds.size() + 1, 0);
  const size_t bucket = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  ++h->bucket_counts[bucket];
  h->sum += value;
  ++h->count;
}

std::string EscapeLabelValue(std::string_view value) { return Escape(value, /*quote=*/true); }

std::string EncodePrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", Escape(f.help, /*quote=*/false), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", TypeName(f.type), "\n");
    for (const MetricSample& s : f.samples) {
      if (f.type != MetricType::kHistogram) {
        out += f.name;
        AppendLabels(s.labels, nullptr, &out);
        absl::StrAppend(&out, " ", FormatValue(s.value), "\n");
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= f.bounds.size(); ++i) {
        if (i < s.histogram.bucket_counts.size()) cumulative += s.histogram.bucket_counts[i];
        const std::pair<std::string, std::string> le{
            "le", i < f.bounds.size() ? FormatValue(f.bounds[i]) : "+Inf"};
        absl::StrAppend(&out, f.name, "_bucket");
        AppendLabels(s.labels, &le, &out);
        absl::StrAppend(&out, " ", cumulative, "\n");
      }
      absl::StrAppend(&out, f.name, "_sum");
      AppendLabels(s.labels, nullptr, &out);
      absl::StrAppend(&out, " ", FormatValue(s.histogram.sum), "\n");
      absl::StrAppend(&out, f.name, "_count");
      AppendLabels(s.labels, nullptr, &out);
      absl::StrAppend(&out, " ", s.histogram.count, "\n");
    }
  }
  return out;
}

void MetricsRegistry::Describe(const std::string& name, const std::string& help, MetricType type,
                               std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  if (families_.count(name) > 0) return;
  Family& f = families_[name];
  f.meta.name = name;
  f.meta.help = help;
  f.meta.type = type;
  std::sort(bounds.begin(), bounds.end());
  f.meta.bounds = std::move(bounds);
  order_.push_back(name);
}

MetricSample* MetricsRegistry::Series(const std::string& name, const MetricLabels& labels,
                                      MetricType type) {
  auto it = families_.find(name);
  if (it == families_.end() || it->second.meta.type != type) return nullptr;
  auto [series, inserted] = it->second.series.try_emplace(labels);
  if (inserted) {
    series->second.labels = labels;
    if (type == MetricType::kHistogram) {
      series->second.histogram.bucket_counts.assign(it->second.meta.bounds.size() + 1, 0);
    }
  }
  return &series->second;
}

void MetricsRegistry::Add(const std::string& name, const MetricLabels& labels, double delta) {
  absl::MutexLock lock(&mu_);
  if (MetricSample* s = Series(name, labels, MetricType::kCounter)) s->value += delta;
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  absl::MutexLock lock(&mu_);
  if (MetricSample* s = Series(name, labels, MetricType::kGauge)) s->value = value;
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  absl::MutexLock lock(&mu_);
  MetricSample* s = Series(name, labels, MetricType::kHistogram);
  if (s == nullptr) return;
  ObserveInto(families_[name].meta.bounds, value, &s->histogram);
}

void MetricsRegistry::AddCollector(std::function<void(std::vector<MetricFamily>*)> collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::vector<MetricFamily> MetricsRegistry::Collect() const {
  std::vector<MetricFamily> out;
  std::vector<std::function<void(std::vector<MetricFamily>*)>> collectors;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& name : order_) {
      const Family& f = families_.at(name);
      MetricFamily copy = f.meta;
      for (const auto& [labels, sample] : f.series) copy.samples.push_back(sample);
      out.push_back(std::move(copy));
    }
    collectors = collectors_;
  }
  for (const auto& collect : collectors) collect(&out);
  return out;
}

std::string MetricsRegistry::Encode() const { return EncodePrometheusText(Collect()); }

}  // namespace ballast
