"""Benchmark: ZeRO-3 ballast-train at 1, 2 and 4 ranks on CPU (c10d Gloo over
loopback), each figure a ratio to one rank, measured in one run.

Setup: a Qwen3 of 8 layers, hidden 1024, vocab 8192 (110M parameters: 1.8 GB
of fp32 masters, gradients and AdamW moments at N = 1, so that the state and
not LibTorch's own ~0.5 GB dominates a rank's memory), seq 128 (--seq: issue
35 asks for a shape where compute dominates, seq 2048); a full finetune
(every parameter sharded, fp32 masters and AdamW moments); one step is 4
micro-batches of 1 document, so 1, 2 and 4 ranks take 4, 2 and 1 of them.
--model qwen3_moe trains the Mixture-of-Experts of model_config instead:
every rank gathers every expert (issue 32's never-hang rule), so its peak
is the dense figure's pattern with more to gather.
The ranks share this machine's cores (torch threads per rank = cores / N, at
least 1), so tokens/s shows the cost of sharding here, not the speed-up of
N machines.

--hybrid G also runs the largest N as hybrid sharding (N / G replicas of
shard groups of G ranks, sharding.strategy hybrid) against ZeRO-3 at that N.
--expert-parallel (with --model qwen3_moe) also runs the largest N with
moe.expert_parallel N against ZeRO-3 at that N.

Rows:
- peak RSS of the largest rank, and tokens/s of the job, against N = 1;
- the step's timeline on rank 0: the share of a step it spent blocked on
  collectives (StepMetrics.collective_wait_s: communication that compute did
  not hide), at the --prefetch depth asked for (zero3.prefetch);
- bytes one rank sends in collectives per micro-batch, against the ZeRO-3
  figure 3 x parameter bytes x (N - 1) / N (a ring all-gather in forward and
  in backward, a ring reduce-scatter; on Gloo the reduce-scatter is an
  all-to-all, which sends as much). For LoRA the figure would be 2 x all
  parameter bytes + 1 x the adapter's: frozen weights are gathered but never
  reduced.
- with --hybrid: peak RSS and tokens/s against ZeRO-3 at the same N; the
  bytes a rank sends across the replicas per step against the allreduce of
  its fp32 gradient shards, 2 (M - 1) / M x 4 x parameters / G (the
  scale model's comm_step); and its bytes inside the shard group per
  micro-batch against ZeRO-3's figure at N = G.
- with --expert-parallel: peak RSS and tokens/s against ZeRO-3 at the same
  N, and the bytes a rank sends per micro-batch against ZeRO-3's, measured
  both; the experts' share of ZeRO-3's (3 x 4 x expert parameters x
  (N - 1) / N) becomes rows: 4 exchanges of T k H fp32 values per sparse
  layer, those routed to another rank's experts.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

GAS, STEPS, WARMUP = 4, 4, 1


def model_config(model, seq):
    """qwen3: the dense 8 layers above. qwen3_moe: the same attention and
    vocabulary with 8 layers of 8 experts, 2 active per token, of width 512
    (134M parameters, 101M of them experts), so that a rank's share of the
    experts is most of what sharding saves."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=8192, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=64, max_position_embeddings=max(1024, seq),
                  tie_word_embeddings=True)
    if model == "qwen3_moe":
        return Qwen3MoeConfig(**common, intermediate_size=2816, num_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=512,
                              decoder_sparse_step=1, norm_topk_prob=True,
                              router_aux_loss_coef=0.001, output_router_logits=True)
    return Qwen3Config(**common, intermediate_size=2816)


