"""The trainer's half of scripts/gpu-check: ballast-train on a GPU against
the same binary on the CPU, the guard with injected faults on the GPU, the
tasks (generative reranker, block diffusion) on the GPU against the CPU, then
a Qwen3-0.6B-shaped model at 4k tokens per document, LoRA and full finetune,
with tokens/s, MFU and peak device memory, then a Qwen3.5-4B-shaped hybrid
(Gated DeltaNet and gated attention, head_dim 256) in one document of 69,632
and of 131,072 tokens: the lengths at which the seed's run got grad_norm inf
and NaN (DESIGN.md).

Run by scripts/gpu-check (see its header); by hand:
  python3 scripts/gpu_training_check.py --train .gpu-deps/train/ballast-train \
      --library-path .gpu-deps/train/lib:$TORCH_LIB --work /tmp/gpu-train --report report.md

Everything is made here: random-weight models from transformers config
objects and random token data; nothing is downloaded. Exit status 1 when a
check fails; the report says which.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "parity"))
import reference  # noqa: E402  (tiny models, data, specs and metrics, shared with the parity tests)

# Dense bf16 tensor-core peak of the H100/H200 SXM (NVIDIA's data sheet, without
# sparsity); other GPUs are looked up by name below, else MFU is not reported.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "B200": 2250e12}


def peak_flops():
    name = torch.cuda.get_device_name(0)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return name, flops
    return name, None


TRAIN_ENV = dict(os.environ)


def run(train, spec, out_dir, *extra):
    os.makedirs(out_dir, exist_ok=True)
    spec_path = os.path.join(out_dir, "spec.yaml")
    reference.write_spec(spec_path, **spec)
    started = time.time()
    r = subprocess.run([train, "--spec", spec_path, "--out", out_dir, *extra],
                       capture_output=True, text=True, timeout=600, env=TRAIN_ENV)
    with open(os.path.join(out_dir, "stderr.log"), "w") as f:
        f.write(r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"ballast-train exited {r.returncode} in {out_dir}:\n{r.stderr[-4000:]}")
    return reference.read_metrics(out_dir), time.time() - started


def tiny_model(path):
    """A tiny Qwen3 with head dim 64, so that attention can take the
    project's CUDA kernel in bf16 (its head dims are 64, 128 and 256)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(3)
    config = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-6,
                         rope_theta=1e6, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)


