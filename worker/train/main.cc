// ballast-train: one rank of a Ballast job, or a standalone run with --spec.
#include <CLI/CLI.hpp>
#include <iostream>

#include "common/version.h"
#include "worker/train/device_info.h"

int main(int argc, char** argv) {
  CLI::App app{"ballast-train: run one finetuning job (LoRA or full) on LibTorch"};
  std::string spec_path;
  std::string out_dir;
  app.set_version_flag("--version", [] {
    return ballast::VersionLine("ballast-train") + "\n" + ballast::train::DescribeBackends();
  });
  app.add_option("--spec", spec_path, "Job spec YAML (see README: Job spec)")->required();
  app.add_option("--out", out_dir, "Run directory: metrics.jsonl, checkpoints/, adapter/ or model/")
      ->required();
  CLI11_PARSE(app, argc, argv);

  std::cerr << "ballast-train: standalone training is not implemented yet in this build\n";
  return 1;
}
