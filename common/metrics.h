// MetricsRegistry: a process's metrics, as Prometheus scrapes them from
// GET /metrics (common/http_endpoint.h), on prometheus-cpp.
//
// It holds a prometheus::Registry, where the counters, gauges and histograms
// that code updates as things happen live (Family<Counter>, Family<Gauge>,
// Family<Histogram>; a hot path holds the Counter& or Histogram& it updates),
// and the Collectables whose series are computed at scrape time (one per
// running job, per rank, per worker state), so that a finished job's series
// disappear without anyone deleting them.
//
// prometheus-cpp-pull's Exposer would serve both, but only on a port of its
// own: /metrics shares ballastd's HTTP port with the dashboard, the bearer
// token check and TLS (HttpEndpoint), so Encode serializes for that endpoint
// instead.
//
// Thread-safe.
#ifndef BALLAST_COMMON_METRICS_H_
#define BALLAST_COMMON_METRICS_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace ballast {

// The Content-Type of the text exposition format that Encode writes.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// For a Collectable's families: appends a sample of `value` to `family`, as
// a counter's or a gauge's by the family's type, with `labels` in order.
void AddSample(prometheus::MetricFamily* family,
               std::vector<prometheus::ClientMetric::Label> labels, double value);

class MetricsRegistry {
 public:
  // Where counters, gauges and histograms are made (prometheus::BuildCounter()
  // ... .Register(registry())).
  prometheus::Registry& registry() { return registry_; }

  // `collectable` is read on every Collect, with no lock of this registry
  // held, so it may take its own. It must outlive the last Collect.
  void AddCollectable(const prometheus::Collectable* collectable) ABSL_LOCKS_EXCLUDED(mu_);

  // The registry's families, then each collectable's in the order added.
  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

  // Collect() in the Prometheus text format 0.0.4 (prometheus::TextSerializer).
  std::string Encode() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Registry registry_;
  mutable absl::Mutex mu_;
  std::vector<const prometheus::Collectable*> collectables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast

#endif  // BALLAST_COMMON_METRICS_H_
