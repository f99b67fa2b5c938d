"""Benchmark: the tasks of issue 17 on the CPU trainer, on the model of
bench/data_pipeline.py (4 layers, hidden 256, vocabulary 4096, with a ChatML
tokenizer trained there).

1. Reranker: listwise LoRA training throughput in groups per second (the
   step's groups over its median time), groups of a positive and 7
   negatives of a few hundred characters, packed into rows of 1024 tokens.
2. Block diffusion against plain SFT on the same model and chats, packed
   into rows of 1024, alternating for ROUNDS rounds: tokens per second of
   each (block diffusion's rows hold [x_t ; x_0], each document twice) and
   the ratio of step time per document token. Goal: at most 2x, the token
   count's.
3. Long context: one LoRA step with gradient checkpointing at 32k, 64k and
   128k tokens in one document, on the one-layer, one-head Qwen3 of
   tests/parity/test_long_context.py: step time and peak RSS, whose growth
   should be linear in T (about 4x from 32k to 128k), never quadratic.
Prints one table row per figure.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from data_pipeline import make_job_inputs  # noqa: E402  (also puts tests/parity on the path)
from train_jobs import train, write_lora_job  # noqa: E402
from trained_tokenizers import WORDS, random_text  # noqa: E402

STEPS, WARMUP, ROUNDS = 10, 2, 2


def write_job(root, name, model, data, **task):
    return write_lora_job(root, name, model,
                          {"path": data, "seq_len": 1024, "micro_batch_size": 2, "packing": True,
                           "truncate": "drop", "shuffle": False}, STEPS, **task)


def run(binary, job, out_dir):
    """Median step time after warm-up, and the median step's metrics."""
    steps = train(binary, job, out_dir)[WARMUP:]
    return (statistics.median(s["step_time_s"] for s in steps),
            statistics.median(s["tokens"] for s in steps),
            statistics.median(s["supervised_tokens"] for s in steps))


def reranker_row(binary, root, model):
    rng = random.Random(3)
    groups = os.path.join(root, "groups.jsonl")
    with open(groups, "w") as f:
        for _ in range(200):
            def doc(words):
                return " ".join(rng.choice(WORDS) for _ in range(words))
            f.write(json.dumps({"query": doc(8), "positive": doc(25),
                                "negative": [doc(25) for _ in range(7)]}) + "\n")
    job = write_job(root, "reranker", model, groups, task="generative_reranker",
                    reranker={"yes_token": "y", "no_token": "n"})
    with open(job) as f:
        text = f.read().replace("truncate: drop", "truncate: cut")
    with open(job, "w") as f:
        f.write(text)
    seconds, tokens, groups_per_step = run(binary, job, os.path.join(root, "out-reranker"))
    return (f"reranker, listwise LoRA, groups of up to 8 candidates: {groups_per_step / seconds:.1f} "
            f"groups/s ({groups_per_step:.0f} groups, {tokens:.0f} tokens a step, "
            f"{seconds:.3f} s median)")


def diffusion_row(binary, root, model, chats):
    sft = write_job(root, "sft", model, chats, task="causal_lm")
    diffusion = write_job(root, "diffusion", model, chats, task="block_diffusion",
                          block_diffusion={"block_length": 4, "mask_token_id": 4095})
    for job in (sft, diffusion):  # the chats have no tokenizer_config.json to name it
        with open(job) as f:
            text = f.read().replace("packing: true", "packing: true\n  template: chatml")
        with open(job, "w") as f:
            f.write(text)
    sft_runs, diffusion_runs = [], []
    for _ in range(ROUNDS):
        sft_runs.append(run(binary, sft, os.path.join(root, "out-sft")))
        diffusion_runs.append(run(binary, diffusion, os.path.join(root, "out-diffusion")))
    sft_s = statistics.median(r[0] for r in sft_runs)
    sft_tokens = statistics.median(r[1] for r in sft_runs)
    bd_s = statistics.median(r[0] for r in diffusion_runs)
    bd_tokens = statistics.median(r[1] for r in diffusion_runs)
    # Per document token: block diffusion's rows hold each document twice.
    ratio = (bd_s / (bd_tokens / 2)) / (sft_s / sft_tokens)
    return (f"block diffusion vs SFT, rows of 1024: {bd_tokens / bd_s:,.0f} vs "
            f"{sft_tokens / sft_s:,.0f} tokens/s; time per document token {ratio:.2f}x "
            f"(goal <= 2x, the token count's)")


def long_context_row(binary, root):
    from test_long_context import make_long_model
    model = os.path.join(root, "long-model")
    make_long_model(model)
    rng = random.Random(9)
    figures = []
    for tokens in (32768, 65536, 131072):
        data = os.path.join(root, f"long-{tokens}.jsonl")
        with open(data, "w") as f:
            f.write(json.dumps({"input_ids": [rng.randrange(320) for _ in range(tokens)]}) + "\n")
        job = write_job(root, f"long-{tokens}", model, data, gradient_checkpointing=True)
        with open(job) as f:
            text = f.read().replace("seq_len: 1024", f"seq_len: {tokens}").replace(
                "micro_batch_size: 2", "micro_batch_size: 1").replace(
                    f"max_steps: {STEPS}", "max_steps: 1")
        with open(job, "w") as f:
            f.write(text)
        step = train(binary, job, os.path.join(root, f"out-long-{tokens}"))[0]
        figures.append((tokens, step["step_time_s"], step["peak_memory_bytes"]))
    parts = [f"{t // 1024}k {s:.1f} s {m / 2**20:,.0f} MiB" for t, s, m in figures]
    return (f"long context, one step, 1-layer Qwen3 with checkpointing: {'; '.join(parts)}; "
            f"peak RSS 128k/32k {figures[-1][2] / figures[0][2]:.2f}x (O(T) would be 4x or less)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    binary = os.path.join(args.bin, "ballast-train")
    root = tempfile.mkdtemp(prefix="ballast-tasks-bench-")
    try:
        model, chats = make_job_inputs(root)
        print(reranker_row(binary, root, model), flush=True)
        print(diffusion_row(binary, root, model, chats), flush=True)
        print(long_context_row(binary, root), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
