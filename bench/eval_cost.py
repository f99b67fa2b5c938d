"""Benchmark: what a validation pass costs per token, against the training
step it sits between, on the CPU trainer (the model and data of
bench/trainer_vs_peft.py: Qwen3 tiny, LoRA r16, rows of 512 tokens).

One run evaluates a validation set (eval.path, bounded by eval.max_tokens to
two micro-batches) every 2 steps. From its metrics.jsonl: seconds per token
of each evaluation (time_s / tokens) and of each training step
(step_time_s / tokens), medians after the first of each (warm-up). An
evaluation is one forward without a graph, so the ratio is also what a
forward costs against a whole step (forward, backward and the optimizer):
at most 1/2 for LoRA, whose backward needs the activations' gradients
through the frozen weights but not theirs. Prints one table row.
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_jobs import train, write_lora_job  # noqa: E402
from trainer_vs_peft import MBS, SEQ, make_inputs  # noqa: E402

STEPS, EVERY = 12, 2


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        make_inputs(root, "qwen3")
        path = os.path.join(root, "data.jsonl")
        data = {"path": path, "seq_len": SEQ, "micro_batch_size": MBS, "shuffle": False}
        job = write_lora_job(root, "job", os.path.join(root, "model"), data, STEPS,
                             precision="fp32", checkpoint_every=0,
                             eval={"path": path, "every": EVERY, "max_tokens": 2 * MBS * SEQ})
        lines = train(os.path.join(args.bin, "ballast-train"), job, os.path.join(root, "out"))
    steps = [m for m in lines if "eval" not in m]
    evals = [m["eval"] for m in lines if "eval" in m]
    step_s = statistics.median(m["step_time_s"] / m["tokens"] for m in steps[1:])
    eval_s = statistics.median(e["time_s"] / e["tokens"] for e in evals[1:])
    print(f"eval/cost qwen3-tiny lora r16 seq{SEQ} fp32: an evaluation costs "
          f"{eval_s / step_s:.2f}x a training step per token ({1 / eval_s:,.0f} vs "
          f"{1 / step_s:,.0f} tokens/s; medians of {len(evals) - 1} evaluations of "
          f"{evals[-1]['tokens']} tokens and {len(steps) - 1} steps of {steps[-1]['tokens']})")


if __name__ == "__main__":
    main()