def make_inputs(root, model_name, seq):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(model_name, seq))
    model.save_pretrained(os.path.join(root, "model"))
    numel = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    with open(os.path.join(root, "data.jsonl"), "w") as f:
        for _ in range(GAS * STEPS):
            f.write(json.dumps({"input_ids": torch.randint(0, 8192, (seq,), generator=g).tolist()})
                    + "\n")
    with open(os.path.join(root, "job.json"), "w") as f:
        json.dump({"model": {"path": os.path.join(root, "model")}, "method": "full",
                   "data": {"path": os.path.join(root, "data.jsonl"), "seqLen": seq,
                            "microBatchSize": 1, "gradAccumSteps": GAS, "shuffle": False},
                   "optimizer": {"lr": 1e-4}, "maxSteps": STEPS, "seed": 0}, f)
    return numel


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(binary, root, n, settings, tag=""):
    out = os.path.join(root, f"out-{n}{tag}")
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}
    port = free_port()
    logs = [tempfile.TemporaryFile("w+") for _ in range(n)]
    procs = [subprocess.Popen([binary, "--spec", os.path.join(root, "job.json"), "--out", out,
                               "--set", f"devices={n}", "--rank", str(r), "--world-size", str(n),
                               "--master-port", str(port), *settings], stderr=logs[r], env=env)
             for r in range(n)]
    peak = [0] * n
    while any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            try:
                peak[r] = max(peak[r], psutil.Process(p.pid).memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.01)
    for r, p in enumerate(procs):
        logs[r].seek(0)
        if p.returncode != 0:
            sys.exit(f"rank {r} of {n} failed:\n{logs[r].read()}")
    logs[0].seek(0)
    sent = re.search(r"sent (\d+) bytes in collectives", logs[0].read())
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][WARMUP:]
    tokens_per_s = statistics.median(r["tokens"] / r["step_time_s"] for r in rows)
    per_micro_batch = int(sent.group(1)) / (GAS // n) if sent else 0
    step_s = statistics.median(r["step_time_s"] for r in rows)
    wait_s = statistics.median(r["collective_wait_s"] for r in rows)
    # Per step, from rank 0's metrics: across the replicas, and the rest.
    replica = statistics.median(r["replica_communicated_bytes"] for r in rows)
    in_group = statistics.median(r["communicated_bytes"] for r in rows) - replica
    return max(peak), tokens_per_s, per_micro_batch, step_s, wait_s, replica, in_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--model", choices=["qwen3", "qwen3_moe"], default="qwen3")
    parser.add_argument("--seq", type=int, default=128, help="tokens per micro-batch")
    parser.add_argument("--ranks", default="2,4", help="the world sizes to compare with 1")
    parser.add_argument("--prefetch", type=int, default=1,
                        help="zero3.prefetch: layers gathered ahead of the one computing")
    parser.add_argument("--hybrid", type=int, default=0,
                        help="also run the largest world size as hybrid sharding with shard "
                             "groups of this many ranks")
    parser.add_argument("--expert-parallel", action="store_true",
                        help="also run the largest world size with moe.expert_parallel "
                             "(--model qwen3_moe)")
    args = parser.parse_args()
    if args.expert_parallel and args.model != "qwen3_moe":
        parser.error("--expert-parallel needs --model qwen3_moe")
    if args.prefetch < 1:
        parser.error(f"--prefetch {args.prefetch}: at least 1")
    name = {"qwen3": "qwen3-8L", "qwen3_moe": "qwen3-moe-8L-8x2"}[args.model]
    if args.seq != 128:
        name += f" seq{args.seq}"
    if args.prefetch != 1:
        name += f" prefetch{args.prefetch}"
    settings = ["--set", f"zero3.prefetch={args.prefetch}"]
    sizes = [int(n) for n in args.ranks.split(",")]
    binary = os.path.abspath(os.path.join(args.bin, "ballast-train"))
    root = tempfile.mkdtemp(prefix="ballast-sharded-bench-")
    try:
        numel = make_inputs(root, args.model, args.seq)
        results = {n: run(binary, root, n, settings) for n in [1] + sizes}
        rss1, tps1 = results[1][:2]
        for n in sizes:
            rss, tps = results[n][:2]
            print(f"zero3_cpu/{name} full N={n} vs N=1: {rss / rss1:.2f}x peak RSS per rank "
                  f"({rss / 2**20:.0f} vs {rss1 / 2**20:.0f} MiB), {tps / tps1:.2f}x tokens/s "
                  f"({tps:.0f} vs {tps1:.0f}, {os.cpu_count()} cores shared)")
        for n in sizes:
            sent = results[n][2]
            zero3 = 3 * 4 * numel * (n - 1) / n
            print(f"zero3_cpu/{name} full N={n} bytes sent per rank per micro-batch vs ZeRO-3 "
                  f"3x params x (N-1)/N: {sent / zero3:.2f}x ({sent / 2**20:.1f} vs "
                  f"{zero3 / 2**20:.1f} MiB)")
        for n in sizes:
            step_s, wait_s = results[n][3:5]
            print(f"zero3_cpu/{name} full N={n} rank 0 blocked on collectives: "
                  f"{wait_s / step_s:.2f} of a step ({wait_s:.2f} of {step_s:.2f} s, medians)")
        if args.hybrid:
            n, g = max(sizes), args.hybrid
            m = n // g
            hybrid = ["--set", "sharding.strategy=hybrid", "--set", f"sharding.shard_group={g}"]
            rss, tps, _, _, _, replica, in_group = run(binary, root, n, settings + hybrid, "-hybrid")
            rss_z, tps_z = results[n][:2]
            shape = f"{m}x{g}"
            print(f"hsdp_cpu/{name} full {shape} vs ZeRO-3 N={n}: {rss / rss_z:.2f}x peak RSS per "
                  f"rank ({rss / 2**20:.0f} vs {rss_z / 2**20:.0f} MiB), {tps / tps_z:.2f}x "
                  f"tokens/s ({tps:.0f} vs {tps_z:.0f}, {os.cpu_count()} cores shared)")
            step = 2 * (m - 1) / m * 4 * numel / g
            print(f"hsdp_cpu/{name} full {shape} bytes across the replicas per rank per step vs "
                  f"2(M-1)/M x 4 x params / G: {replica / step:.3f}x ({replica / 2**20:.1f} vs "
                  f"{step / 2**20:.1f} MiB)")
            zero3 = 3 * 4 * numel * (g - 1) / g
            in_group /= GAS // n
            print(f"hsdp_cpu/{name} full {shape} bytes inside the shard group per rank per "
                  f"micro-batch vs ZeRO-3 3x params x (G-1)/G: {in_group / zero3:.2f}x "
                  f"({in_group / 2**20:.1f} vs {zero3 / 2**20:.1f} MiB)")
        if args.expert_parallel:
            n = max(sizes)
            ep = ["--set", f"moe.expert_parallel={n}"]
            rss, tps, sent = run(binary, root, n, settings + ep, "-ep")[:3]
            rss_z, tps_z, sent_z = results[n][:3]
            print(f"ep_cpu/{name} full N={n} moe.expert_parallel vs ZeRO-3 N={n}: "
                  f"{rss / rss_z:.2f}x peak RSS per rank ({rss / 2**20:.0f} vs "
                  f"{rss_z / 2**20:.0f} MiB), {tps / tps_z:.2f}x tokens/s ({tps:.0f} vs "
                  f"{tps_z:.0f}, {os.cpu_count()} cores shared)")
            print(f"ep_cpu/{name} full N={n} moe.expert_parallel bytes sent per rank per "
                  f"micro-batch vs ZeRO-3 N={n}: {sent / sent_z:.2f}x ({sent / 2**20:.1f} vs "
                  f"{sent_z / 2**20:.1f} MiB)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
