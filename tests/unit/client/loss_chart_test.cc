#include "client/loss_chart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

namespace ballast::client {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

v1::JobEvent Step(int64_t step, double loss, double grad_norm, bool skipped = false,
                  int attempt = 1) {
  v1::JobEvent e;
  e.set_attempt(attempt);
  v1::StepMetrics* m = e.mutable_training()->mutable_step_metrics();
  m->set_step(step);
  if (!std::isnan(loss)) m->set_loss(loss);
  m->set_grad_norm(grad_norm);
  m->set_skipped(skipped);
  return e;
}

v1::JobEvent Rollback(int64_t step, int64_t to_step) {
  v1::JobEvent e;
  v1::GuardEvent* g = e.mutable_training()->mutable_guard();
  g->set_kind(v1::GuardEvent::KIND_ROLLBACK);
  g->set_step(step);
  g->set_to_step(to_step);
  return e;
}

TEST(LossChart, DrawsEachRunAsItsOwnLineAndMarksSkipsAndRollbacks) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LossChart chart("job-1 <tiny> & co");
  for (int s = 1; s <= 7; ++s) {
    // Step 5 and 6 are bad (skipped, NaN grad_norm); step 3 has no loss.
    const bool bad = s == 5 || s == 6;
    chart.Add(Step(s, s == 3 ? nan : 5.0 - 0.1 * s, bad ? nan : 1.0 + s, bad));
  }
  chart.Add(Rollback(7, 4));
  for (int s = 5; s <= 10; ++s) chart.Add(Step(s, 4.5 - 0.1 * s, 0.5 * s));
  v1::JobEvent log;
  log.mutable_training()->mutable_log()->set_text("ignored");
  chart.Add(log);

  EXPECT_EQ(chart.steps(), 13);
  EXPECT_EQ(chart.rollbacks(), 1);
  const std::string svg = chart.Svg();
  EXPECT_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
  EXPECT_THAT(svg, HasSubstr(">job-1 &lt;tiny&gt; &amp; co</text>"));
  // Loss: 1-2, 4 (3 has no loss), 7 (5, 6 skipped), then the re-run 5-10.
  EXPECT_EQ(Count(svg, "<polyline class=\"loss\""), 4);
  // grad_norm: 1-4, 7, then 5-10.
  EXPECT_EQ(Count(svg, "<polyline class=\"grad_norm\""), 3);
  EXPECT_EQ(Count(svg, "<circle class=\"skipped\""), 4);  // two steps, two panels
  EXPECT_EQ(Count(svg, "<g class=\"rollback\">"), 1);
  EXPECT_THAT(svg, HasSubstr(">rollback to 4</text>"));
  // The first step sits on the left edge of the plot, the last on the right.
  EXPECT_THAT(svg, HasSubstr("points=\"80.0,"));
  EXPECT_THAT(svg, HasSubstr("936.0,"));
  EXPECT_EQ(svg, chart.Svg());
}

TEST(LossChart, ANewAttemptStartsANewLineAndNoStepsStillDraw) {
  LossChart empty("nothing yet");
  EXPECT_THAT(empty.Svg(), HasSubstr("grad_norm (log scale)"));
  EXPECT_EQ(Count(empty.Svg(), "<polyline"), 0);

  LossChart chart("restarted");
  chart.Add(Step(1, 3.0, 1.0, false, 1));
  chart.Add(Step(2, 2.9, 1.0, false, 1));
  chart.Add(Step(3, 2.8, 1.0, false, 2));  // a restart resumed at step 3
  chart.Add(Step(4, 2.7, 1.0, false, 2));
  EXPECT_EQ(Count(chart.Svg(), "<polyline class=\"loss\""), 2);
}

v1::JobEvent Eval(int64_t step, std::optional<double> loss) {
  v1::JobEvent e;
  v1::EvalReport* r = e.mutable_training()->mutable_eval();
  r->set_step(step);
  if (loss) r->set_loss(*loss);
  return e;
}

