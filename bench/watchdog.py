"""Benchmark: what the progress watchdog costs a healthy run's steps, on the
CPU trainer (the model of bench/trainer_vs_peft.py), in a two-rank ZeRO-3
run (`ballast-train --nproc 2`, Gloo), where every part of it is on the step's
path: the phase marks (worker/train/collectives/step_phase.h: a lock and a
clock read at each move, per layer and per collective), and the after-step
all-reduce that now carries each rank's own step time besides the stop flag.
(The rank channel's reporter reads the phase every 100 ms from its own
thread and sends nothing while the steps move; ballastd's stall check is off
the ranks altogether.)

The watchdog has no switch, so the comparison is against ballast-train built
from the commit before it (--baseline), alternating for --rounds rounds; the
ratio of median step times. The goal is 1.01x at most. Prints one table row.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_jobs import write_lora_job  # noqa: E402
from trainer_vs_peft import MBS, SEQ, make_inputs  # noqa: E402

STEPS, WARMUP = 22, 2


def step_time(binary, job, out_dir):
    """Median step time after warm-up of one two-rank run (rank 0's
    metrics.jsonl: every rank's step takes the same wall time)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    subprocess.run([binary, "--spec", job, "--out", out_dir, "--nproc", "2"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        times = [json.loads(line)["step_time_s"] for line in f]
    return statistics.median(times[WARMUP:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    parser.add_argument("--baseline", required=True,
                        help="ballast-train built from the commit before the watchdog")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating pairs of runs (single runs vary by +-15%%)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    binary = os.path.join(args.bin, "ballast-train")
    with tempfile.TemporaryDirectory() as root:
        make_inputs(root, "qwen3")
        # Two micro-batches a step, one a rank.
        data = {"path": os.path.join(root, "data.jsonl"), "seq_len": SEQ, "micro_batch_size": MBS,
                "grad_accum_steps": 2, "shuffle": False}
        job = write_lora_job(root, "job", os.path.join(root, "model"), data, STEPS,
                             precision="fp32", devices=2, checkpoint_every=0)
        on_times, off_times = [], []
        for _ in range(args.rounds):
            on_times.append(step_time(binary, job, os.path.join(root, "out-on")))
            off_times.append(step_time(args.baseline, job, os.path.join(root, "out-off")))
    ratios = [a / b for a, b in zip(on_times, off_times)]
    on_s, off_s = statistics.median(on_times), statistics.median(off_times)
    print(f"watchdog/overhead qwen3-tiny lora r16 seq{SEQ}, 2 ranks (ZeRO-3, Gloo), with the "
          f"watchdog vs before it: {on_s / off_s:.3f}x step time ({on_s * 1e3:.0f} vs "
          f"{off_s * 1e3:.0f} ms; median of {args.rounds} alternating runs, per round "
          f"{min(ratios):.3f}-{max(ratios):.3f}x; goal <= 1.01x)")


if __name__ == "__main__":
    main()
