"""Load balancing of a Mixture of Experts across a whole optimizer step
(issue 32, item 3): ballast-train's aux loss against the float64 reference
(load_balancing_reference.py) on transformers 4.57.6's router logits, and the
equivalences global-batch balancing promises where micro-batch balancing
cannot.

- moe.aux_loss global counts f and P over every token of the step: step 1's
  aux loss equals the reference over the step's documents, in both scopes;
  micro_batch equals the mean of the micro-batches' losses.
- GA 4x1 = 1x4 (four micro-batches of one row against one of four rows) in
  global mode, curves included; in micro_batch mode the aux loss differs.
- `--nproc 2` = 1 rank in global mode.
- Packed = unpacked: the same documents in one packed row or one row each
  give the same curve, aux loss included, in both modes.
- The routing pre-pass (global mode, more than one micro-batch a rank) routes
  as the step's forwards then do, in every run here: layer by layer without
  dropout, each micro-batch in turn with LoRA dropout (the trainer compares
  the two counts and warns when they differ).

The model is reference.QWEN3_MOE (8 experts, top-2, layer 0 dense), fp32.
"""
import pytest
import torch

import load_balancing_reference as lb
from reference import (base_spec, make_dataset, make_model, read_metrics, relative_error,
                       run_train, write_rows, write_spec)

ARCH = "qwen3_moe"
K = 2
# fp32 sums in another order (a pre-pass, a reduction over ranks): ~1e-7.
TOLERANCE = 1e-5
PRE_PASS_DIFFERED = "the routing pre-pass chose other experts"


def hf_router_logits(model, rows):
    """Per sparse layer, the router logits of each document run alone."""
    with torch.no_grad():
        return [model(torch.tensor([r["input_ids"]]), output_router_logits=True).router_logits
                for r in rows]


def as_micro_batch(per_doc):
    """One micro-batch of the reference: the documents' tokens concatenated
    per layer, every token counted."""
    layers = [torch.cat([d[i] for d in per_doc]) for i in range(len(per_doc[0]))]
    return layers, torch.ones(layers[0].shape[0])


def train(tmp_path, name, model_dir, data, *extra, moe=None, devices=1, **data_keys):
    spec = base_spec(model_dir, data, max_steps=4, method="full", devices=devices,
                     data={"micro_batch_size": 1, "grad_accum_steps": 4, **data_keys},
                     moe=moe or {})
    spec_path = tmp_path / f"{name}.yaml"
    write_spec(spec_path, **spec)
    r = run_train(str(spec_path), str(tmp_path / name), *extra)
    assert PRE_PASS_DIFFERED not in r.stderr + r.stdout, r.stderr
    return read_metrics(tmp_path / name)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-balancing")
    model = make_model(ARCH, str(tmp / "model"), seed=11)
    rows = make_dataset(tmp / "docs.jsonl", n=32, vocab=320, seed=12, max_len=60)
    return model, str(tmp / "model"), str(tmp / "docs.jsonl"), rows


@pytest.mark.parametrize("scope", ["all_layers", "per_layer"])
def test_step_ones_aux_loss_is_the_float64_reference_over_the_step(scope, inputs, tmp_path):
    model, model_dir, data, rows = inputs
    per_doc = hf_router_logits(model, rows[:4])
    # Two micro-batches of two rows, each row one document (no packing).
    micro_batches = [as_micro_batch(per_doc[:2]), as_micro_batch(per_doc[2:4])]
    for mode in ("global", "micro_batch"):
        got = train(tmp_path, f"{mode}-{scope}", model_dir, data,
                    moe={"aux_loss": mode, "aux_loss_scope": scope},
                    micro_batch_size=2, grad_accum_steps=2)[0]["aux_loss"]
        want = lb.aux_loss(micro_batches, K, mode=mode, scope=scope).item()
        assert abs(got - want) <= TOLERANCE * abs(want), (mode, scope, got, want)


def test_ga_4x1_equals_1x4_in_global_mode_and_not_in_micro_batch_mode(inputs, tmp_path):
    _, model_dir, data, _ = inputs
    curves = {}
    for mode in ("global", "micro_batch"):
        for mbs, ga in ((1, 4), (4, 1)):
            curves[mode, mbs] = train(tmp_path, f"{mode}-{mbs}x{ga}", model_dir, data,
                                      moe={"aux_loss": mode}, micro_batch_size=mbs,
                                      grad_accum_steps=ga)
    for key in ("loss", "aux_loss", "grad_norm"):
        a = [m[key] for m in curves["global", 1]]
        b = [m[key] for m in curves["global", 4]]
        assert relative_error(a, b) <= TOLERANCE, (key, a, b)
    # micro_batch: each forward's own f and P, averaged; one forward of four
    # rows is another loss.
    a = curves["micro_batch", 1][0]["aux_loss"]
    b = curves["micro_batch", 4][0]["aux_loss"]
    assert abs(a - b) > 1e-3 * abs(b), (a, b)
    # One micro-batch of the step is all of it: both modes agree there.
    assert abs(curves["micro_batch", 4][0]["aux_loss"] - curves["global", 4][0]["aux_loss"]) \
        <= TOLERANCE * abs(b)


