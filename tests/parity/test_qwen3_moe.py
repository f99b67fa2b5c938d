"""Qwen3-MoE (issue 32), the model side, against transformers 4.57.6's
Qwen3MoeForCausalLM and peft: the router, the dropless grouped experts, the
load-balancing loss in micro_batch form (transformers' load_balancing_loss_func),
LoRA on every expert and the router, full finetuning, ZeRO-3 and the refusals.

The model is tiny (reference.QWEN3_MOE: 3 layers, layer 0 dense by
mlp_only_layers, 8 experts of width 48, top-2) with every tensor random, the
router wider than the rest so that tokens prefer experts as a trained
router's do. Every curve's data reaches every expert of every sparse layer in
every step (reference_train asserts it): transformers leaves an unrouted
expert's gradient None, so AdamW skips it, where Ballast gives it a zero
gradient that AdamW still applies its moments to."""
import json
import os
import shutil
import subprocess

import pytest
import torch

from reference import base_spec as dense_spec
from reference import (TRAIN, ballast_gradients, ballast_logits,
                       check_adapter_round_trip, hf_logits, make_dataset, make_model, read_metrics,
                       reference_train, relative_error, routed_experts, run_train, write_rows,
                       write_spec)

ARCH = "qwen3_moe"
# fp32 on both sides; packing, the tiled attention and the grouped GEMM change
# only the order of sums (~1e-7).
LOGITS_TOLERANCE = 1e-5
CURVE_TOLERANCE = 1e-4
# fp32 (ours) against float64: ~1e-6 per tensor; a wrong term is far beyond.
GRAD_TOLERANCE = 1e-4
# The decoder's linears as PEFT names them for Qwen3-MoE: gate_proj, up_proj
# and down_proj match the dense layer's MLP and every expert's; "gate" is the router.
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_spec(model_dir, data_path, **overrides):
    """The parity spec with transformers' per-forward balancing (moe.aux_loss
    micro_batch), which reference_train computes; the default, global, is
    tests/parity/test_moe_balancing.py's."""
    overrides["moe"] = {"aux_loss": "micro_batch", **overrides.get("moe", {})}
    return dense_spec(model_dir, data_path, **overrides)


def aux_loss_of(model, rows):
    """transformers' load-balancing loss of `rows` as one forward (each
    document alone, their router logits concatenated: padding left out)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    logits = []
    for r in rows:
        logits += list(model(torch.tensor([r["input_ids"]]), output_router_logits=True)
                       .router_logits)
    c = model.config
    return load_balancing_loss_func(tuple(logits), c.num_experts, c.num_experts_per_tok)


def hf_router_logits(model, rows):
    """Per sparse layer, its router logits over the documents, each run alone."""
    per_doc = [model(torch.tensor([r["input_ids"]]), output_router_logits=True).router_logits
               for r in rows]
    return [torch.cat([d[i] for d in per_doc]) for i in range(len(per_doc[0]))]


# ---------------------------------------------------------------------------
# Forward: logits, router logits, the aux loss


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_router_logits_and_aux_loss_match_transformers(norm_topk_prob, tmp_path):
    model = make_model(ARCH, str(tmp_path / "model"), seed=1, norm_topk_prob=norm_topk_prob)
    rows = make_dataset(tmp_path / "docs.jsonl", n=5, vocab=320, seed=2, max_len=150)
    # ballast-train packs the five documents into one row: packed must equal
    # each document alone.
    got = ballast_logits(str(tmp_path / "model"), str(tmp_path / "docs.jsonl"),
                         str(tmp_path / "logits.safetensors"))
    with torch.no_grad():
        want = hf_logits(model, rows)
        err = relative_error(got["logits"], want)
        assert err <= LOGITS_TOLERANCE, f"logits: relative error {err:.2e}"

        # Layer 0 is dense; layers 1 and 2 route.
        assert sorted(k for k in got if k.startswith("router_logits")) == [
            "router_logits.1", "router_logits.2"]
        for layer, want_router in zip((1, 2), hf_router_logits(model, rows)):
            err = relative_error(got[f"router_logits.{layer}"], want_router)
            assert err <= LOGITS_TOLERANCE, f"router logits of layer {layer}: {err:.2e}"

        want_aux = aux_loss_of(model, rows)
        assert abs(got["aux_loss"].item() - want_aux.item()) <= 1e-6 * want_aux.item()


def test_one_step_reports_transformers_loss_and_aux_loss(tmp_path):
    """One micro-batch of one document on one rank: the step's loss is
    Qwen3MoeForCausalLM's (cross-entropy + coef * aux) and aux_loss its aux_loss."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    model = make_model(ARCH, model_dir, seed=3)
    rows = make_dataset(data, n=4, vocab=320, seed=4)
    spec = base_spec(model_dir, data, method="full", max_steps=1, schedule={"warmup_steps": 0},
                     data={"micro_batch_size": 1, "grad_accum_steps": 1})
    spec.pop("lora")
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    (got,) = read_metrics(str(tmp_path / "out"))
    with torch.no_grad():
        out = model(torch.tensor([rows[0]["input_ids"]]),
                    labels=torch.tensor([rows[0]["labels"]]), output_router_logits=True)
    assert abs(got["aux_loss"] - out.aux_loss.item()) <= 1e-6 * out.aux_loss.item()
    assert abs(got["loss"] - out.loss.item()) <= 1e-6 * out.loss.item()


