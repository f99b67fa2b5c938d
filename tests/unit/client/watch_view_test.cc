#include "client/watch_view.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace ballast::client {
namespace {

using ::testing::HasSubstr;

v1::JobEvent Step(int64_t step, double grad_norm) {
  v1::JobEvent e;
  v1::StepMetrics* m = e.mutable_training()->mutable_step_metrics();
  m->set_step(step);
  m->set_max_steps(10);
  m->set_loss(1.5);
  m->set_supervised_tokens(10);
  m->set_grad_norm(grad_norm);
  m->set_lr(1e-4);
  m->set_tokens_per_s(100);
  m->set_step_time_s(1);
  return e;
}

v1::JobEvent Checkpoint(int64_t step) {
  v1::JobEvent e;
  e.mutable_training()->mutable_checkpoint_saved()->set_step(step);
  e.mutable_training()->mutable_checkpoint_saved()->set_path("/ckpt");
  return e;
}

TEST(WatchView, WithoutATerminalPrintsOneLinePerStepAndNoEscapes) {
  std::ostringstream out, err;
  WatchView view(&out, &err, /*tty=*/false);
  view.OnEvent(Step(1, 1.0));
  view.OnEvent(Checkpoint(1));
  view.OnEvent(Step(2, 2.0));
  view.Finish();
  EXPECT_EQ(out.str(),
            "step 1/10 loss 1.5000 grad_norm 1 lr 1.0e-04 tok/s 100 ETA 9s\n"
            "checkpoint step 1: /ckpt\n"
            "step 2/10 loss 1.5000 grad_norm 2 lr 1.0e-04 tok/s 100 ETA 8s\n");
}

TEST(WatchView, OnATerminalRedrawsOneLineAndPrintsEventsAboveIt) {
  std::ostringstream out, err;
  WatchView view(&out, &err, /*tty=*/true);
  view.OnEvent(Step(1, 1.0));
  view.OnEvent(Step(2, 2.0));
  view.OnEvent(Checkpoint(2));
  view.Notice("lost the event stream");
  view.Finish();
  const std::string clear = "\r\033[K";
  EXPECT_EQ(out.str(),
            clear + "step 1/10 loss 1.5000 grad_norm 1 lr 1.0e-04 tok/s 100 ETA 9s ▄" +  //
                clear + "step 2/10 loss 1.5000 grad_norm 2 lr 1.0e-04 tok/s 100 ETA 8s ▁█" + clear +
                "checkpoint step 2: /ckpt\n" +  //
                clear + "step 2/10 loss 1.5000 grad_norm 2 lr 1.0e-04 tok/s 100 ETA 8s ▁█" + clear +
                clear + "step 2/10 loss 1.5000 grad_norm 2 lr 1.0e-04 tok/s 100 ETA 8s ▁█" + "\n");
  EXPECT_EQ(err.str(), "ballast: lost the event stream\n");
}

TEST(WatchView, TheLiveLineFitsTheTerminalWidth) {
  std::ostringstream out, err;
  WatchView view(&out, &err, /*tty=*/true, /*columns=*/11);
  view.OnEvent(Step(1, 1.0));
  EXPECT_EQ(out.str(), "\r\033[Kstep 1/10 ");
}

TEST(WatchView, SparklineKeepsTheLastTwentySteps) {
  std::ostringstream out, err;
  WatchView view(&out, &err, /*tty=*/true);
  for (int step = 1; step <= 25; ++step) view.OnEvent(Step(step, step));
  view.Finish();
  const std::string text = out.str();
  const std::string last = text.substr(text.rfind("step 25/"));
  // Steps 6..25 rise evenly: 20 bars from ▁ to █.
  EXPECT_THAT(last, HasSubstr("ETA 0s ▁▁▂▂▂▃▃▄▄▄▅▅▅▆▆▇▇▇██\n"));
}

}  // namespace
}  // namespace ballast::client
