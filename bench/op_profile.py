"""Where a trainer step's time goes: runs bench/trainer_vs_peft.py's job (the
tiny model, LoRA r16, 4 rows of 512, fp32) under `ballast-train --profile`
and sums the trace's ops over the steps after warm-up.

    python3 bench/op_profile.py [--bin build/bin] [--model qwen3|qwen3_5|qwen3_moe]
        [--keep-trace FILE.json]

Prints milliseconds a step and the share of the step for each op, by name and
by name and input shapes. An op's own time excludes the ops it called. The
forward of our custom autograd functions (attention, SwiGLU, RMSNorm, RoPE)
records no op of its own, so its time is in the "not in any op" line with the
step's other time outside ATen (the data, the guard, the optimizer's loops);
their backward nodes are ops (CppNode<...Function>). A profile, not a
benchmark: the profiler's own cost is in the times, so compare shares, not
tokens/s.
"""
import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_vs_peft import MODELS, make_inputs, write_job  # noqa: E402

STEPS, WARMUP = 8, 3
STEP_SCOPE = "ballast::step"  # worker/train/trainer/op_profile.h


def own_times(trace):
    """The steps after warm-up as [(start, end)], and each op event in them
    with its own time (its duration less its children's), in microseconds."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == STEP_SCOPE)
    if len(steps) < STEPS:
        raise SystemExit(f"the trace has {len(steps)} steps of {STEP_SCOPE}, expected {STEPS}")
    steps = steps[WARMUP:]
    ops = [e for e in events if e.get("cat") == "cpu_op"
           and any(b <= e["ts"] < end for b, end in steps)]
    # Nesting is per thread: a parent starts no later and ends no earlier.
    ops.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    stack = []
    for e in ops:
        e["own"] = e["dur"]
        while stack and (stack[-1]["tid"] != e["tid"]
                         or stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]):
            stack.pop()
        if stack:
            stack[-1]["own"] -= e["dur"]
        stack.append(e)
    return steps, ops


def summarise(trace, top):
    steps, ops = own_times(trace)
    n = len(steps)
    step_us = sum(end - b for b, end in steps) / n
    by_name, by_shape = collections.Counter(), collections.Counter()
    for e in ops:
        by_name[e["name"]] += e["own"] / n
        dims = e.get("args", {}).get("Input Dims", "")
        by_shape[(e["name"], json.dumps(dims)[:80])] += e["own"] / n
    print(f"{n} steps after {WARMUP} of warm-up: {step_us / 1e3:.1f} ms a step (profiled)")
    print(f"{'ms/step':>8} {'share':>6}  op")
    for name, us in by_name.most_common(top):
        print(f"{us / 1e3:8.1f} {100 * us / step_us:5.1f}%  {name}")
    outside = step_us - sum(by_name.values())
    print(f"{outside / 1e3:8.1f} {100 * outside / step_us:5.1f}%  (not in any op)")
    print()
    print(f"{'ms/step':>8} {'share':>6}  op [input dims]")
    for (name, dims), us in by_shape.most_common(top):
        print(f"{us / 1e3:8.1f} {100 * us / step_us:5.1f}%  {name} {dims}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--keep-trace", help="also copy the Chrome trace here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        try:
            make_inputs(root, args.model)
        except ImportError as e:
            raise SystemExit(f"{e}: qwen3_5's model is written by transformers 5.x; run this "
                             "script with build/hf5/bin/python")
        job = write_job(root, args.model, STEPS)
        trace_path = os.path.join(root, "trace.json")
        subprocess.run([os.path.join(args.bin, "ballast-train"), "--spec", job, "--out",
                        os.path.join(root, "out"), "--profile", trace_path],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if args.keep_trace:
            shutil.copyfile(trace_path, args.keep_trace)
        with open(trace_path) as f:
            summarise(json.load(f), args.top)


if __name__ == "__main__":
    main()