# ---------------------------------------------------------------------------
# Gradients against float64


def float64_gradients(model, rows, aux=True):
    """d(summed cross-entropy + coef * aux) of the documents as one forward,
    in float64 autograd through transformers' own model."""
    model = model.double()
    ce = 0
    logits = []
    for r in rows:
        out = model(torch.tensor([r["input_ids"]]), output_router_logits=True)
        ce = ce + torch.nn.functional.cross_entropy(
            out.logits[0, :-1], torch.tensor(r["labels"][1:]), ignore_index=-100,
            reduction="sum")
        logits += list(out.router_logits)
    loss = ce
    if aux:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
        c = model.config
        loss = loss + c.router_aux_loss_coef * load_balancing_loss_func(
            tuple(logits), c.num_experts, c.num_experts_per_tok)
    loss.backward()
    # An expert no token reached has no gradient in transformers; ours is zero.
    return {n: p.grad if p.grad is not None else torch.zeros_like(p)
            for n, p in model.named_parameters() if p.requires_grad}


def check_gradients(got, want, without_aux):
    assert sorted(got) == sorted(want), set(got) ^ set(want)
    for name, g in want.items():
        if not g.any():
            assert not got[name].any(), name
            continue
        err = relative_error(got[name], g)
        assert err <= GRAD_TOLERANCE, f"{name}: relative error {err:.2e}"
    # The aux loss's gradient is in them: without it the router's differ.
    routers = [n for n in want if "mlp.gate." in n]
    assert routers
    assert any(relative_error(without_aux[n], want[n]) > 100 * GRAD_TOLERANCE for n in routers)