@pytest.mark.parametrize("last_layer,experts", [("sparse", "gathered"), ("dense", "gathered"),
                                                ("sparse", "expert_parallel")])
def test_two_ranks_equal_one_in_global_mode(last_layer, experts, inputs, tmp_path):
    """With the last layer dense the pre-pass ends before it, and ZeRO-3 must
    not gather it ahead: a layer gathered and never run would keep one of the
    slabs the next forward needs. Under moe.expert_parallel the pre-pass's
    forwards exchange their rows too, layer by layer, and route as the
    training forwards do."""
    _, model_dir, data, _ = inputs
    if last_layer == "dense":
        model_dir = str(tmp_path / "dense-last")
        make_model(ARCH, model_dir, seed=11, mlp_only_layers=[0, 2])
    one = train(tmp_path, "n1", model_dir, data)
    two = train(tmp_path, "n2", model_dir, data, "--nproc", "2", devices=2,
                moe={"expert_parallel": 2} if experts == "expert_parallel" else None)
    for key in ("loss", "aux_loss", "grad_norm"):
        a, b = [m[key] for m in one], [m[key] for m in two]
        assert relative_error(a, b) <= TOLERANCE, (key, a, b)


@pytest.mark.parametrize("mode", ["global", "micro_batch"])
def test_packed_equals_unpacked(mode, inputs, tmp_path):
    """Four documents (under 240 tokens) are each step's whole batch: one
    packed row of 256 tokens, or four rows of one document each. Each
    document's tokens count once in f and P either way, and its padding
    never; the step is one forward, so micro_batch mode must agree too."""
    _, model_dir, _, rows = inputs
    data = str(tmp_path / "four.jsonl")
    write_rows(data, rows[:4])
    packed = train(tmp_path, f"packed-{mode}", model_dir, data, moe={"aux_loss": mode},
                   packing=True, seq_len=256, micro_batch_size=1, grad_accum_steps=1)
    unpacked = train(tmp_path, f"unpacked-{mode}", model_dir, data, moe={"aux_loss": mode},
                     seq_len=256, micro_batch_size=4, grad_accum_steps=1)
    assert [m["supervised_tokens"] for m in packed] == [m["supervised_tokens"] for m in unpacked]
    for key in ("loss", "aux_loss", "grad_norm"):
        a, b = [m[key] for m in packed], [m[key] for m in unpacked]
        assert relative_error(a, b) <= TOLERANCE, (key, a, b)


def test_the_pre_pass_replays_lora_dropout(inputs, tmp_path):
    """With LoRA dropout the routing depends on the masks: the pre-pass must
    draw each micro-batch's as its training forward will (the experts'
    adapters learn fast here, so other masks route some token otherwise)."""
    _, model_dir, data, _ = inputs
    spec = base_spec(model_dir, data, max_steps=6, lora={"lora_dropout": 0.3},
                     optimizer={"lr": 3e-2}, moe={},
                     data={"micro_batch_size": 1, "grad_accum_steps": 4})
    write_spec(tmp_path / "dropout.yaml", **spec)
    r = run_train(str(tmp_path / "dropout.yaml"), str(tmp_path / "dropout"))
    log = r.stderr + r.stdout
    assert "of each micro-batch in turn, as LoRA dropout draws its masks" in log, log
    assert PRE_PASS_DIFFERED not in log, log
    assert len(read_metrics(tmp_path / "dropout")) == 6


def test_block_diffusion_on_a_tiny_moe_learns_and_balances_the_noisy_half(inputs, tmp_path):
    """The seed's failure was a loss of exactly 0 with grad_norm pinned at
    1.414 on SDAR-30B-A3B: on a tiny MoE, block diffusion's loss is never 0,
    grad_norm moves, and the trainer says which half the aux loss counts."""
    _, model_dir, data, _ = inputs
    spec = base_spec(model_dir, data, max_steps=12, task="block_diffusion",
                     block_diffusion={"block_length": 4, "mask_token_id": 319},
                     data={"packing": True, "seq_len": 128}, moe={})
    write_spec(tmp_path / "bd.yaml", **spec)
    r = run_train(str(tmp_path / "bd.yaml"), str(tmp_path / "bd"))
    assert "counts the noisy half x_t of each document only" in r.stderr + r.stdout
    assert PRE_PASS_DIFFERED not in r.stderr + r.stdout
    metrics = read_metrics(tmp_path / "bd")
    assert len(metrics) == 12
    assert all(m["loss"] is not None and m["loss"] > 0 for m in metrics), metrics
    assert all(m["aux_loss"] > 0 for m in metrics), metrics
    norms = [m["grad_norm"] for m in metrics]
    assert max(norms) - min(norms) > 1e-3 * max(norms), norms
    assert all(len(m["moe"]["layers"]) == 2 for m in metrics)
