// Metrics registry and the Prometheus text exposition format (version 0.0.4).
//
// A registry holds counters, gauges and histograms by name and label set, and
// collectors: callbacks that add families computed at scrape time (for
// example one gauge per running job), so that series for a job that is gone
// disappear without anyone deleting them. Thread-safe.
#ifndef BALLAST_COMMON_METRICS_H_
#define BALLAST_COMMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ballast {

// Label names and values, in the order they are printed.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

// One series of a histogram: per-bucket counts (not cumulative; one more than
// the bounds, the last being +Inf), their sum and total count.
struct HistogramValue {
  std::vector<uint64_t> bucket_counts;
  double sum = 0;
  uint64_t count = 0;
};

// Counts `value` into `h`, whose bucket_counts has one entry per bound plus
// +Inf. Buckets are "le": a value equal to a bound belongs to it.
void ObserveInto(const std::vector<double>& bounds, double value, HistogramValue* h);

struct MetricSample {
  MetricLabels labels;
  // Counters and gauges.
  double value = 0;
  // Histograms.
  HistogramValue histogram;
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  // Histograms: ascending upper bounds, +Inf excluded.
  std::vector<double> bounds;
  std::vector<MetricSample> samples;
};

// Escapes a label value: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);

// Encodes families as Prometheus text 0.0.4: HELP and TYPE lines, then one
// line per sample; histograms as cumulative _bucket{le=...} lines ending in
// le="+Inf", then _sum and _count.
std::string EncodePrometheusText(const std::vector<MetricFamily>& families);

class MetricsRegistry {
 public:
  // Adds a family; its samples come from Add, Set and Observe. Histograms need
  // ascending bounds. Describing a name twice keeps the first.
  void Describe(const std::string& name, const std::string& help, MetricType type,
                std::vector<double> bounds = {});

  // Counter += delta. The name must have been described as a counter.
  void Add(const std::string& name, const MetricLabels& labels, double delta = 1);
  // Gauge = value.
  void Set(const std::string& name, const MetricLabels& labels, double value);
  // Histogram observation.
  void Observe(const std::string& name, const MetricLabels& labels, double value);

  // Registers a callback that appends families on every Collect. It runs
  // without the registry's lock held, so it may take its own locks.
  void AddCollector(std::function<void(std::vector<MetricFamily>*)> collector);

  // Every described family, then the collectors' families.
  std::vector<MetricFamily> Collect() const;

  // EncodePrometheusText(Collect()).
  std::string Encode() const;

 private:
  struct Family {
    MetricFamily meta;  // name, help, type, bounds; samples unused
    std::map<MetricLabels, MetricSample> series;
  };
  // Returns the series, creating it; nullptr when the name is not described
  // with `type` (a programming error, ignored rather than crashing a server).
  MetricSample* Series(const std::string& name, const MetricLabels& labels, MetricType type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(std::vector<MetricFamily>*)>> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast

#endif  // BALLAST_COMMON_METRICS_H_
