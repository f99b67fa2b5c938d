#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace ballast {
namespace {

using ::testing::HasSubstr;

TEST(Metrics, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  MetricsRegistry r;
  r.Describe("ballast_x", "Help with \\ and\nnewline.", MetricType::kGauge);
  r.Set("ballast_x", {{"job", "we\"ird\n"}}, 1);
  EXPECT_EQ(r.Encode(),
            "# HELP ballast_x Help with \\\\ and\\nnewline.\n"
            "# TYPE ballast_x gauge\n"
            "ballast_x{job=\"we\\\"ird\\n\"} 1\n");
}

TEST(Metrics, CountersAddAndGaugesSetPerLabelSet) {
  MetricsRegistry r;
  r.Describe("ballast_requests_total", "Calls.", MetricType::kCounter);
  r.Add("ballast_requests_total", {{"method", "Get"}, {"code", "OK"}});
  r.Add("ballast_requests_total", {{"method", "Get"}, {"code", "OK"}}, 2);
  r.Add("ballast_requests_total", {{"method", "Put"}, {"code", "OK"}});
  r.Describe("ballast_loss", "Loss.", MetricType::kGauge);
  r.Set("ballast_loss", {}, 0.25);
  r.Set("ballast_loss", {}, std::numeric_limits<double>::quiet_NaN());
  const std::string text = r.Encode();
  EXPECT_THAT(text, HasSubstr("# TYPE ballast_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("ballast_requests_total{method=\"Get\",code=\"OK\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("ballast_requests_total{method=\"Put\",code=\"OK\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_loss NaN\n"));
}

TEST(Metrics, HistogramHasCumulativeBucketsInfSumAndCount) {
  MetricsRegistry r;
  r.Describe("ballast_seconds", "Latency.", MetricType::kHistogram, {0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) r.Observe("ballast_seconds", {{"op", "x"}}, v);
  EXPECT_EQ(r.Encode(),
            "# HELP ballast_seconds Latency.\n"
            "# TYPE ballast_seconds histogram\n"
            "ballast_seconds_bucket{op=\"x\",le=\"0.1\"} 2\n"
            "ballast_seconds_bucket{op=\"x\",le=\"1\"} 3\n"
            "ballast_seconds_bucket{op=\"x\",le=\"+Inf\"} 4\n"
            "ballast_seconds_sum{op=\"x\"} 3.65\n"
            "ballast_seconds_count{op=\"x\"} 4\n");
}

TEST(Metrics, WrongTypeOrUndescribedNameIsIgnored) {
  MetricsRegistry r;
  r.Describe("ballast_g", "G.", MetricType::kGauge);
  r.Add("ballast_g", {}, 5);        // a counter call on a gauge
  r.Set("ballast_unknown", {}, 1);  // never described
  EXPECT_EQ(r.Encode(), "# HELP ballast_g G.\n# TYPE ballast_g gauge\n");
}

TEST(Metrics, CollectorFamiliesFollowTheRegisteredOnes) {
  MetricsRegistry r;
  r.Describe("ballast_a", "A.", MetricType::kGauge);
  r.AddCollector([](std::vector<MetricFamily>* out) {
    MetricFamily f;
    f.name = "ballast_b";
    f.help = "B.";
    f.samples.push_back(MetricSample{{{"state", "x"}}, 7, {}});
    out->push_back(f);
  });
  EXPECT_EQ(r.Encode(),
            "# HELP ballast_a A.\n# TYPE ballast_a gauge\n"
            "# HELP ballast_b B.\n# TYPE ballast_b gauge\nballast_b{state=\"x\"} 7\n");
}

}  // namespace
}  // namespace ballast
