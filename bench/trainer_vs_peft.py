"""Benchmark: ballast-train against transformers + peft on the same tiny
model, data and optimizer, on CPU, measured side by side in one run.

Setup (issue 3): 4 layers, hidden 256, 8 heads, vocab 4096, seq 512, LoRA r=16
all-linear, fp32, AdamW. --model qwen3 (the default), qwen3_5, the hybrid of
bench/train_jobs.py, whose reference runs under transformers 5.x (the venv
build/hf5) with transformers' torch fallback of the gated delta rule and the
conv, which is what users without fla and causal-conv1d train with, or
qwen3_moe, 16 experts top-4 against transformers 4.x's Qwen3MoeSparseMoeBlock
(a loop over experts), LoRA on attention and every expert but not the router
on both sides, with the load-balancing loss on both sides. Each side runs as its own process; tokens/s is taken
over the steps after warm-up, peak RSS by polling the process every 10 ms.
The sides alternate for ROUNDS rounds and each reports its median, because a
single 10-step run on these shared machines varies by +-10%.
Prints one table row per figure as a ratio against the baseline.
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
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from reference import run_measuring_rss  # noqa: E402
from train_jobs import (LINEAR_BUT_ROUTER, save_qwen3_5_tiny, save_qwen3_moe_tiny,  # noqa: E402
                        save_qwen3_tiny, write_lora_job)

MODELS = {"qwen3": save_qwen3_tiny, "qwen3_5": save_qwen3_5_tiny, "qwen3_moe": save_qwen3_moe_tiny}
HF5_PYTHON = os.path.join(HERE, "..", "build", "hf5", "bin", "python")

SEQ, MBS, STEPS, WARMUP, ROUNDS = 512, 4, 12, 2, 3


def make_inputs(root, model="qwen3"):
    import torch

    MODELS[model](os.path.join(root, "model"))
    g = torch.Generator().manual_seed(1)
    with open(os.path.join(root, "data.jsonl"), "w") as f:
        for _ in range(MBS * STEPS):
            f.write(json.dumps({"input_ids": torch.randint(0, 4096, (SEQ,), generator=g).tolist()})
                    + "\n")


def target_modules(model):
    """LoRA's targets as PEFT takes them ("all-linear" is a string there)."""
    return LINEAR_BUT_ROUTER if model == "qwen3_moe" else "all-linear"


def run_reference(root, model_name):
    """transformers + peft + torch.optim.AdamW, batched [MBS, SEQ] as HF Trainer runs it."""
    # fla, when installed, replaces transformers' torch path of the gated
    # delta rule with Triton kernels that need a GPU; on CPU the torch path is
    # the baseline.
    sys.modules.setdefault("fla", None)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(os.path.join(root, "model")),
                           LoraConfig(r=16, lora_alpha=32, target_modules=target_modules(model_name),
                                      task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rows = [json.loads(line)["input_ids"] for line in open(os.path.join(root, "data.jsonl"))]
    times = []
    for step in range(STEPS):
        batch = torch.tensor(rows[step * MBS:(step + 1) * MBS])
        start = time.perf_counter()
        out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    print(json.dumps({"step_time_s": times}))


def write_job(root, model, steps):
    """The job ballast-train runs on the inputs in root: the reference's LoRA,
    batch and optimizer, in fp32; returns its path."""
    targets = target_modules(model)
    return write_lora_job(root, "job", os.path.join(root, "model"),
                          {"path": os.path.join(root, "data.jsonl"), "seq_len": SEQ,
                           "micro_batch_size": MBS, "shuffle": False}, steps,
                          target_modules=([targets] if isinstance(targets, str) else targets),
                          precision="fp32")


def tokens_per_s(step_times):
    """Tokens per second over the steps after warm-up."""
    return MBS * SEQ / (sum(step_times[WARMUP:]) / (STEPS - WARMUP))


def measure(cmd):
    """Runs cmd, polling its RSS; returns (stdout, peak RSS in bytes)."""
    code, out, err, peak = run_measuring_rss(cmd)
    if code != 0:
        raise SystemExit(f"{cmd[0]} failed:\n{err}")
    return out, peak


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3")
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument("--make-inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_inputs:
        make_inputs(args.make_inputs, args.model)
        return
    if args.reference:
        run_reference(args.reference, args.model)
        return

    with tempfile.TemporaryDirectory() as root:
        python = HF5_PYTHON if args.model == "qwen3_5" else sys.executable
        if python != sys.executable:  # the model is written by transformers 5.x too
            subprocess.run([python, __file__, "--make-inputs", root, "--model", args.model],
                           check=True)
        else:
            make_inputs(root, args.model)
        job = write_job(root, args.model, STEPS)
        ours_tps, ours_rss, ref_tps, ref_rss = [], [], [], []
        for _ in range(ROUNDS):
            out_dir = os.path.join(root, "out")
            shutil.rmtree(out_dir, ignore_errors=True)
            _, rss = measure([os.path.join(args.bin, "ballast-train"), "--spec", job, "--out",
                              out_dir])
            with open(os.path.join(out_dir, "metrics.jsonl")) as f:
                ours_tps.append(tokens_per_s([json.loads(line)["step_time_s"] for line in f]))
            ours_rss.append(rss)
            out, rss = measure([python, __file__, "--reference", root, "--model", args.model])
            ref_tps.append(tokens_per_s(json.loads(out)["step_time_s"]))
            ref_rss.append(rss)

    # Each round's own ratio shows how much the machine moved during the run.
    round_ratios = [o / r for o, r in zip(ours_tps, ref_tps)]
    ours_tps, ref_tps = statistics.median(ours_tps), statistics.median(ref_tps)
    ours_rss, ref_rss = statistics.median(ours_rss), statistics.median(ref_rss)
    name = (f"trainer_cpu/{args.model.replace('_', '.')}-tiny lora r16 seq512 vs "
            f"transformers {'5.x' if args.model == 'qwen3_5' else '4.x'}+peft")
    print(f"{name}: {ours_tps / ref_tps:.2f}x tokens/s ({ours_tps:.0f} vs {ref_tps:.0f}), "
          f"{ours_rss / ref_rss:.2f}x peak RSS ({ours_rss / 2**20:.0f} vs {ref_rss / 2**20:.0f} MiB) "
          f"(median of {ROUNDS} alternating runs; per round "
          f"{min(round_ratios):.2f}-{max(round_ratios):.2f}x)")


if __name__ == "__main__":
    main()