def test_gradients_of_router_experts_and_every_tensor_match_float64(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    # A large coefficient, so that the aux loss's share of the gradient is
    # far above the tolerance.
    make_model(ARCH, model_dir, seed=5, router_aux_loss_coef=20.0)
    rows = [dict(r, labels=r["input_ids"])  # every next token
            for r in make_dataset(data, n=3, vocab=320, seed=6, max_len=60)]
    write_rows(data, rows)
    got = ballast_gradients(model_dir, data, str(tmp_path / "g.safetensors"))
    want = float64_gradients(AutoModelForCausalLM.from_pretrained(model_dir), rows)
    without_aux = float64_gradients(AutoModelForCausalLM.from_pretrained(model_dir), rows,
                                    aux=False)
    for kind in ("mlp.gate.weight", "mlp.experts.7.gate_proj.weight",
                 "mlp.experts.0.down_proj.weight", "layers.0.mlp.up_proj.weight"):
        assert any(n.endswith(kind) for n in want), kind
    check_gradients(got, want, without_aux)


def test_adapter_gradients_on_experts_and_router_match_float64(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "docs.jsonl")
    make_model(ARCH, model_dir, seed=7, router_aux_loss_coef=20.0)
    rows = [dict(r, labels=r["input_ids"])
            for r in make_dataset(data, n=3, vocab=320, seed=8, max_len=60)]
    write_rows(data, rows)
    torch.manual_seed(9)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                                LoraConfig(r=4, lora_alpha=8, target_modules=LINEARS + ["gate"],
                                           init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter = str(tmp_path / "adapter")
    peft_model.save_pretrained(adapter)
    got = ballast_gradients(model_dir, data, str(tmp_path / "g.safetensors"), adapter=adapter)

    def reference(aux):
        m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter,
                                      is_trainable=True)
        grads = float64_gradients(m, rows, aux)
        # PEFT's parameter names, as the adapter file keys them.
        return {n.replace(".default", "").removeprefix("base_model.model."): g
                for n, g in grads.items()}

    want = reference(aux=True)
    assert any(".experts.5.up_proj.lora_A" in n for n in want)
    assert any(".mlp.gate.lora_B" in n for n in want)
    check_gradients(got, want, reference(aux=False))


# ---------------------------------------------------------------------------
# Training curves and what they export


def peft_names(path):
    from safetensors import safe_open
    with safe_open(os.path.join(path, "adapter_model.safetensors"), "pt") as f:
        return sorted(f.keys())


def test_lora_on_experts_and_router_matches_peft(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=10)
    rows = make_dataset(data, n=48, vocab=320, seed=11)
    targets = LINEARS + ["gate"]
    torch.manual_seed(12)
    init = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                          LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                     task_type="CAUSAL_LM"))
    init.save_pretrained(str(tmp_path / "init"))

    # Eight documents a step, so that every expert is reached in every step.
    spec = base_spec(model_dir, data, data={"micro_batch_size": 4},
                     lora={"init_adapter": str(tmp_path / "init"), "target_modules": targets})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))

    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                                    str(tmp_path / "init"), is_trainable=True)
    losses, norms = reference_train(ref, rows, spec)
    assert not any(m["skipped"] for m in got)
    assert all(m["aux_loss"] > 0 for m in got)
    assert relative_error([m["loss"] for m in got], losses) <= CURVE_TOLERANCE
    assert relative_error([m["grad_norm"] for m in got], norms) <= CURVE_TOLERANCE

    # The adapter has PEFT's keys, one A and B per expert
    # (base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight)...
    adapter = str(tmp_path / "out" / "adapter")
    assert peft_names(adapter) == peft_names(str(tmp_path / "init"))
    assert "base_model.model.model.layers.1.mlp.experts.3.gate_proj.lora_A.weight" in \
        peft_names(adapter)
    # ...which PEFT loads, ballast-train reads back, and the merge folds in,
    # experts and router included.
    check_adapter_round_trip(tmp_path, model_dir, data, rows, adapter, ref,
                             AutoModelForCausalLM.from_pretrained, CURVE_TOLERANCE)


def test_all_linear_adapts_the_experts_but_not_the_router(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=13)
    make_dataset(data, n=8, vocab=320, seed=14)
    write_spec(tmp_path / "job.yaml", **base_spec(model_dir, data, max_steps=4))
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    adapter = str(tmp_path / "out" / "adapter")
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        assert sorted(json.load(f)["target_modules"]) == sorted(LINEARS)
    names = peft_names(adapter)
    assert not any(".mlp.gate.lora" in n for n in names)
    for e in range(8):
        assert f"base_model.model.model.layers.2.mlp.experts.{e}.down_proj.lora_B.weight" in names
    assert "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight" in names


