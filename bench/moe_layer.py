"""Benchmark: the Mixture-of-Experts layer on CPU, forward and backward,
against transformers 4.57.6's Qwen3MoeSparseMoeBlock (issue 32).

Shape: 64 experts, top-8 renormalised (norm_topk_prob), 4096 tokens, hidden
1024, moe_intermediate 768 (Qwen3-30B-A3B's expert width, its hidden halved),
fp32, loss sum(out * d_out), gradients for the input and every weight. Ours is
build/bin/moe_layer_bench: the router, SortByExpert, grouped_linear to
gate_up, swiglu, grouped_linear to down and the weighted index_add, as a
model's layer composes the kernels. Both sides draw their own random weights
(std 0.02) and inputs, so their routings are alike (near uniform), not equal.

Each measurement runs in a process of its own: one untimed warm-up step, then
REPS timed steps (the median is the time); ours and transformers alternate,
in the same thread count. Ours also reports its experts' six grouped products
(forward, input and weight gradients of both projections) against six dense
at::mm of the same FLOPs (every routed row through one weight): the share of
the machine's dense-GEMM rate that the grouped products reach.
Prints one row for the layer and one for the grouped products.
"""
import argparse
import json
import os
import subprocess
import sys
import time

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 4096, 1024, 768, 64, 8
REPS = 3


def baseline(reps):
    """transformers' block in this process: prints the median seconds as JSON."""
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE,
                            num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True)
    block = Qwen3MoeSparseMoeBlock(config)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    d_out = torch.randn(1, TOKENS, HIDDEN)

    def step():
        out, _ = block(x)
        (out * d_out).sum().backward()
        x.grad = None
        block.zero_grad(set_to_none=True)

    step()
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    print(json.dumps({"layer_s": seconds[len(seconds) // 2], "threads": torch.get_num_threads()}))


def measure(cmd):
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--reps", type=int, default=REPS)
    args = parser.parse_args()
    if args.baseline:
        baseline(1)
        return
    tool = [os.path.join(args.bin, "moe_layer_bench"), str(TOKENS), str(HIDDEN), str(INTERMEDIATE),
            str(EXPERTS), str(TOP_K), "1"]
    ours, theirs = [], []
    for r in range(args.reps):
        # Alternate which side goes first: the machine may be shared.
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            if side == 0:
                ours.append(measure(tool))
            else:
                theirs.append(measure([sys.executable, __file__, "--baseline"]))
    layer = median([o["layer_s"] for o in ours])
    base = median([t["layer_s"] for t in theirs])
    grouped = median([o["grouped_s"] for o in ours])
    dense = median([o["dense_s"] for o in ours])
    flops = ours[0]["expert_flops"]
    shape = (f"T={TOKENS} H={HIDDEN} I={INTERMEDIATE} E={EXPERTS} top-{TOP_K}")
    runs = f"{args.reps} runs, {ours[0]['threads']} threads"
    print(f"moe_layer_cpu fwd+bwd/{shape} vs transformers Qwen3MoeSparseMoeBlock: "
          f"{layer / base:.2g}x time ({layer:.3f} s vs {base:.3f} s; {runs})", flush=True)
    print(f"moe_layer_cpu grouped products fwd+bwd/{shape} vs dense at::mm of equal FLOPs: "
          f"{dense / grouped:.0%} of the dense rate ({flops / grouped / 1e9:.1f} vs "
          f"{flops / dense / 1e9:.1f} GFLOP/s; {grouped:.3f} s vs {dense:.3f} s; {runs})", flush=True)


if __name__ == "__main__":
    main()
