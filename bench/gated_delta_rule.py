"""Benchmark: the Gated DeltaNet rule on CPU, forward and backward, against
transformers 5.x's torch_chunk_gated_delta_rule and fla's
naive_chunk_gated_delta_rule (issue 31).

Qwen3.5's heads scaled down so that the baselines finish: Hk 2 key heads and
Hv 4 value heads (Qwen3.5-9B has 16 and 32), Dk = Dv 128 (as Qwen3.5), one
document of T = 4k, 16k and 64k tokens, fp32, q and k L2-normalised in the
kernel, the loss out.sum(). Each measurement runs in a process of its own,
with MALLOC_MMAP_THRESHOLD_=65536 so that glibc returns every freed block of
64 KiB or more to the system: one untimed warm-up step on the first 1024
tokens (the libraries' and thread pools' start), then REPS timed steps
(the median is the time), whose peak resident memory above the resident
memory before them (VmHWM after a reset through /proc/self/clear_refs) is the
peak memory: what the step itself holds at its peak, the inputs excluded. Ours is tests/tools/gated_delta_rule_check bench; the baselines run
here, in the hf5 venv (build/hf5/bin/python), with the same thread count.
fla's reference takes no grouped heads, so its timed step includes the
l2norm and the repeat of q and k to the value heads.
Prints one row per length and baseline.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HK, HV, DK, DV = 2, 4, 128, 128
LENGTHS = (4096, 16384, 65536)
WARMUP_TOKENS = 1024  # the warm-up step's length (libraries and thread pools start there)


def reps_for(tokens):
    return 3 if tokens <= 4096 else 1


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def baseline(name, tokens, reps):
    """One baseline in this process: prints the same JSON as the tool's bench."""
    import torch
    torch.manual_seed(0)
    q = torch.randn(1, tokens, HK, DK, requires_grad=True)
    k = torch.randn(1, tokens, HK, DK, requires_grad=True)
    v = torch.randn(1, tokens, HV, DV, requires_grad=True)
    g = (-torch.nn.functional.softplus(torch.randn(1, tokens, HV))).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(1, tokens, HV)).requires_grad_(True)
    if name == "transformers":
        import inspect

        from transformers.models.qwen3_5 import modeling_qwen3_5
        # Its torch path: 5.23 wraps it to dispatch to fla's Triton kernel
        # where fla is installed, which cannot run on a CPU.
        torch_chunk_gated_delta_rule = inspect.unwrap(modeling_qwen3_5.torch_chunk_gated_delta_rule)

        def step(n):
            out, _ = torch_chunk_gated_delta_rule(q[:, :n], k[:, :n], v[:, :n], g[:, :n],
                                                  beta[:, :n], output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
            out.sum().backward()
    else:
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

        def l2norm(x):
            return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

        def step(n):
            qn = l2norm(q[:, :n]).repeat_interleave(HV // HK, 2)
            kn = l2norm(k[:, :n]).repeat_interleave(HV // HK, 2)
            out, _ = naive_chunk_gated_delta_rule(qn, kn, v[:, :n], g[:, :n], beta[:, :n],
                                                  scale=DK ** -0.5, output_final_state=True)
            out.sum().backward()

    def clear():
        for t in (q, k, v, g, beta):
            t.grad = None

    step(min(tokens, WARMUP_TOKENS))
    clear()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_bytes("VmRSS")
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        step(tokens)
        seconds.append(time.perf_counter() - start)
        clear()
    peak = status_bytes("VmHWM") - before
    seconds.sort()
    print(json.dumps({"tokens": tokens, "seconds": seconds[len(seconds) // 2],
                      "peak_bytes": peak, "threads": torch.get_num_threads()}))


def measure(cmd):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--baseline", choices=["transformers", "fla"])
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS))
    args = parser.parse_args()
    if args.baseline:
        baseline(args.baseline, args.tokens, reps_for(args.tokens))
        return
    tool = os.path.join(args.bin, "gated_delta_rule_check")
    for tokens in args.lengths:
        reps = reps_for(tokens)
        ours = measure([tool, "bench", str(tokens), str(HK), str(HV), str(DK), str(DV), str(reps)])
        for name, label in (("transformers", "transformers torch_chunk_gated_delta_rule"),
                            ("fla", "fla naive_chunk_gated_delta_rule")):
            theirs = measure([sys.executable, __file__, "--baseline", name, "--tokens", str(tokens)])
            print(f"gated_delta_rule_cpu fwd+bwd/T={tokens} (Hk {HK}, Hv {HV}, Dk=Dv {DK}) "
                  f"vs {label}: {ours['seconds'] / theirs['seconds']:.2g}x time, "
                  f"{ours['peak_bytes'] / theirs['peak_bytes']:.2g}x peak memory "
                  f"({ours['seconds']:.3f} s vs {theirs['seconds']:.3f} s, "
                  f"{ours['peak_bytes'] / 2**20:,.0f} MiB vs {theirs['peak_bytes'] / 2**20:,.0f} MiB, "
                  f"{ours['threads']} threads)", flush=True)


if __name__ == "__main__":
    main()
