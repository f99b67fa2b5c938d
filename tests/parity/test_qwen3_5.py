"""Qwen3.5 (issue 31), the model side: the hybrid of Gated DeltaNet and gated
full-attention layers, against transformers 5.23 (this file runs under
build/hf5) for the text model (Qwen3_5ForCausalLM, model_type qwen3_5_text)
and the released checkpoints' vision-language wrapper
(Qwen3_5ForConditionalGeneration, model_type qwen3_5, text only, with a
sharded checkpoint that also holds mtp.* tensors).

The models are tiny (reference.QWEN3_5_TEXT: 2 linear + 1 full-attention
layer, hidden 64, head_dim 32 with a quarter rotated, key heads 2 x 16,
value heads 4 x 16) with every tensor random, norms, A_log and dt_bias
included (reference.randomize_qwen3_5). transformers runs its own torch path
for the gated delta rule (reference.use_transformers_torch_gdn)."""
import json
import math
import os
import re

import pytest
import torch

from qwen3_5_reference import load as load_reference
from reference import (assert_outside_decoder_kept, ballast_gradients, ballast_logits, base_spec,
                       check_adapter_round_trip, hf_logits, lora_against_peft, make_dataset, make_model, model_class,
                       read_metrics, reference_train, relative_error, run_train, write_rows,
                       write_spec)

ARCHS = ["qwen3_5_text", "qwen3_5"]
# fp32 on both sides; the chunked gated delta rule, the tiled attention and
# packing change only the order of sums (measured differences ~1e-7).
LOGITS_TOLERANCE = 1e-5
# Per-step loss and grad_norm over 20 AdamW steps, as in test_lora_training.py.
CURVE_TOLERANCE = 1e-4


def text_model(model):
    """The decoder stack of either class (the VLM keeps it as language_model)."""
    inner = getattr(model, "base_model", model)
    inner = getattr(inner, "model", inner)
    return getattr(inner, "language_model", inner)


# ---------------------------------------------------------------------------
# Forward


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_and_packing_equals_each_document_alone(arch, tmp_path):
    model = make_model(arch, str(tmp_path / "model"), seed=1)
    rows = make_dataset(tmp_path / "docs.jsonl", n=5, vocab=320, seed=2, max_len=150)
    # ballast-train packs the five documents into one row.
    got = ballast_logits(str(tmp_path / "model"), str(tmp_path / "docs.jsonl"),
                         str(tmp_path / "logits.safetensors"))
    want = hf_logits(model, rows)  # each document run alone
    assert got["logits"].shape == want.shape
    err = relative_error(got["logits"], want)
    assert err <= LOGITS_TOLERANCE, f"{arch}: relative error {err:.2e}"

    # transformers' torch path on the same packed row (positions restarting
    # per document, as packing gives them) leaks the conv window and the
    # recurrent state across documents (transformers #46851): it is not the
    # documents alone, which is what packing must equal.
    ids = torch.tensor([[t for r in rows for t in r["input_ids"]]])
    positions = torch.tensor([[p for r in rows for p in range(len(r["input_ids"]))]])
    with torch.no_grad():
        leaked = model(input_ids=ids, position_ids=positions).logits[0].float()
    assert relative_error(leaked, want) > 100 * LOGITS_TOLERANCE


# ---------------------------------------------------------------------------
# Gradients of every parameter kind against float64


def float64_gradients(reference, names, rows):
    reference.loss(rows).backward()
    return {names[n]: t.grad for n, t in reference.p.items() if t.requires_grad}


# Every kind of tensor the hybrid trains, by the end of its name.
KINDS = ["embed_tokens.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
         "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
         "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
         "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias",
         "linear_attn.norm.weight", "linear_attn.out_proj.weight", "self_attn.q_proj.weight",
         "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
         "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
         "mlp.up_proj.weight", "mlp.down_proj.weight", "model.norm.weight"]