TEST(LossChart, EvalLossIsALineOfMarkedPointsOnTheLossPanel) {
  LossChart chart("evaluated");
  chart.Add(Eval(0, 3.2));  // before the first step: the x axis starts at 0
  for (int s = 1; s <= 4; ++s) chart.Add(Step(s, 3.0 - 0.1 * s, 1.0));
  chart.Add(Eval(2, 3.0));
  chart.Add(Eval(4, 5.0));           // above every training loss: the axis covers it
  chart.Add(Eval(4, std::nullopt));  // a reranker's, without a loss
  EXPECT_EQ(chart.evals(), 3);
  const std::string svg = chart.Svg();
  EXPECT_EQ(Count(svg, "<polyline class=\"eval_loss\""), 1);
  EXPECT_EQ(Count(svg, "<circle class=\"eval_loss\""), 3);
  EXPECT_THAT(svg, HasSubstr("<title>eval_loss 5 at step 4</title>"));
  EXPECT_THAT(svg, HasSubstr("loss, and eval_loss (dots)"));
  // Step 0 sits on the left edge; eval_loss 5.0, the top value, near the top
  // of the loss panel (48, plus the 5% padding of the range).
  EXPECT_THAT(svg, HasSubstr("<circle class=\"eval_loss\" cx=\"80.0\""));
  EXPECT_THAT(svg, HasSubstr("cx=\"936.0\" cy=\"59.8\""));
  // Without evaluations the chart is as before.
  LossChart plain("plain");
  plain.Add(Step(1, 3.0, 1.0));
  EXPECT_EQ(Count(plain.Svg(), "eval_loss"), 0);
}

v1::JobEvent Ranking(int64_t step, double mrr, double ndcg) {
  v1::JobEvent e;
  v1::EvalReport* r = e.mutable_training()->mutable_eval();
  r->set_step(step);
  r->set_groups(16);
  r->set_mrr_at_10(mrr);
  r->set_ndcg_at_10(ndcg);
  return e;
}

TEST(LossChart, ARerankersRankingIsAThirdPanelOfTwoMarkedLines) {
  LossChart chart("reranker");
  chart.Add(Ranking(0, 0.5, 0.6));
  for (int s = 1; s <= 4; ++s) chart.Add(Step(s, 1.0 - 0.1 * s, 1.0));
  chart.Add(Ranking(2, 0.75, 0.8));
  chart.Add(Rollback(4, 2));
  chart.Add(Ranking(4, 1.0, 1.0));
  EXPECT_EQ(chart.rankings(), 3);
  EXPECT_EQ(chart.evals(), 0);
  const std::string svg = chart.Svg();
  // Three panels: 48 + 3 x 260 + 2 x 56 + 48 high.
  EXPECT_THAT(svg, HasSubstr("height=\"988.0\""));
  EXPECT_THAT(svg, HasSubstr("held-out ranking: MRR@10, and NDCG@10 (dashed)"));
  EXPECT_EQ(Count(svg, "<polyline class=\"mrr_at_10\""), 1);
  EXPECT_EQ(Count(svg, "<circle class=\"mrr_at_10\""), 3);
  EXPECT_EQ(Count(svg, "<polyline class=\"ndcg_at_10\""), 1);
  EXPECT_EQ(Count(svg, "<circle class=\"ndcg_at_10\""), 3);
  // The panel runs from 0 (its bottom, 680 + 260) to 1 (its top, 680): MRR
  // 1.0 at step 4 on the right edge, 0.5 at step 0 halfway, on the left.
  EXPECT_THAT(svg, HasSubstr("<circle class=\"mrr_at_10\" cx=\"936.0\" cy=\"680.0\""));
  EXPECT_THAT(svg, HasSubstr("<circle class=\"mrr_at_10\" cx=\"80.0\" cy=\"810.0\""));
  EXPECT_THAT(svg, HasSubstr("<title>ndcg_at_10 0.8 at step 2</title>"));
  // The rollback's line crosses all three panels.
  EXPECT_THAT(svg, HasSubstr("y1=\"48.0\" y2=\"940.0\""));
  EXPECT_EQ(Count(svg, "eval_loss"), 0);
}

}  // namespace
}  // namespace ballast::client
