"""Qwen3.5-MoE (issue 32), against transformers 5.23 (this file runs under
build/hf5): Qwen3.5's hybrid of Gated DeltaNet and gated full attention with a
mixture of experts in every layer (Qwen3_5MoeSparseMoeBlock: a softmax
router whose top k are always renormalised, the experts, and a shared expert
scaled by sigmoid(shared_expert_gate(x))), for the text model
(Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text) and the released
checkpoints' vision-language wrapper (Qwen3_5MoeForConditionalGeneration,
qwen3_5_moe, with a vision tower and mtp.* tensors, sharded).

The models are tiny (reference.QWEN3_5_MOE_TEXT: QWEN3_5_TEXT's 2 linear + 1
full-attention layers, 8 experts of width 48, top-2, a shared expert of
width 80) with every tensor random, the router and the shared-expert gate
wider than the rest. transformers saves the experts per expert
(mlp.experts.{e}.gate_proj.weight) and also loads its in-memory fused layout
(mlp.experts.gate_up_proj); Ballast reads both and writes the former.

LoRA: PEFT 0.21.2 on transformers 5.23 reaches by target_modules what is an
nn.Linear there: the token mixers' linears, the shared expert's gate_proj,
up_proj and down_proj, and shared_expert_gate; its all-linear is those (and
the vision tower's). The router and the fused experts are not nn.Linear
modules: PEFT adapts them by target_parameters (a ParamWrapper per parameter,
one A over gate and up per expert), and so does Ballast's
lora.target_parameters; the curves compare with PEFT on both, and full
finetuning trains the experts and the router."""
import json
import os
import re

import pytest
import torch

from qwen3_5_reference import load as load_reference
from reference import base_spec as dense_spec
from reference import (assert_outside_decoder_kept, ballast_gradients, ballast_logits,
                       check_adapter_round_trip, hf_logits, lora_against_peft, make_dataset, make_model, model_class,
                       read_metrics, reference_train, relative_error, run_train, write_rows,
                       write_spec)
# An adapter's keys; the refusals' helpers: a job that must exit 2, and an
# edit of the decoder's config keys.
from test_qwen3_5 import edit_config, peft_names, refused

ARCHS = ["qwen3_5_moe_text", "qwen3_5_moe"]
LOGITS_TOLERANCE = 1e-5
CURVE_TOLERANCE = 1e-4
GRAD_TOLERANCE = 1e-4
# What PEFT's all-linear adapts in the text decoder on transformers 5.23, and
# Ballast's all-linear for this model.
TEXT_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b",
                "in_proj_a", "out_proj", "gate_proj", "up_proj", "down_proj",
                "shared_expert_gate"]


def base_spec(model_dir, data_path, **overrides):
    """transformers' per-forward balancing (moe.aux_loss micro_batch), which
    reference_train computes."""
    overrides["moe"] = {"aux_loss": "micro_batch", **overrides.get("moe", {})}
    return dense_spec(model_dir, data_path, **overrides)


def text_config(model):
    return getattr(model.config, "text_config", model.config)


def router_logits_per_document(model, rows):
    with torch.no_grad():
        return [model(torch.tensor([r["input_ids"]]), output_router_logits=True).router_logits
                for r in rows]


# ---------------------------------------------------------------------------
# Forward


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_router_logits_and_aux_loss_match_transformers(arch, tmp_path):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import load_balancing_loss_func

    model = make_model(arch, str(tmp_path / "model"), seed=1)
    rows = make_dataset(tmp_path / "docs.jsonl", n=5, vocab=320, seed=2, max_len=150)
    # ballast-train packs the five documents into one row: packed must equal
    # each document alone.
    got = ballast_logits(str(tmp_path / "model"), str(tmp_path / "docs.jsonl"),
                         str(tmp_path / "logits.safetensors"))
    err = relative_error(got["logits"], hf_logits(model, rows))
    assert err <= LOGITS_TOLERANCE, f"{arch}: logits: relative error {err:.2e}"

    per_doc = router_logits_per_document(model, rows)
    assert sorted(k for k in got if k.startswith("router_logits")) == [
        "router_logits.0", "router_logits.1", "router_logits.2"]  # every layer is sparse
    for layer in range(3):
        want = torch.cat([d[layer] for d in per_doc])
        err = relative_error(got[f"router_logits.{layer}"], want)
        assert err <= LOGITS_TOLERANCE, f"router logits of layer {layer}: {err:.2e}"

    # transformers 5.23's own loss of the documents as one forward.
    c = text_config(model)
    want_aux = load_balancing_loss_func(tuple(z for d in per_doc for z in d), c.num_experts,
                                        c.num_experts_per_tok)
    assert abs(got["aux_loss"].item() - want_aux.item()) <= 1e-6 * want_aux.item()


