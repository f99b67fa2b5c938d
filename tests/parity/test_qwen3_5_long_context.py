"""One LoRA step of a tiny Qwen3.5 hybrid on 131,072 tokens (2^17, past the
65,536 where the seed's run got grad_norm inf and NaN), on the CPU with
gradient checkpointing: ballast-train's loss and grad_norm equal a float64
reference (qwen3_5_reference, itself checked against transformers 5.x in
test_qwen3_5.py) from a PEFT adapter, and its peak RSS is reported.

Two rows, because a 2-core CPU cannot afford what one would cost:
- packed: Gated DeltaNet and a gated full-attention layer of head_dim 256 (the
  seed's head size), on one row of 32 documents of 4,096 tokens. Every
  kernel indexes a 131,072-token row; the conv window and the recurrent state
  restart 31 times. The reference runs each document alone.
- one document: 131,072 tokens of one document through two Gated DeltaNet
  layers, so the recurrent state is carried across 2,048 chunks.
One document of 131,072 tokens through a head_dim-256 attention layer costs
about 35 minutes on this machine's 2 cores (a step at 16,384 tokens took 33 s,
and attention is quadratic): it runs on a GPU in scripts/gpu-check, and
test_long_context.py covers attention at positions past 2^16 on CPU.
"""
import json
import math
import time

import pytest
import torch

from qwen3_5_reference import load as load_reference
from reference import TRAIN, base_spec, read_metrics, run_measuring_rss, write_spec

TOKENS = 131_072


def make_model(path, layer_types):
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(31)
    config = Qwen3_5TextConfig(
        vocab_size=320, hidden_size=64, intermediate_size=112,
        num_hidden_layers=len(layer_types), layer_types=layer_types,
        num_attention_heads=1, num_key_value_heads=1, head_dim=256,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, max_position_embeddings=TOKENS,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.01, 16).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "norm" in name:  # zero-centred: (1 + w)
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1)
    model.save_pretrained(path, safe_serialization=True)


def make_adapter(model_dir, path):
    """A PEFT adapter on every linear with B drawn too, so that the step's
    gradient reaches A and B of every module."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(32)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(path)


def reference_step(model_dir, adapter_dir, documents):
    """Token-normalised CE over the documents, each alone, and the global norm
    of the adapter's gradients, in float64 (qwen3_5_reference: transformers
    computes its norms and delta rule in fp32 even in a float64 model)."""
    reference, _ = load_reference(model_dir, adapter_dir, chunked=True)
    supervised = sum(len(d) - 1 for d in documents)
    total = 0.0
    for ids in documents:  # a backward per document keeps one graph alive
        logits = reference.logits(ids)
        ce = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]),
                                               reduction="sum")
        (ce / supervised).backward()
        total += ce.item()
    grads = [t.grad for t in reference.p.values() if t.requires_grad]
    return total / supervised, torch.sqrt(sum((g * g).sum() for g in grads)).item()


def train_one_step(tmp_path, model_dir, adapter_dir, documents):
    """ballast-train for one step; returns its metrics and peak RSS in bytes."""
    data = str(tmp_path / "long.jsonl")
    with open(data, "w") as f:
        for ids in documents:
            f.write(json.dumps({"input_ids": ids}) + "\n")
    spec = base_spec(model_dir, data, max_steps=1, gradient_checkpointing=True,
                     lora={"r": 8, "lora_alpha": 16, "target_modules": ["all-linear"],
                           "init_adapter": adapter_dir},
                     data={"seq_len": TOKENS, "packing": True, "micro_batch_size": 1,
                           "grad_accum_steps": 1},
                     schedule={"kind": "constant", "warmup_steps": 0})
    write_spec(tmp_path / "job.yaml", **spec)
    out = str(tmp_path / "out")
    started = time.time()
    code, _, err, peak = run_measuring_rss([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                                            out])
    assert code == 0, f"ballast-train failed ({code}):\n{err}"
    [step] = read_metrics(out)
    return step, peak, time.time() - started


@pytest.mark.parametrize("shape", ["packed", "one_document"])
def test_a_131k_lora_step_equals_float64(tmp_path, capsys, shape):
    if shape == "packed":
        layer_types, lengths = ["linear_attention", "full_attention"], [4096] * 32
    else:
        layer_types, lengths = ["linear_attention", "linear_attention"], [TOKENS]
    model_dir, adapter_dir = str(tmp_path / "model"), str(tmp_path / "adapter")
    make_model(model_dir, layer_types)
    make_adapter(model_dir, adapter_dir)
    g = torch.Generator().manual_seed(TOKENS)
    documents = [torch.randint(0, 320, (n,), generator=g).tolist() for n in lengths]

    step, peak_rss, wall = train_one_step(tmp_path, model_dir, adapter_dir, documents)
    want_loss, want_norm = reference_step(model_dir, adapter_dir, documents)
    report = (f"qwen3.5 {shape}, {TOKENS} tokens in {len(lengths)} document(s): loss "
              f"{step['loss']!r} vs float64 {want_loss!r}, grad_norm {step['grad_norm']!r} vs "
              f"{want_norm!r}; ballast-train peak RSS {peak_rss / 2**20:.0f} MiB, {wall:.0f} s")
    with capsys.disabled():  # in the ctest log whether or not it passes
        print(report)
    assert step["tokens"] == TOKENS and step["supervised_tokens"] == TOKENS - len(lengths)
    assert math.isfinite(step["grad_norm"])
    # fp32 sums over 2^17 tokens against float64.
    assert abs(step["loss"] - want_loss) <= 1e-5 * abs(want_loss), report
    assert abs(step["grad_norm"] - want_norm) <= 1e-4 * abs(want_norm), report