# fp32 (ours) against float64 over 3 layers and ~150 tokens: per tensor the
# relative error is ~1e-6; a wrong term (a cast, a missing gate, a decay
# off by a factor) is far beyond 1e-4.
GRAD_TOLERANCE = 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_of_every_parameter_kind_match_float64(arch, tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    model = make_model(arch, model_dir, seed=3)
    rows = make_dataset(data, n=3, vocab=320, seed=4, max_len=60)
    write_rows(data, [dict(r, labels=r["input_ids"]) for r in rows])  # every next token
    reference, names = load_reference(model_dir)
    # The float64 reference is transformers' model (in fp32, to its precision).
    with torch.no_grad():
        assert relative_error(torch.cat([reference.logits(r["input_ids"]) for r in rows]),
                              hf_logits(model, rows)) <= LOGITS_TOLERANCE
    got = ballast_gradients(model_dir, data, str(tmp_path / "g.safetensors"))
    want = float64_gradients(reference, names, rows)
    for kind in KINDS:
        assert any(n.endswith(kind) for n in want), kind
    # The VLM fixture is tied, as Qwen3.5-4B; the text one is not.
    assert ("lm_head.weight" in got) == (arch == "qwen3_5_text")
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for name, g in want.items():
        err = relative_error(got[name], g)
        assert err <= GRAD_TOLERANCE, f"{name}: relative error {err:.2e}"


def test_adapter_gradients_on_every_linear_match_float64(tmp_path):
    """LoRA on every linear, the Gated DeltaNet's in_proj_* and out_proj
    included, with random A and B so that both get a gradient."""
    from peft import LoraConfig, get_peft_model

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    make_model("qwen3_5", model_dir, seed=5)
    rows = make_dataset(data, n=3, vocab=320, seed=6, max_len=60)
    write_rows(data, [dict(r, labels=r["input_ids"]) for r in rows])
    torch.manual_seed(7)
    peft_model = get_peft_model(model_class("qwen3_5").from_pretrained(model_dir),
                                LoraConfig(r=4, lora_alpha=8, target_modules=TEXT_LINEARS,
                                           init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter = str(tmp_path / "adapter")
    peft_model.save_pretrained(adapter)
    got = ballast_gradients(model_dir, data, str(tmp_path / "g.safetensors"), adapter=adapter)
    reference, names = load_reference(model_dir, adapter)
    with torch.no_grad():
        assert relative_error(torch.cat([reference.logits(r["input_ids"]) for r in rows]),
                              hf_logits(peft_model, rows)) <= LOGITS_TOLERANCE
    want = float64_gradients(reference, names, rows)
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for module in TEXT_LINEARS:
        assert any(f".{module}.lora_B" in n for n in got), module
    for name, g in want.items():
        err = relative_error(got[name], g)
        assert err <= GRAD_TOLERANCE, f"{name}: relative error {err:.2e}"


# ---------------------------------------------------------------------------
# Training curves

# The text decoder's linears. PEFT's "all-linear" on the VLM also adapts the
# vision tower (attn.qkv, attn.proj, mlp.linear_fc1/2), which a text
# finetune does not train; Ballast's all-linear means these.
TEXT_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b",
                "in_proj_a", "out_proj", "gate_proj", "up_proj", "down_proj"]


def peft_names(path):
    from safetensors import safe_open
    with safe_open(os.path.join(path, "adapter_model.safetensors"), "pt") as f:
        return sorted(f.keys())


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_on_every_linear_matches_peft(arch, tmp_path):
    from peft import LoraConfig, get_peft_model

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=8)
    rows = make_dataset(data, n=24, vocab=320, seed=9)
    cls = model_class(arch)
    torch.manual_seed(10)
    init = get_peft_model(cls.from_pretrained(model_dir),
                          LoraConfig(r=8, lora_alpha=16, target_modules=TEXT_LINEARS,
                                     task_type="CAUSAL_LM"))
    init.save_pretrained(str(tmp_path / "init"))

    spec = base_spec(model_dir, data, lora={"init_adapter": str(tmp_path / "init")})
    r, _, ref, adapter = lora_against_peft(tmp_path, model_dir, rows, cls.from_pretrained, spec,
                                           CURVE_TOLERANCE)
    if arch == "qwen3_5":
        assert re.search(r"the checkpoint's \d+ tensors outside the text decoder "
                         r"\(model\.visual\.\* \(\d+\), mtp\.\* \(3\)\) are not trained; the "
                         r"adapter leaves them out", r.stderr), r.stderr

    # The adapter has PEFT's own keys, the Gated DeltaNet's linears included
    # (base_model.model.model.language_model.layers.0.linear_attn.in_proj_qkv.lora_A.weight
    # for the VLM), and nothing of the vision tower or the mtp head...
    assert peft_names(adapter) == peft_names(str(tmp_path / "init"))
    assert not any("visual" in n or "mtp" in n for n in peft_names(adapter))
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        assert sorted(json.load(f)["target_modules"]) == sorted(TEXT_LINEARS)
    # ...PEFT loads it into the trained reference's model, ballast-train
    # reads it back to the same logits, and the merged export (vision tower
    # and mtp kept) is the adapter applied.
    check_adapter_round_trip(tmp_path, model_dir, data, rows, adapter, ref, cls.from_pretrained,
                             CURVE_TOLERANCE)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_finetune_matches_torch_and_the_export_keeps_the_rest(arch, tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=11)
    rows = make_dataset(data, n=24, vocab=320, seed=12)
    spec = base_spec(model_dir, data, method="full", optimizer={"lr": 3e-4},
                     schedule={"kind": "linear", "warmup_steps": 2})
    spec.pop("lora")
    write_spec(tmp_path / "job.yaml", **spec)
    r = run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))

    cls = model_class(arch)
    ref = cls.from_pretrained(model_dir)
    losses, norms = reference_train(ref, rows, spec)
    assert relative_error([m["loss"] for m in got], losses) <= CURVE_TOLERANCE
    assert relative_error([m["grad_norm"] for m in got], norms) <= CURVE_TOLERANCE

    # A_log, dt_bias, the conv and every norm trained.
    exported_dir = str(tmp_path / "out" / "model")
    exported = cls.from_pretrained(exported_dir)
    before = dict(cls.from_pretrained(model_dir).named_parameters())
    for name, p in text_model(exported).named_parameters():
        if any(k in name for k in ("A_log", "dt_bias", "conv1d", "norm")):
            full = next(n for n in before if n.endswith(name))
            assert not torch.equal(p, before[full]), f"{name} did not train"
    assert relative_error(hf_logits(exported, rows), hf_logits(ref, rows)) <= CURVE_TOLERANCE

    if arch == "qwen3_5":
        assert re.search(r"the checkpoint's \d+ tensors outside the text decoder .* the "
                         r"exported model keeps them byte for byte", r.stderr), r.stderr
        assert_outside_decoder_kept(model_dir, exported_dir)