def test_merging_an_untrained_adapter_gives_the_base_byte_for_byte(tmp_path):
    """The expert stacking is undone on export: with B = 0 every tensor,
    per-expert names included, comes back exactly as the base had it."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir = str(tmp_path / "model")
    make_model(ARCH, model_dir, seed=15)
    get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                   LoraConfig(r=4, lora_alpha=8, target_modules=LINEARS + ["gate"],
                              task_type="CAUSAL_LM")).save_pretrained(str(tmp_path / "zero"))
    r = subprocess.run([TRAIN, "merge", "--model", model_dir, "--adapter", str(tmp_path / "zero"),
                        "--out", str(tmp_path / "merged")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    base = load_file(os.path.join(model_dir, "model.safetensors"))
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert sorted(merged) == sorted(base)
    for name, t in base.items():
        assert merged[name].dtype == t.dtype and torch.equal(merged[name], t), name


def test_full_finetune_matches_torch_with_the_router_in_fp32(tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=16)
    rows = make_dataset(data, n=24, vocab=320, seed=17)
    spec = base_spec(model_dir, data, method="full", optimizer={"lr": 3e-4},
                     schedule={"kind": "linear", "warmup_steps": 2})
    spec.pop("lora")
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))

    ref = AutoModelForCausalLM.from_pretrained(model_dir)
    losses, norms = reference_train(ref, rows, spec)
    assert relative_error([m["loss"] for m in got], losses) <= CURVE_TOLERANCE
    assert relative_error([m["grad_norm"] for m in got], norms) <= CURVE_TOLERANCE

    # The export has every expert under its HF name, trained as the reference's.
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "model"))
    assert relative_error(hf_logits(exported, rows), hf_logits(ref, rows)) <= CURVE_TOLERANCE
    before = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    for name, p in exported.named_parameters():
        if ".experts." in name or "mlp.gate." in name:
            assert not torch.equal(p, before[name]), f"{name} did not train"


# ---------------------------------------------------------------------------
# Training paths: checkpointing, bf16, ZeRO-3


def train_curves(tmp_path, name, model_dir, data_path, *extra, timeout=900, **overrides):
    spec = base_spec(model_dir, data_path, **{"max_steps": 6, **overrides})
    write_spec(tmp_path / f"{name}.yaml", **spec)
    # A timeout turns a hang (ranks gathering different experts) into a failure.
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / f"{name}.yaml"), "--out",
                        str(tmp_path / name), *extra], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"ballast-train failed ({r.returncode}):\n{r.stderr}"
    return read_metrics(str(tmp_path / name))


def assert_same_curves(got, want, tolerance, keys=("loss", "grad_norm", "aux_loss")):
    for key in keys:
        err = relative_error([m[key] for m in got], [m[key] for m in want])
        assert err <= tolerance, f"{key}: relative error {err:.2e}"


def test_activation_checkpointing_changes_nothing_and_counts_routing_once(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=18)
    make_dataset(data, n=24, vocab=320, seed=19)
    for method in ("lora", "full"):
        off = train_curves(tmp_path, f"off-{method}", model_dir, data, method=method)
        on = train_curves(tmp_path, f"on-{method}", model_dir, data, method=method,
                          gradient_checkpointing=True)
        # The recomputed layers record their routing again: counted twice,
        # the aux loss and its gradient would double.
        assert_same_curves(on, off, 1e-6)


def test_bf16_tracks_fp32(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=20)
    make_dataset(data, n=24, vocab=320, seed=21)
    fp32 = train_curves(tmp_path, "fp32", model_dir, data, method="full", precision="fp32")
    bf16 = train_curves(tmp_path, "bf16", model_dir, data, method="full", precision="bf16")
    assert all(not m["skipped"] for m in bf16)
    assert_same_curves(bf16, fp32, 2e-2, keys=("loss",))


@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero3_on_two_ranks_equals_one(method, tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=22)
    make_dataset(data, n=48, vocab=320, seed=23)
    overrides = {"method": method, "gradient_checkpointing": True}
    one = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    two = train_curves(tmp_path, "n2", model_dir, data, "--nproc", "2", devices=2, timeout=300,
                       **overrides)
    assert_same_curves(two, one, 1e-5)


def disjoint_routing_model(model_dir, seed):
    """A model whose tokens below 160 route only to experts 0-3 and the rest
    only to experts 4-7, in every sparse layer: their embeddings carry a large
    component along hidden dimension 0 or 1, which the residual stream keeps,
    and the router reads it."""
    from safetensors.torch import load_file, save_file

    make_model(ARCH, model_dir, seed=seed)
    path = os.path.join(model_dir, "model.safetensors")
    t = load_file(path)
    t["model.embed_tokens.weight"][:160, 0] += 4.0
    t["model.embed_tokens.weight"][160:, 1] += 4.0
    for layer in (1, 2):
        gate = t[f"model.layers.{layer}.mlp.gate.weight"]
        gate[:4, 0] += 8.0
        gate[4:, 1] += 8.0
    save_file(t, path, metadata={"format": "pt"})


def test_zero3_with_ranks_routing_to_disjoint_experts_equals_one_rank(tmp_path):
    """Rank r takes micro-batches r, r + 2, ... of a step (micro_batch_size 2,
    grad_accum_steps 2): rank 0's documents use tokens below 160 only, rank
    1's the rest, so no expert gets a token from both. Every rank still
    gathers every expert, in the same order, and a rank's gradient for an
    expert it did not route to is zero: no hang, the same curve."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    disjoint_routing_model(model_dir, seed=24)
    rows = make_dataset(data, n=48, vocab=160, seed=25)
    for i, r in enumerate(rows):
        if i % 4 >= 2:  # the second micro-batch of each step: rank 1's
            r["input_ids"] = [t + 160 for t in r["input_ids"]]
            r["labels"] = [t if t == -100 else t + 160 for t in r["labels"]]
    write_rows(data, rows)
    # The routing is disjoint indeed.
    for ids, experts in ((rows[0:2], set(range(4))), (rows[2:4], set(range(4, 8)))):
        write_rows(tmp_path / "part.jsonl", ids)
        got = ballast_logits(model_dir, str(tmp_path / "part.jsonl"),
                             str(tmp_path / "part.safetensors"))
        for layer in (1, 2):
            assert routed_experts(got[f"router_logits.{layer}"], 2) <= experts
    for method in ("lora", "full"):
        overrides = {"method": method, "gradient_checkpointing": method == "full"}
        one = train_curves(tmp_path, f"n1-{method}", model_dir, data, **overrides)
        two = train_curves(tmp_path, f"n2-{method}", model_dir, data, "--nproc", "2", devices=2,
                           timeout=300, **overrides)
        assert_same_curves(two, one, 1e-5)