def test_one_step_reports_transformers_loss_and_aux_loss(tmp_path):
    """One micro-batch of one document on one rank: the step's loss is
    Qwen3_5MoeForCausalLM's (cross-entropy + coef * aux, output_router_logits
    set) and aux_loss its aux_loss."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    model = make_model("qwen3_5_moe_text", model_dir, seed=3)
    rows = make_dataset(data, n=4, vocab=320, seed=4)
    spec = base_spec(model_dir, data, method="full", max_steps=1, schedule={"warmup_steps": 0},
                     data={"micro_batch_size": 1, "grad_accum_steps": 1})
    spec.pop("lora")
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    (got,) = read_metrics(str(tmp_path / "out"))
    with torch.no_grad():
        out = model(torch.tensor([rows[0]["input_ids"]]),
                    labels=torch.tensor([rows[0]["labels"]]))
    assert out.aux_loss is not None  # the config's output_router_logits
    assert abs(got["aux_loss"] - out.aux_loss.item()) <= 1e-6 * out.aux_loss.item()
    assert abs(got["loss"] - out.loss.item()) <= 1e-6 * out.loss.item()


def fuse_experts(model_dir):
    """Rewrites the checkpoint's per-expert tensors as transformers 5's fused
    ones (mlp.experts.gate_up_proj (E, 2I, H), mlp.experts.down_proj (E, H, I)),
    in the shard that held them."""
    from safetensors.torch import load_file, save_file

    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    for shard in set(index["weight_map"].values()):
        tensors = load_file(os.path.join(model_dir, shard))
        for layer in sorted({n.split(".experts.")[0] for n in tensors if ".experts." in n}):
            def pop(e, proj):
                return tensors.pop(f"{layer}.experts.{e}.{proj}.weight")
            tensors[f"{layer}.experts.gate_up_proj"] = torch.stack(
                [torch.cat([pop(e, "gate_proj"), pop(e, "up_proj")]) for e in range(8)])
            tensors[f"{layer}.experts.down_proj"] = torch.stack([pop(e, "down_proj")
                                                                  for e in range(8)])
        save_file(tensors, os.path.join(model_dir, shard), metadata={"format": "pt"})
        index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != shard}
        index["weight_map"].update({n: shard for n in tensors})
    with open(index_path, "w") as f:
        json.dump(index, f)


def test_the_fused_expert_layout_loads_as_the_per_expert_one(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    model = make_model("qwen3_5_moe", model_dir, seed=5)
    rows = make_dataset(data, n=3, vocab=320, seed=6, max_len=60)
    fuse_experts(model_dir)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        names = json.load(f)["weight_map"]
    assert "model.language_model.layers.1.mlp.experts.gate_up_proj" in names
    assert not any(".experts.0." in n for n in names)
    # transformers 5.23 reads it to the same model...
    want = hf_logits(model, rows)
    fused = model_class("qwen3_5_moe").from_pretrained(model_dir)
    assert relative_error(hf_logits(fused, rows), want) == 0
    # ...and so does ballast-train.
    got = ballast_logits(model_dir, data, str(tmp_path / "logits.safetensors"))
    assert relative_error(got["logits"], want) <= LOGITS_TOLERANCE


# ---------------------------------------------------------------------------
# Gradients against float64


KINDS = ["mlp.gate.weight", "mlp.experts.7.gate_proj.weight", "mlp.experts.0.up_proj.weight",
         "mlp.experts.3.down_proj.weight", "mlp.shared_expert.gate_proj.weight",
         "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
         "mlp.shared_expert_gate.weight", "linear_attn.A_log", "self_attn.q_proj.weight"]


@pytest.mark.parametrize("arch", ARCHS)
def test_gradients_of_router_experts_shared_expert_and_gate_match_float64(arch, tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    # A large coefficient, so that the aux loss's share of the router's
    # gradient is far above the tolerance.
    model = make_model(arch, model_dir, seed=7, router_aux_loss_coef=20.0)
    rows = [dict(r, labels=r["input_ids"])  # every next token
            for r in make_dataset(data, n=3, vocab=320, seed=8, max_len=60)]
    write_rows(data, rows)
    reference, names = load_reference(model_dir)
    with torch.no_grad():  # the float64 reference is transformers' model
        assert relative_error(torch.cat([reference.logits(r["input_ids"]) for r in rows]),
                              hf_logits(model, rows)) <= LOGITS_TOLERANCE
    got = ballast_gradients(model_dir, data, str(tmp_path / "g.safetensors"))

    def float64_gradients(coefficient):
        reference.c = dict(reference.c, router_aux_loss_coef=coefficient)
        for t in reference.p.values():
            t.grad = None
        reference.loss(rows).backward()
        return {names[n]: t.grad if t.grad is not None else torch.zeros_like(t)
                for n, t in reference.p.items()}

    want = float64_gradients(20.0)
    for kind in KINDS:
        assert any(n.endswith(kind) for n in want), kind
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for name, g in want.items():
        if not g.any():  # an expert no token chose: zero in Ballast
            assert not got[name].any(), name
            continue
        err = relative_error(got[name], g)
        assert err <= GRAD_TOLERANCE, f"{name}: relative error {err:.2e}"
    # The aux loss's gradient is in them: without it the routers' differ.
    without_aux = float64_gradients(0.0)
    routers = [n for n in want if n.endswith("mlp.gate.weight")]
    assert len(routers) == 3
    assert all(relative_error(without_aux[n], want[n]) > 100 * GRAD_TOLERANCE for n in routers)


# ---------------------------------------------------------------------------
# Training curves and what they export


@pytest.mark.parametrize("arch", ARCHS)
def test_all_linear_lora_matches_peft(arch, tmp_path):
    from peft import LoraConfig, get_peft_model

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=9)
    rows = make_dataset(data, n=48, vocab=320, seed=10)
    cls = model_class(arch)
    torch.manual_seed(11)
    # PEFT's all-linear on the text model is TEXT_LINEARS; on the VLM it
    # would add the vision tower, which a text finetune does not train.
    config = LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                        target_modules="all-linear" if arch == "qwen3_5_moe_text" else TEXT_LINEARS)
    init = get_peft_model(cls.from_pretrained(model_dir), config)
    init.save_pretrained(str(tmp_path / "init"))
    assert {n.split(".")[-3] for n in peft_names(str(tmp_path / "init"))} == set(TEXT_LINEARS)
    assert not any(".experts." in n or ".mlp.gate." in n for n in peft_names(str(tmp_path / "init")))

    # Ballast's all-linear (the spec's default here) is the same set. Eight
    # documents a step, so that every expert is reached in every step.
    spec = base_spec(model_dir, data, data={"micro_batch_size": 4},
                     lora={"init_adapter": str(tmp_path / "init")})
    _, got, ref, adapter = lora_against_peft(tmp_path, model_dir, rows, cls.from_pretrained, spec,
                                             CURVE_TOLERANCE)
    assert all(m["aux_loss"] > 0 for m in got)
    assert peft_names(adapter) == peft_names(str(tmp_path / "init"))
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        assert sorted(json.load(f)["target_modules"]) == sorted(TEXT_LINEARS)
    check_adapter_round_trip(tmp_path, model_dir, data, rows, adapter, ref, cls.from_pretrained,
                             CURVE_TOLERANCE)


# What PEFT's target_parameters names on this model: the fused routed experts
# and the router.
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]


@pytest.mark.parametrize("arch,parameters", [
    ("qwen3_5_moe_text", EXPERT_PARAMETERS),
    ("qwen3_5_moe", EXPERT_PARAMETERS),
    # One wrapper on the experts module (no nesting), named by a shorter suffix.
    ("qwen3_5_moe_text", ["experts.down_proj"]),
])
def test_lora_on_the_experts_and_router_by_target_parameters_matches_peft(arch, parameters,
                                                                          tmp_path):
    """The adapter starts from PEFT's own, its B drawn at random (PEFT starts
    B at 0), so that step 1 already reads the wrapper's layout: A (r E, in)
    expert-major, B (out, r E) with expert e's column j at j E + e."""
    from peft import LoraConfig, get_peft_model

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=16)
    rows = make_dataset(data, n=48, vocab=320, seed=17)
    cls = model_class(arch)
    torch.manual_seed(18)
    config = LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "shared_expert_gate"],
                        target_parameters=parameters)
    init = get_peft_model(cls.from_pretrained(model_dir), config)
    with torch.no_grad():
        for name, p in init.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    init.save_pretrained(str(tmp_path / "init"))
    names = peft_names(str(tmp_path / "init"))
    assert any(".mlp.experts.lora_A." in n for n in names), names
    assert (".mlp.gate.lora_A." in " ".join(names)) == ("mlp.gate.weight" in parameters)

    spec = base_spec(model_dir, data, data={"micro_batch_size": 4},
                     lora={"target_modules": ["q_proj", "shared_expert_gate"],
                           "target_parameters": parameters,
                           "init_adapter": str(tmp_path / "init")})
    _, _, ref, adapter = lora_against_peft(tmp_path, model_dir, rows, cls.from_pretrained, spec,
                                           CURVE_TOLERANCE)
    assert peft_names(adapter) == names
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        written = json.load(f)
    want = sorted({"mlp." + p[p.index("experts"):] if "experts" in p else "mlp.gate.weight"
                   for p in parameters})
    assert written["target_parameters"] == want
    check_adapter_round_trip(tmp_path, model_dir, data, rows, adapter, ref, cls.from_pretrained,
                             CURVE_TOLERANCE)