def qwen3_06b_model(path):
    """Qwen3-0.6B's shapes (28 layers, hidden 1024, 16 query and 8 kv heads of
    128, vocab 151936, tied embeddings) with random bf16 weights."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                         rope_theta=1e6, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return config, params


def parity(train, work, rows):
    """5 LoRA steps of the tiny model on the CPU and on the GPU: the loss
    curves agree within 1e-5 relative in fp32 and 1e-2 in bf16."""
    model = os.path.join(work, "tiny")
    data = os.path.join(work, "tiny.jsonl")
    tiny_model(model)
    reference.make_dataset(data, 64, 512, seed=5, min_len=32, max_len=200)
    ok = True
    for precision, bound in (("fp32", 1e-5), ("bf16", 1e-2)):
        spec = reference.base_spec(model, data, precision=precision, max_steps=5,
                                   data={"seq_len": 256})
        curves = {}
        for device in ("cpu", "cuda"):
            metrics, _ = run(train, {**spec, "device": device},
                             os.path.join(work, f"tiny-{precision}-{device}"))
            curves[device] = [m["loss"] for m in metrics]
        worst = max(abs(g - c) / abs(c) for g, c in zip(curves["cuda"], curves["cpu"]))
        passed = worst <= bound and len(curves["cuda"]) == 5
        ok &= passed
        rows.append(f"| tiny Qwen3 LoRA, 5 steps, {precision}: CPU vs CUDA loss | "
                    f"max relative difference {worst:.2e} (bound {bound:.0e}) | "
                    f"{'pass' if passed else 'FAIL'} |")
    return ok


def guard(train, work, rows):
    """The guard on the GPU, with the tiny model in bf16 and faults injected:
    a transient NaN gradient at step 3 is recovered by the re-run, and NaN
    gradients at steps 6-8 are skipped, then rolled back to a good snapshot
    (the re-run, the snapshot's copy to the host and back, and the
    per-tensor norms all on the device); the run finishes with every later
    step applied and finite."""
    model = os.path.join(work, "tiny")
    data = os.path.join(work, "tiny.jsonl")
    if not os.path.exists(model):
        tiny_model(model)
        reference.make_dataset(data, 64, 512, seed=5, min_len=32, max_len=200)
    ok = True
    for name, inject, want in (
            ("transient NaN at step 3", {"nan_grad_at_step": [3], "transient": True},
             "guard recovered at step 3"),
            ("NaN at steps 6-8", {"nan_grad_at_step": [6, 7, 8]},
             "guard rollback at step 8: ")):
        spec = reference.base_spec(model, data, precision="bf16", device="cuda", max_steps=12,
                                   data={"seq_len": 256},
                                   guard={"snapshot_every": 2, "good_after_steps": 2,
                                          "inject": inject})
        out = os.path.join(work, "guard-" + name.split()[0].lower() + "-" + name.split()[-1])
        metrics, _ = run(train, spec, out)
        with open(os.path.join(out, "stderr.log")) as f:
            log = f.read()
        clean = [m["step"] for m in metrics] == list(range(1, 13)) and all(
            not m["skipped"] and m["grad_norm"] is not None for m in metrics)
        passed = want in log and clean
        ok &= passed
        rows.append(f"| guard on the GPU, tiny Qwen3 bf16, {name} | "
                    f"{'found' if want in log else 'missing'}: `{want.strip(': ')}`; "
                    f"{'every step applied and finite' if clean else 'a bad step remains'} | "
                    f"{'pass' if passed else 'FAIL'} |")
    return ok


def tasks(train, work, rows, device="cuda"):
    """The reranker and block-diffusion objectives on the device: the first
    step's loss in fp32 against the CPU's (the same data, masks and LoRA
    init), then 20 bf16 steps with every grad_norm finite, and the reranker's
    held-out MRR@10 above 0.9 at the end (its task is learnable)."""
    from trained_tokenizers import write_chat_tokenizer
    model = os.path.join(work, "tiny-tasks")
    if not os.path.exists(model):
        tiny_model(model)
        write_chat_tokenizer(model, "")
        reference.make_reranker_groups(os.path.join(work, "groups.jsonl"), 64, seed=5)
        reference.make_reranker_groups(os.path.join(work, "held-out.jsonl"), 16, seed=6)
        reference.make_dataset(os.path.join(work, "sft.jsonl"), 64, 500, seed=7, min_len=32,
                               max_len=120)
    reranker = reference.base_spec(
        model, os.path.join(work, "groups.jsonl"), task="generative_reranker", max_steps=20,
        data={"seq_len": 512, "packing": True, "micro_batch_size": 2, "grad_accum_steps": 2},
        optimizer={"lr": 1e-2}, schedule={"kind": "constant", "warmup_steps": 0},
        reranker={"prefix": "<|im_start|>", "instruction": "f", "suffix": "<|im_end|>\n",
                  "yes_token": "y", "no_token": "n",
                  "eval_path": os.path.join(work, "held-out.jsonl")})
    diffusion = reference.base_spec(
        model, os.path.join(work, "sft.jsonl"), task="block_diffusion", max_steps=20,
        data={"seq_len": 512, "packing": True},
        schedule={"kind": "constant", "warmup_steps": 0},
        block_diffusion={"block_length": 4, "mask_token_id": 511})
    ok = True
    for name, spec in (("generative reranker", reranker), ("block diffusion", diffusion)):
        slug = name.split()[-1]
        first = {}
        for where in ("cpu", device):
            metrics, _ = run(train, {**spec, "device": where, "max_steps": 1},
                             os.path.join(work, f"{slug}-fp32-{where}"))
            first[where] = metrics[0]["loss"]
        agree = abs(first[device] - first["cpu"]) <= 1e-3 * abs(first["cpu"])
        metrics, _ = run(train, {**spec, "device": device, "precision": "bf16"},
                         os.path.join(work, f"{slug}-bf16-{device}"))
        finite = len(metrics) == 20 and all(
            m["grad_norm"] is not None and math.isfinite(m["grad_norm"]) for m in metrics)
        facts = [f"step 1 fp32 loss {first[device]:.6f} vs CPU {first['cpu']:.6f}",
                 f"20 bf16 steps {'finite' if finite else 'NOT finite'}"]
        passed = agree and finite
        if slug == "reranker":
            with open(os.path.join(work, f"{slug}-bf16-{device}", "stderr.log")) as f:
                evals = [float(line.split("MRR@10 ")[1].split(",")[0])
                         for line in f if "eval step" in line]
            learned = bool(evals) and evals[-1] > 0.9
            facts.append(f"MRR@10 {evals[0]:.3f} -> {evals[-1]:.3f}" if evals else "no eval")
            passed &= learned
        ok &= passed
        rows.append(f"| {name} on the GPU, tiny Qwen3 | {'; '.join(facts)} | "
                    f"{'pass' if passed else 'FAIL'} |")
    return ok


def shaped_runs(train, work, rows):
    """A 30-step LoRA job and a 10-step full finetune of the 0.6B-shaped
    model at seq 4096, bf16 on the GPU: every grad_norm finite; tokens/s, MFU
    and peak device memory from the steps after warm-up."""
    model = os.path.join(work, "qwen3-0.6b")
    config, params = qwen3_06b_model(model)
    data = os.path.join(work, "long.jsonl")
    reference.make_dataset(data, 256, config.vocab_size, seed=9, min_len=2048, max_len=4096)
    gpu, peak = peak_flops()
    ok = True
    # Learning rates a user would pick for each method on a pretrained model.
    for method, steps, lr in (("lora", 30, 1e-4), ("full", 10, 1e-5)):
        spec = reference.base_spec(model, data, method=method, precision="bf16", device="cuda",
                                   max_steps=steps, optimizer={"lr": lr},
                                   data={"seq_len": 4096, "micro_batch_size": 2,
                                         "grad_accum_steps": 2, "shuffle": True})
        metrics, wall = run(train, spec, os.path.join(work, f"shaped-{method}"))
        finite = all(m["grad_norm"] is not None and math.isfinite(m["grad_norm"]) and
                     not m["skipped"] for m in metrics)
        timed = metrics[3:] if len(metrics) > 4 else metrics
        step_s = statistics.median(m["step_time_s"] for m in timed)
        tokens = statistics.median(m["tokens"] for m in timed)
        # Attention: QK^T and PV over each document's causal half, 2 FLOPs a
        # multiply-add, forward and backward (x3), on top of 6 x params x
        # tokens. A token attends to L/2 keys on average in a document of L,
        # so per token that is E[L^2] / E[L] / 2 keys, L uniform in [2048, 4096].
        keys = (3072 ** 2 + 2048 ** 2 / 12) / 3072 / 2
        attention = 3 * 2 * 2 * keys * tokens * config.num_attention_heads * \
            config.head_dim * config.num_hidden_layers
        flops = 6 * params * tokens + attention
        mfu = f"{flops / step_s / peak:.1%}" if peak else "n/a (unknown peak)"
        peak_mem = max(m["peak_memory_bytes"] for m in metrics) / 2**30
        ok &= finite and len(metrics) == steps
        rows.append(f"| Qwen3-0.6B shape, {method}, {steps} steps, bf16, seq 4096 | "
                    f"{tokens / step_s:,.0f} tokens/s, MFU {mfu} ({gpu}), peak {peak_mem:.1f} GiB, "
                    f"{wall:.0f} s wall | {'pass' if finite else 'FAIL: a grad_norm is not finite'} |")
    return ok


QWEN3_5_4B = dict(vocab_size=248320, hidden_size=2560, intermediate_size=9216,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                 linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                 linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                 tie_word_embeddings=True)


def qwen3_5_4b_model(path, layers):
    """Qwen3.5-4B's text shapes with `layers` layers (every fourth full
    attention, as the checkpoint), random bf16 weights, written as
    transformers 5.x saves Qwen3_5ForCausalLM: the GPU machine has
    transformers 4.x only, so the tensors are written here by name."""
    from safetensors.torch import save_file

    c = QWEN3_5_4B
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                   for i in range(layers)]
    config = {**c, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
              "num_hidden_layers": layers, "layer_types": layer_types, "hidden_act": "silu",
              "max_position_embeddings": 262144, "attention_bias": False,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                  "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                  "mrope_interleaved": True}}
    h, d = c["hidden_size"], c["head_dim"]
    key_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    value_dim = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    hv = c["linear_num_value_heads"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for i, kind in enumerate(layer_types):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "mlp.gate_proj.weight": (c["intermediate_size"], h),
                       p + "mlp.up_proj.weight": (c["intermediate_size"], h),
                       p + "mlp.down_proj.weight": (h, c["intermediate_size"])})
        if kind == "full_attention":
            q = c["num_attention_heads"] * d
            kv = c["num_key_value_heads"] * d
            shapes.update({p + "self_attn.q_proj.weight": (2 * q, h),
                           p + "self_attn.k_proj.weight": (kv, h),
                           p + "self_attn.v_proj.weight": (kv, h),
                           p + "self_attn.o_proj.weight": (h, q),
                           p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        else:
            shapes.update({p + "linear_attn.in_proj_qkv.weight": (2 * key_dim + value_dim, h),
                           p + "linear_attn.in_proj_z.weight": (value_dim, h),
                           p + "linear_attn.in_proj_b.weight": (hv, h),
                           p + "linear_attn.in_proj_a.weight": (hv, h),
                           p + "linear_attn.conv1d.weight": (2 * key_dim + value_dim, 1,
                                                             c["linear_conv_kernel_dim"]),
                           p + "linear_attn.A_log": (hv,), p + "linear_attn.dt_bias": (hv,),
                           p + "linear_attn.norm.weight": (c["linear_value_head_dim"],),
                           p + "linear_attn.out_proj.weight": (h, value_dim)})
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("A_log"):  # transformers' init: log of uniform(0.01, 16)
            t = torch.empty(shape, device="cuda").uniform_(0.01, 16, generator=g).log()
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            t = torch.ones(shape, device="cuda")
        elif "norm" in name:  # zero-centred: (1 + w)
            t = torch.zeros(shape, device="cuda")
        else:
            t = torch.randn(shape, device="cuda", generator=g) * 0.02
        tensors[name] = t.to(torch.bfloat16).cpu()
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return config, sum(t.numel() for t in tensors.values())


def qwen3_5_long_steps(train, work, rows):
    """Two LoRA steps of a 4-layer Qwen3.5-4B-shaped hybrid (3 GDN, 1 gated
    full attention, head_dim 256) on one document of 69,632 and of 131,072
    tokens, bf16 with gradient checkpointing: every loss and grad_norm
    finite, with tokens/s, MFU and peak device memory. MFU counts 6 x params
    x tokens and the full-attention layer's causal QK^T and PV; the gated
    delta rule's own FLOPs are left out, so it is understated."""
    model = os.path.join(work, "qwen3.5-4b-shape")
    config, params = qwen3_5_4b_model(model, layers=4)
    gpu, peak = peak_flops()
    ok = True
    for tokens in (69632, 131072):
        data = os.path.join(work, f"one-{tokens}.jsonl")
        g = torch.Generator().manual_seed(tokens)
        with open(data, "w") as f:
            for _ in range(2):
                f.write(json.dumps({"input_ids": torch.randint(
                    0, config["vocab_size"], (tokens,), generator=g).tolist()}) + "\n")
        spec = reference.base_spec(model, data, method="lora", precision="bf16", device="cuda",
                                   max_steps=2, gradient_checkpointing=True,
                                   data={"seq_len": tokens, "micro_batch_size": 1,
                                         "shuffle": False})
        metrics, wall = run(train, spec, os.path.join(work, f"qwen3.5-{tokens}"))
        finite = len(metrics) == 2 and all(
            m["loss"] is not None and math.isfinite(m["loss"]) and m["grad_norm"] is not None
            and math.isfinite(m["grad_norm"]) and not m["skipped"] for m in metrics)
        step_s = metrics[-1]["step_time_s"]
        full_layers = config["layer_types"].count("full_attention")
        attention = 3 * 2 * 2 * (tokens / 2) * tokens * config["num_attention_heads"] * \
            config["head_dim"] * full_layers
        flops = 6 * params * tokens + attention
        mfu = f"{flops / step_s / peak:.1%}" if peak else "n/a (unknown peak)"
        peak_mem = max(m["peak_memory_bytes"] for m in metrics) / 2**30
        ok &= finite
        rows.append(f"| Qwen3.5-4B shape (4 layers), LoRA, bf16, one document of {tokens:,} tokens | "
                    f"loss {metrics[-1]['loss']}, grad_norm {metrics[-1]['grad_norm']}; "
                    f"{tokens / step_s:,.0f} tokens/s, MFU {mfu} ({gpu}), peak {peak_mem:.1f} GiB, "
                    f"{wall:.0f} s wall | {'pass' if finite else 'FAIL: not finite'} |")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True, help="the ballast-train binary")
    parser.add_argument("--work", required=True, help="scratch folder for models and runs")
    parser.add_argument("--report", required=True, help="markdown table rows are appended here")
    parser.add_argument("--library-path", default="",
                        help="LD_LIBRARY_PATH for ballast-train alone (its bundled libraries)")
    args = parser.parse_args()
    if args.library_path:
        TRAIN_ENV["LD_LIBRARY_PATH"] = ":".join(
            p for p in (args.library_path, os.environ.get("LD_LIBRARY_PATH")) if p)
    os.makedirs(args.work, exist_ok=True)
    if not torch.cuda.is_available():
        print("gpu_training_check: no CUDA device; SKIPPED")
        return 0
    rows = ["", "| training check | result | verdict |", "| --- | --- | --- |"]
    ok = True
    for check in (parity, guard, tasks, shaped_runs, qwen3_5_long_steps):
        try:
            ok &= check(args.train, args.work, rows)
        except Exception as e:  # a failed run is a row of the report, not a lost report
            ok = False
            rows.append(f"| {check.__name__} | {str(e).splitlines()[0][:300]} | FAIL |")
            print(e, file=sys.stderr)
        # Written after every check, so that a timeout keeps what was measured.
        with open(args.report, "a") as f:
            f.write("\n".join(rows) + "\n")
        print("\n".join(rows))
        rows = []
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