EXPERT_PARALLEL = {"moe": {"aux_loss": "micro_batch", "expert_parallel": 2}}


def expert_parallel_curves(tmp_path, name, model_dir, data_path, ranks=2, **overrides):
    """`ranks` ranks whose experts are split over 2 (moe.expert_parallel 2),
    which say so; their curve."""
    spec = base_spec(model_dir, data_path, **{"max_steps": 6, "devices": ranks, **EXPERT_PARALLEL,
                                         **overrides})
    write_spec(tmp_path / f"{name}.yaml", **spec)
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / f"{name}.yaml"), "--out",
                        str(tmp_path / name), "--nproc", str(ranks)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"ballast-train failed ({r.returncode}):\n{r.stderr}"
    assert "experts: 4 of 8 per rank over 2 ranks (moe.expert_parallel)" in r.stderr, r.stderr
    return read_metrics(str(tmp_path / name))


@pytest.mark.parametrize("method", ["lora", "full"])
def test_expert_parallel_equals_one_rank(method, tmp_path):
    """moe.expert_parallel 2: rank 0 computes experts 0-3 and rank 1 experts
    4-7 for both ranks' rows, which cross over an all-to-all both ways, in
    forward and in backward; each expert's gradient is summed on its own
    rank. LoRA adapts every expert (its A and B split with them) and the
    router; full trains the experts' weights."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=26)
    make_dataset(data, n=48, vocab=320, seed=27)
    overrides = {"method": method, "gradient_checkpointing": method == "full"}
    if method == "lora":
        overrides["lora"] = {"target_modules": LINEARS + ["gate"]}
    one = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    two = expert_parallel_curves(tmp_path, "ep2", model_dir, data, **overrides)
    assert_same_curves(two, one, 1e-5)


@pytest.mark.parametrize("routing", ["own", "swapped", "one_rank"])
def test_expert_parallel_with_rows_that_stay_cross_or_all_go_to_one_rank(routing, tmp_path):
    """The disjoint-routing model under moe.expert_parallel 2. own: each
    rank's tokens route only to its own experts, and no row crosses. swapped:
    every row crosses, and a rank keeps none of its own. one_rank: every
    token of both ranks routes to rank 0's experts, and rank 1 computes no
    row, in a grouped GEMM over empty segments, while its experts'
    gradients are zero. None hangs, and each curve is one rank's."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    disjoint_routing_model(model_dir, seed=28)
    rows = make_dataset(data, n=48, vocab=160, seed=29)
    for i, r in enumerate(rows):
        # Rank 0 takes the first micro-batch of each step's two, rank 1 the second.
        shift = {"own": i % 4 >= 2, "swapped": i % 4 < 2, "one_rank": False}[routing]
        if shift:
            r["input_ids"] = [t + 160 for t in r["input_ids"]]
            r["labels"] = [t if t == -100 else t + 160 for t in r["labels"]]
    write_rows(data, rows)
    overrides = {"method": "full", "gradient_checkpointing": True}
    one = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    two = expert_parallel_curves(tmp_path, "ep2", model_dir, data, **overrides)
    assert_same_curves(two, one, 1e-5)


