"""Benchmark: what the guard costs a healthy run, and what a rollback costs a
sick one, on the CPU trainer (the model of bench/trainer_vs_peft.py).

1. Overhead: ballast-train with the default guard (spike and collapse
   windows, a snapshot every 10 steps, health-gated checkpoints every 10)
   against the same run with every part of the guard off, alternating for
   ROUNDS rounds; the ratio of median step times. The goal is 1.02x at most.
2. Recovery: the same job, 30 steps, with NaN gradients injected at steps
   25-27 (guard.inject, deterministic, so each is re-run once) and the
   default guard: the newest good snapshot from before step 25 is step 10's. Taken from the
   rank's stderr and metrics.jsonl as they are written: the time from the
   first guard line (the first bad step found) to the end of the first
   applied step after the rollback, and the steps the rollback lost.
Prints one table row per figure.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_jobs import train, write_lora_job  # noqa: E402
from trainer_vs_peft import MBS, SEQ, make_inputs  # noqa: E402

STEPS, WARMUP, ROUNDS = 22, 2, 3
GUARD_OFF = {"max_consecutive_bad": 0, "loss_spike_zscore": 0, "grad_norm_spike_zscore": 0,
             "collapse_window": 0, "snapshot_every": 0, "good_after_steps": 0,
             "rerun_bad_step": False}


def write_job(root, name, guard, steps=STEPS):
    data = {"path": os.path.join(root, "data.jsonl"), "seq_len": SEQ, "micro_batch_size": MBS,
            "shuffle": False}
    return write_lora_job(root, name, os.path.join(root, "model"), data, steps, precision="fp32",
                          checkpoint_every=10, guard=guard)


def step_time(binary, job, out_dir):
    """Median step time after warm-up of one run."""
    times = [m["step_time_s"] for m in train(binary, job, out_dir)]
    return statistics.median(times[WARMUP:])


def metrics_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def recovery(binary, job, out_dir):
    """(seconds from the first guard line to the first applied step after
    the rollback, steps lost) of one run with injected faults."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    err_path = os.path.join(out_dir, "stderr.log")
    with open(err_path, "w") as err:
        proc = subprocess.Popen([binary, "--spec", job, "--out", out_dir],
                                stdout=subprocess.DEVNULL, stderr=err)
        detected = recovered = None
        to_step = lost = None
        while proc.poll() is None or recovered is None:
            now = time.perf_counter()
            with open(err_path) as f:
                text = f.read()
            if detected is None and "ballast-train: guard " in text:
                detected = now
            if to_step is None and "guard rollback at step" in text:
                line = next(ln for ln in text.splitlines() if "guard rollback at step" in ln)
                to_step = int(line.split("rolled back to step ")[1].split()[0])
                lost = int(line.split("guard rollback at step ")[1].split(":")[0]) - to_step
            if to_step is not None and recovered is None:
                lines = metrics_lines(os.path.join(out_dir, "metrics.jsonl"))
                if any(m["step"] == to_step + 1 and not m["skipped"] for m in lines):
                    recovered = now
            if proc.poll() is not None and recovered is None:
                break
            time.sleep(0.002)
        proc.wait()
    if proc.returncode != 0 or recovered is None:
        raise SystemExit(f"the faulty run did not recover:\n{open(err_path).read()[-3000:]}")
    return recovered - detected, lost


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    args = parser.parse_args()
    binary = os.path.join(args.bin, "ballast-train")
    with tempfile.TemporaryDirectory() as root:
        make_inputs(root)
        on = write_job(root, "on", {})
        off = write_job(root, "off", GUARD_OFF)
        faulty = write_job(root, "faulty", {"inject": {"nan_grad_at_step": [25, 26, 27]}},
                           steps=30)
        on_times, off_times = [], []
        for _ in range(ROUNDS):
            on_times.append(step_time(binary, on, os.path.join(root, "out-on")))
            off_times.append(step_time(binary, off, os.path.join(root, "out-off")))
        seconds, lost = recovery(binary, faulty, os.path.join(root, "out-faulty"))
    ratios = [a / b for a, b in zip(on_times, off_times)]
    on_s, off_s = statistics.median(on_times), statistics.median(off_times)
    print(f"guard/overhead qwen3-tiny lora r16 seq512, guard on vs off: {on_s / off_s:.3f}x "
          f"step time ({on_s * 1e3:.0f} vs {off_s * 1e3:.0f} ms; median of {ROUNDS} alternating "
          f"runs, per round {min(ratios):.3f}-{max(ratios):.3f}x; goal <= 1.02x)")
    print(f"guard/recovery NaN at steps 25-27, each re-run: {seconds:.2f} s from the first bad "
          f"step found to the first applied step after the rollback "
          f"({seconds / off_s:.1f} healthy steps), {lost} steps lost")


if __name__ == "__main__":
    main()