def test_target_parameters_exits_2_with_dropout_or_on_a_model_without_them(tmp_path):
    """With LoRA dropout (PEFT's wrapper cannot apply it and refuses to load
    such an adapter), and on a model without such parameters (dense Qwen3.5);
    the router named as Qwen3-MoE's module is refused, as PEFT refuses it."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model("qwen3_5_moe_text", model_dir, seed=19)
    make_dataset(data, n=8, vocab=320, seed=20)
    stderr = refused(tmp_path, model_dir, data,
                     lora={"target_parameters": ["mlp.gate.weight"], "lora_dropout": 0.1})
    assert "lora.lora_dropout must be 0 with lora.target_parameters" in stderr, stderr
    stderr = refused(tmp_path, model_dir, data, lora={"target_modules": ["q_proj", "gate"]})
    assert "name mlp.gate.weight in lora.target_parameters" in stderr, stderr
    # An adapter of the experts, started from by a job that does not target them.
    from peft import LoraConfig, get_peft_model
    init = get_peft_model(model_class("qwen3_5_moe_text").from_pretrained(model_dir),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"],
                                     target_parameters=["mlp.experts.down_proj"]))
    init.save_pretrained(str(tmp_path / "experts-adapter"))
    stderr = refused(tmp_path, model_dir, data, lora={
        "target_modules": ["q_proj"], "init_adapter": str(tmp_path / "experts-adapter")})
    assert "target_modules, target_parameters or modules_to_save differ" in stderr, stderr
    dense_dir = str(tmp_path / "dense")
    make_model("qwen3_5", dense_dir, seed=19)
    stderr = refused(tmp_path, dense_dir, data,
                     lora={"target_parameters": ["mlp.experts.gate_up_proj"]})
    assert "lora.target_parameters: qwen3_5 has no parameter that PEFT adapts that way" \
        in stderr, stderr


@pytest.mark.parametrize("arch", ARCHS)
def test_full_finetune_matches_torch_and_the_export_keeps_the_rest(arch, tmp_path):
    from safetensors import safe_open

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(arch, model_dir, seed=12)
    rows = make_dataset(data, n=48, vocab=320, seed=13)
    spec = base_spec(model_dir, data, method="full", max_steps=12, optimizer={"lr": 3e-4},
                     data={"micro_batch_size": 4},
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

    # The export is per expert, as save_pretrained writes it; transformers
    # reads it to the trained reference, and router, experts, shared expert
    # and its gate all trained.
    exported_dir = str(tmp_path / "out" / "model")
    with safe_open(os.path.join(exported_dir, "model.safetensors"), "pt") as f:
        exported_names = set(f.keys())
    assert any(".mlp.experts.7.down_proj.weight" in n for n in exported_names)
    assert not any(n.endswith("experts.gate_up_proj") for n in exported_names)
    exported = cls.from_pretrained(exported_dir)
    assert relative_error(hf_logits(exported, rows), hf_logits(ref, rows)) <= CURVE_TOLERANCE
    before = dict(cls.from_pretrained(model_dir).named_parameters())
    for name, p in exported.named_parameters():
        if any(k in name for k in ("mlp.gate.", "experts.", "shared_expert")):
            assert not torch.equal(p, before[name]), f"{name} did not train"

    if arch == "qwen3_5_moe":
        assert re.search(r"the checkpoint's \d+ tensors outside the text decoder .* the "
                         r"exported model keeps them byte for byte", r.stderr), r.stderr
        assert_outside_decoder_kept(model_dir, exported_dir)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_zero3_on_two_ranks_equals_one(method, tmp_path):
    """lora: the experts' and the router's adapters (target_parameters),
    sharded like the weights: in buckets of their own, split by expert under
    moe.expert_parallel (ep2), where the shared expert, every token's, stays
    gathered as the attention is."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model("qwen3_5_moe", model_dir, seed=14)
    make_dataset(data, n=48, vocab=320, seed=15)
    curves = {}
    for name, extra, devices in (("n1", (), 1), ("n2", ("--nproc", "2"), 2),
                                 ("ep2", ("--nproc", "2"), 2)):
        spec = base_spec(model_dir, data, method=method, max_steps=6, devices=devices,
                         gradient_checkpointing=True,
                         lora={"target_modules": ["q_proj"],
                               "target_parameters": EXPERT_PARAMETERS})
        if method == "full":
            spec.pop("lora")
        if name == "ep2":
            spec["moe"] = {**spec.get("moe", {}), "expert_parallel": 2}
        write_spec(tmp_path / f"{name}.yaml", **spec)
        r = run_train(str(tmp_path / f"{name}.yaml"), str(tmp_path / name), *extra)
        if name == "ep2":
            assert "per rank over 2 ranks (moe.expert_parallel)" in r.stderr, r.stderr
        curves[name] = read_metrics(str(tmp_path / name))
    # fp32 sums over ranks in another order: rounding only.
    for name in ("n2", "ep2"):
        for key in ("loss", "grad_norm", "aux_loss"):
            err = relative_error([m[key] for m in curves[name]], [m[key] for m in curves["n1"]])
            assert err <= 1e-5, f"{name} {key}: relative error {err:.2e}"