def test_expert_parallel_inside_the_shard_groups_of_hybrid_sharding(tmp_path):
    """4 ranks as 2 replicas x 2 (sharding hybrid, shard_group 2) with
    moe.expert_parallel 2: each shard group splits the experts, and the
    replicas sum their experts' gradient shards once a step, as any other
    shard's. One rank's curve."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=34)
    make_dataset(data, n=48, vocab=320, seed=35)
    overrides = {"method": "full", "data": {"grad_accum_steps": 4}}
    one = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    four = expert_parallel_curves(tmp_path, "hybrid", model_dir, data, ranks=4,
                                  sharding={"strategy": "hybrid", "shard_group": 2}, **overrides)
    assert_same_curves(four, one, 1e-5)


def test_expert_parallel_checkpoints_resume_without_it_and_back(tmp_path):
    """The experts' buckets are the same with expert parallelism and without
    (flat_layout.h): a checkpoint of a moe.expert_parallel run resumes on one
    rank, and one rank's resumes under moe.expert_parallel, each going on as
    the uninterrupted run."""
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=30)
    make_dataset(data, n=48, vocab=320, seed=31)
    overrides = {"method": "full", "checkpoint_every": 3, "guard": {"good_after_steps": 0}}
    ep = expert_parallel_curves(tmp_path, "ep2", model_dir, data, **overrides)
    one = train_curves(tmp_path, "n1", model_dir, data, **overrides)
    for source, target, want in (("ep2", "n1-from-ep2", ep), ("n1", "ep2-from-n1", one)):
        shutil.copytree(tmp_path / source / "checkpoints" / "step-00000003",
                        tmp_path / target / "checkpoints" / "step-00000003")
        if target.startswith("ep2"):
            resumed = expert_parallel_curves(tmp_path, target, model_dir, data, **overrides)
        else:
            resumed = train_curves(tmp_path, target, model_dir, data, **overrides)
        assert [m["step"] for m in resumed] == [4, 5, 6]
        assert_same_curves(resumed, want[3:], 1e-5)


# ---------------------------------------------------------------------------
# What is refused, with exit 2 and the key or tensor named


def refused(tmp_path, model_dir, data, **overrides):
    spec = base_spec(model_dir, data, max_steps=4, **overrides)
    write_spec(tmp_path / "job.yaml", **spec)
    r = run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"), check=False)
    assert r.returncode == 2, (r.returncode, r.stderr)
    return r.stderr


def edit_config(model_dir, edit):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    edit(config)
    with open(path, "w") as f:
        json.dump(config, f)


def edit_tensors(model_dir, edit):
    from safetensors.torch import load_file, save_file
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.__setitem__("num_experts_per_tok", 9),
     "num_experts_per_tok must be <= num_experts (8), got 9"),
    (lambda c: c.__setitem__("moe_intermediate_size", 0), "moe_intermediate_size must be > 0"),
    (lambda c: c.__setitem__("mlp_only_layers", [3]),
     "mlp_only_layers must hold layer indices in 0..2, got 3"),
])
def test_a_bad_expert_config_exits_2_naming_the_key(tmp_path, edit, message):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=26)
    make_dataset(data, n=4, vocab=320, seed=27)
    edit_config(model_dir, edit)
    assert message in refused(tmp_path, model_dir, data)


@pytest.mark.parametrize("devices,sharding,expert_parallel,message", [
    (3, {}, 3, "moe.expert_parallel = 3 does not divide num_experts 8 of "),
    (4, {}, 2, "moe.expert_parallel = 2 is out of range; allowed: 0 or 1 (off), or the ranks "
               "ZeRO-3 shards over: devices, 4"),
    (4, {"strategy": "hybrid", "shard_group": 2}, 4,
     "moe.expert_parallel = 4 is out of range; allowed: 0 or 1 (off), or the ranks ZeRO-3 shards "
     "over: sharding.shard_group, 2"),
])
def test_expert_parallel_over_other_ranks_or_not_dividing_the_experts_exits_2(
        tmp_path, devices, sharding, expert_parallel, message):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=32)
    make_dataset(data, n=4, vocab=320, seed=33)
    overrides = {"devices": devices, "moe": {"expert_parallel": expert_parallel}}
    if sharding:
        overrides["sharding"] = sharding
    assert message in refused(tmp_path, model_dir, data, **overrides)


def test_a_missing_expert_exits_2_naming_the_tensor(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=28)
    make_dataset(data, n=4, vocab=320, seed=29)
    edit_tensors(model_dir, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    stderr = refused(tmp_path, model_dir, data)
    assert "checkpoint has no tensor model.layers.2.mlp.experts.5.up_proj.weight" in stderr, stderr


def test_an_expert_of_the_wrong_shape_exits_2_naming_the_tensor(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model(ARCH, model_dir, seed=30)
    make_dataset(data, n=4, vocab=320, seed=31)
    edit_tensors(model_dir, lambda t: t.__setitem__("model.layers.1.mlp.experts.6.down_proj.weight",
                                                    torch.zeros(64, 40)))
    stderr = refused(tmp_path, model_dir, data)
    assert ("tensor model.layers.1.mlp.experts.6.down_proj.weight has shape [64, 40], "
            "config.json implies [64, 48]") in stderr, stderr