# ---------------------------------------------------------------------------
# Training paths: sharding, checkpointing, tasks, the guard


def train_curves(tmp_path, name, model_dir, data_path, *extra, **overrides):
    spec = base_spec(model_dir, data_path, **{"max_steps": 6, **overrides})
    write_spec(tmp_path / f"{name}.yaml", **spec)
    r = run_train(str(tmp_path / f"{name}.yaml"), str(tmp_path / name), *extra)
    return read_metrics(str(tmp_path / name)), r


def model_and_data(tmp_path, arch, seed, n=24):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=seed)
    make_dataset(data, n=n, vocab=320, seed=seed + 1)
    return model_dir, data


def assert_same_curves(got, want, tolerance, keys=("loss", "grad_norm")):
    for key in keys:
        err = relative_error([m[key] for m in got], [m[key] for m in want])
        assert err <= tolerance, f"{key}: relative error {err:.2e}"


@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero3_on_two_ranks_equals_one(method, tmp_path):
    model_dir, data = model_and_data(tmp_path, "qwen3_5", seed=13, n=48)
    overrides = {"method": method, "gradient_checkpointing": True}
    one, _ = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    two, _ = train_curves(tmp_path, "n2", model_dir, data, "--nproc", "2", devices=2,
                          **overrides)
    # fp32 sums over ranks in another order: rounding only (tests/shard).
    assert_same_curves(two, one, 1e-5)


def test_activation_checkpointing_changes_nothing_on_either_layer_kind(tmp_path):
    model_dir, data = model_and_data(tmp_path, "qwen3_5_text", seed=15)
    lora = {"lora_dropout": 0.1}  # the recomputation replays the dropout masks
    off, _ = train_curves(tmp_path, "off", model_dir, data, lora=lora)
    on, _ = train_curves(tmp_path, "on", model_dir, data, lora=lora, gradient_checkpointing=True)
    # The same ops in the same order on the same inputs.
    assert_same_curves(on, off, 1e-6)


def test_bf16_tracks_fp32(tmp_path):
    model_dir, data = model_and_data(tmp_path, "qwen3_5_text", seed=17)
    fp32, _ = train_curves(tmp_path, "fp32", model_dir, data, method="full", precision="fp32")
    bf16, _ = train_curves(tmp_path, "bf16", model_dir, data, method="full", precision="bf16")
    # As test_training_equivalences: bf16 activations over fp32 masters (and
    # fp32 gates and state) stay within 2% of the fp32 curve.
    assert all(math.isfinite(m["grad_norm"]) and not m["skipped"] for m in bf16)
    assert_same_curves(bf16, fp32, 2e-2, keys=("loss",))


