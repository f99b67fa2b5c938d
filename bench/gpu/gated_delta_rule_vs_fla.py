"""Gated DeltaNet on the GPU: our CUDA kernel against fla's
chunk_gated_delta_rule (flash-linear-attention's Triton kernel), forward and
forward+backward, on the shapes of bench/gpu/gated_delta_rule_cuda_bench.cc
(one Qwen3.5-9B GDN layer: 16 key heads, 32 value heads, head dim 128, 32,768
tokens as one document and as 8 packed ones; bf16 q, k, v, fp32 g and beta,
q and k L2-normalised in the kernel, initial state zero, final state out).

Run by scripts/gpu-check:
  python3 bench/gpu/gated_delta_rule_vs_fla.py --bench build-gpu/out/gated_delta_rule_cuda_bench

Prints one row per shape and pass, e.g.
  gated_delta_rule_cuda/fwd+bwd qwen3.5_layer_one_doc T=32768: 0.05x fla's speed (ours 150.0 ms, fla 7.6 ms)
fla runs with its grouped value heads (HV > H) and cu_seqlens, both of which
fla 0.6 takes; where fla cannot be imported or run here, the rows give our
times alone and say why fla is missing. The goal (issue 31) is >= 0.8x.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

REPS = 5


def median_ms(torch, run):
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def time_fla(shape):
    """fla's fwd and fwd+bwd times (ms) on `shape`, or the reason it cannot run."""
    try:
        import torch
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # any import failure is a reason to print, not a crash
        return None, f"fla not importable: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    try:
        return _time_fla_on(torch, chunk_gated_delta_rule, shape), None
    except Exception as e:  # fla present but unable to run here: a reason, not a crash
        return None, f"fla failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


def _time_fla_on(torch, chunk_gated_delta_rule, shape):
    tokens, docs, hk, hv, d = (shape[key] for key in ("tokens", "docs", "hk", "hv", "d"))
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(1, tokens, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, tokens, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, tokens, hv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = (-torch.nn.functional.softplus(torch.randn(1, tokens, hv, device=dev))).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(1, tokens, hv, device=dev)).requires_grad_(True)
    grad = torch.randn(1, tokens, hv, d, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor([n * tokens // docs for n in range(docs + 1)], device=dev, dtype=torch.long)

    def run():
        return chunk_gated_delta_rule(q, k, v, g, beta, scale=d ** -0.5, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

    def fwd():
        with torch.no_grad():
            run()

    def fwd_bwd():
        o, final = run()
        ((o * grad).sum() + final.sum()).backward()

    return median_ms(torch, fwd), median_ms(torch, fwd_bwd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", required=True, help="the gated_delta_rule_cuda_bench binary")
    args = parser.parse_args()
    r = subprocess.run([args.bench], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(f"gated_delta_rule_cuda/ bench exited {r.returncode}: {r.stderr[-500:]}")
        return 1
    shapes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if not shapes:
        print(r.stdout.strip())  # no device: the binary says so
        return 0
    for shape in shapes:
        fla, reason = time_fla(shape)
        for name, key, i in (("fwd", "fwd_ms", 0), ("fwd+bwd", "fwd_bwd_ms", 1)):
            ours = shape[key]
            what = (f"gated_delta_rule_cuda/{name} {shape['name']} T={shape['tokens']} "
                    f"N={shape['docs']} Hk={shape['hk']} Hv={shape['hv']} D={shape['d']} bf16")
            if fla is None:
                print(f"{what}: ours {ours:.1f} ms; fla SKIPPED ({reason})")
            else:
                print(f"{what}: {fla[i] / ours:.2f}x fla's speed (ours {ours:.1f} ms, "
                      f"fla {fla[i]:.1f} ms)")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