# ---------------------------------------------------------------------------
# What is refused, with exit 2 and the key or tensor named


@pytest.mark.parametrize("key,value,message", [
    ("num_experts_per_tok", 9, "text_config.num_experts_per_tok must be <= num_experts (8), got 9"),
    ("shared_expert_intermediate_size", 0,
     "text_config.shared_expert_intermediate_size must be > 0"),
    ("norm_topk_prob", False, "text_config.norm_topk_prob must be true or absent for qwen3_5_moe"),
    ("mlp_only_layers", [1], "text_config.mlp_only_layers must be empty for qwen3_5_moe"),
    ("decoder_sparse_step", 2, "text_config.decoder_sparse_step must be 1 or absent"),
    ("model_type", "qwen3_5_text", 'text_config.model_type must be "qwen3_5_moe_text"'),
])
def test_a_config_this_decoder_does_not_implement_exits_2_naming_the_key(tmp_path, key, value,
                                                                         message):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model("qwen3_5_moe", model_dir, seed=16)
    make_dataset(data, n=4, vocab=320, seed=17)
    edit_config(model_dir, lambda c: c.__setitem__(key, value))
    assert message in refused(tmp_path, model_dir, data)


@pytest.mark.parametrize("tensor", ["model.layers.2.mlp.shared_expert_gate.weight",
                                    "model.layers.0.mlp.experts.5.up_proj.weight"])
def test_a_checkpoint_without_an_moe_tensor_exits_2_naming_it(tmp_path, tensor):
    from safetensors.torch import load_file, save_file

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model("qwen3_5_moe_text", model_dir, seed=18)
    make_dataset(data, n=4, vocab=320, seed=19)
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    del tensors[tensor]
    save_file(tensors, path, metadata={"format": "pt"})
    stderr = refused(tmp_path, model_dir, data)
    assert f"checkpoint has no tensor {tensor}" in stderr, stderr