def test_a_reranker_trains_on_the_hybrid(tmp_path):
    from reference import make_reranker_groups
    from test_chat_template import QWEN3
    from trained_tokenizers import write_chat_tokenizer

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "groups.jsonl")
    make_model("qwen3_5_text", model_dir, seed=19)
    write_chat_tokenizer(model_dir, QWEN3)
    make_reranker_groups(data, 32, seed=20)
    steps, _ = train_curves(
        tmp_path, "rerank", model_dir, data, task="generative_reranker", max_steps=10,
        data={"seq_len": 256, "packing": True, "micro_batch_size": 2, "grad_accum_steps": 2,
              "shuffle": True},
        optimizer={"lr": 1e-2, "max_grad_norm": 1.0},
        reranker={"loss": "listwise", "prefix": "<|im_start|>", "instruction": "f",
                  "suffix": "<|im_end|>\n", "yes_token": "y", "no_token": "n"})
    assert len(steps) == 10
    assert all(math.isfinite(s["grad_norm"]) and s["loss"] is not None for s in steps)


def test_the_guard_names_the_gated_deltanet_tensor(tmp_path):
    model_dir, data = model_and_data(tmp_path, "qwen3_5_text", seed=21)
    spec = base_spec(model_dir, data, max_steps=4,
                     lora={"target_modules": ["in_proj_qkv", "in_proj_z", "in_proj_b",
                                              "in_proj_a", "out_proj"]},
                     guard={"max_consecutive_bad": 1, "max_rollbacks": 0,
                            "inject": {"nan_grad_at_step": [2]}})
    write_spec(tmp_path / "job.yaml", **spec)
    r = run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"), check=False)
    assert r.returncode != 0
    # The poisoned gradient is the last adapter's: a Gated DeltaNet linear.
    assert re.search(r"first non-finite gradient: model\.layers\.1\.linear_attn\.\w+\.lora_B\."
                     r"weight", r.stderr), r.stderr


# ---------------------------------------------------------------------------
# What is refused, with exit 2 and the key or tensor named


def edit_config(model_dir, edit):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    edit(config.get("text_config", config))
    with open(path, "w") as f:
        json.dump(config, f)


def refused(tmp_path, model_dir, data, **overrides):
    spec = base_spec(model_dir, data, max_steps=4, **overrides)
    write_spec(tmp_path / "job.yaml", **spec)
    r = run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"), check=False)
    assert r.returncode == 2, (r.returncode, r.stderr)
    return r.stderr


@pytest.mark.parametrize("key,value,message", [
    ("linear_num_value_heads", 3, "text_config.linear_num_value_heads must be a multiple of "
                                  "linear_num_key_heads (2), got 3"),
    ("attn_output_gate", False, "text_config.attn_output_gate is false"),
    ("num_experts", 8, "text_config.num_experts is 8: mixture-of-experts"),
    ("layer_types", ["linear_attention", "sliding_attention", "full_attention"],
     "text_config.layer_types[1] must be one of full_attention, linear_attention"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.3},
     "text_config.rope_parameters.partial_rotary_factor gives a rotary dimension of 9"),
])
def test_a_config_this_decoder_does_not_implement_exits_2_naming_the_key(tmp_path, key, value,
                                                                         message):
    model_dir, data = model_and_data(tmp_path, "qwen3_5", seed=23, n=4)
    edit_config(model_dir, lambda c: c.__setitem__(key, value))
    assert message in refused(tmp_path, model_dir, data)


def test_a_checkpoint_without_a_log_exits_2_naming_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    model_dir, data = model_and_data(tmp_path, "qwen3_5_text", seed=25, n=4)
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.linear_attn.A_log"]
    save_file(tensors, path, metadata={"format": "pt"})
    stderr = refused(tmp_path, model_dir, data)
    assert "checkpoint has no tensor model.layers.1.linear_attn.A_log" in stderr, stderr


def test_block_diffusion_on_linear_attention_exits_2_with_the_reason(tmp_path):
    model_dir, data = model_and_data(tmp_path, "qwen3_5_text", seed=27, n=4)
    stderr = refused(tmp_path, model_dir, data, task="block_diffusion",
                     block_diffusion={"block_length": 4, "mask_token_id": 3})
    assert "linear_attention (Gated DeltaNet)" in stderr and "no defined meaning" in stderr, stderr
