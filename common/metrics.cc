#include "common/metrics.h"

#include <sstream>

#include "prometheus/text_serializer.h"

namespace ballast {

void AddSample(prometheus::MetricFamily* family,
               std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric& sample = family->metric.emplace_back();
  sample.label = std::move(labels);
  if (family->type == prometheus::MetricType::Counter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
}

void MetricsRegistry::AddCollectable(const prometheus::Collectable* collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(collectable);
}

std::vector<prometheus::MetricFamily> MetricsRegistry::Collect() const {
  std::vector<const prometheus::Collectable*> collectables;
  {
    absl::MutexLock lock(&mu_);
    collectables = collectables_;
  }
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  for (const prometheus::Collectable* c : collectables) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return families;
}

std::string MetricsRegistry::Encode() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, Collect());
  return out.str();
}

}  // namespace ballast
