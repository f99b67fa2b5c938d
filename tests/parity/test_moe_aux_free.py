"""Auxiliary-loss-free load balancing (issue 32, moe.balance aux_free;
DeepSeek-V3, arXiv 2412.19437 section 2.1.2) on the tiny Qwen3-MoE of
reference.py (8 experts, top-2, layers 1 and 2 sparse), fp32:

- the update rule: the biases ballast-train checkpoints after each step equal
  a replay in transformers 4.57.6 whose sparse blocks choose topk(p + b) and
  weight by p, with b moved by rate * sign(mean load - load) from the replay's
  own loads. The replay runs at a learning rate of 1e-12, so that the weights
  stay those of the model folder and only the biases move the routing (which
  they do: the check of that is part of the test);
- GA 4x1 = 1x4 and `--nproc 2` = 1 rank: the same biases, and the same curves
  (a rank whose biases differed would route, and so train, otherwise);
- a resume from a checkpoint continues the uninterrupted run exactly, and a
  guard rollback puts the biases back with the weights;
- the export carries the biases under DeepSeek-V3's name, and the log says so;
  a LoRA job writes them beside its adapter, and merge folds them in; a
  skipped step leaves them alone;
- on a router made to collapse onto one expert, aux_free brings the max/mean
  load down where no balancing leaves it.
"""
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference import (TRAIN, base_spec, make_dataset, make_model, read_metrics, run_train,
                       write_spec)

ARCH = "qwen3_moe"
K = 2
E = 8
SPARSE = (1, 2)
RATE = 0.05


def bias_name(layer):
    return f"model.layers.{layer}.mlp.gate.e_score_correction_bias"


def spec_for(model_dir, data, max_steps, moe=None, devices=1, **data_keys):
    return base_spec(model_dir, data, max_steps=max_steps, method="full", devices=devices,
                     data={"micro_batch_size": 1, "grad_accum_steps": 4, **data_keys},
                     moe=moe if moe is not None else {"balance": "aux_free",
                                                      "aux_free_rate": RATE})


def train(tmp_path, name, spec, *extra):
    path = tmp_path / f"{name}.yaml"
    write_spec(path, **spec)
    r = run_train(str(path), str(tmp_path / name), *extra)
    return read_metrics(tmp_path / name), r.stdout + r.stderr


def exported_biases(out_dir):
    tensors = load_file(os.path.join(out_dir, "model", "model.safetensors"))
    return [tensors[bias_name(layer)] for layer in SPARSE]


def checkpoint_biases(out_dir, step):
    tensors = load_file(os.path.join(out_dir, "checkpoints", f"step-{step:08d}",
                                     "buffers.safetensors"))
    return [tensors[bias_name(layer)] for layer in SPARSE]


class BiasedRouting:
    """Makes each sparse block of transformers' `model` choose topk(p + b)
    and weight by the unbiased p (renormalised, norm_topk_prob), recording
    every token's choices per layer; `step` then moves b as the rule says."""

    def __init__(self, model):
        self.model = model
        self.bias = [torch.zeros(E) for _ in SPARSE]
        self.chosen = [[] for _ in SPARSE]
        for i, layer in enumerate(SPARSE):
            block = model.model.layers[layer].mlp
            block.forward = self._forward(i, block)

    def _forward(self, i, block):
        def forward(hidden_states):
            b, s, h = hidden_states.shape
            x = hidden_states.view(-1, h)
            logits = block.gate(x)
            p = torch.softmax(logits, dim=1, dtype=torch.float)
            selected = torch.topk(p + self.bias[i], K, dim=-1).indices
            w = p.gather(-1, selected)
            w = w / w.sum(-1, keepdim=True)
            every = torch.stack([expert(x) for expert in block.experts])  # (E, T, H)
            rows = torch.arange(x.shape[0])
            out = sum(w[:, j, None] * every[selected[:, j], rows] for j in range(K))
            self.chosen[i].append(selected)
            return out.view(b, s, h), logits
        return forward

    def step(self, rows):
        """Routes one optimizer step's documents (each alone, as rows without
        packing are) and moves the biases by their loads."""
        self.chosen = [[] for _ in SPARSE]
        with torch.no_grad():
            for r in rows:
                self.model(torch.tensor([r["input_ids"]]))
        for i in range(len(SPARSE)):
            load = torch.bincount(torch.cat(self.chosen[i]).flatten(), minlength=E).double()
            self.bias[i] = self.bias[i] + (torch.sign(load.mean() - load) * RATE).float()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-aux-free")
    model = make_model(ARCH, str(tmp / "model"), seed=21)
    rows = make_dataset(tmp / "docs.jsonl", n=24, vocab=320, seed=22, max_len=40)
    return model, str(tmp / "model"), str(tmp / "docs.jsonl"), rows


def test_biases_follow_a_transformers_replay_of_each_steps_routing(inputs, tmp_path):
    model, model_dir, data, rows = inputs
    steps = 5
    spec = spec_for(model_dir, data, steps)
    spec["optimizer"] = {"lr": 1e-12, "weight_decay": 0.0, "max_grad_norm": 1.0}
    spec["checkpoint_every"] = 1
    metrics, log = train(tmp_path, "replay", spec)
    assert len(metrics) == steps
    assert "load balancing: aux_free (a per-expert routing bias, rate 0.05" in log
    assert "from zero)" in log
    assert "(measured and reported, not trained on)" in log
    # aux_free still reports the load metrics and the aux loss.
    assert all(len(m["moe"]["layers"]) == 2 and m["aux_loss"] > 0 for m in metrics)

    replay = BiasedRouting(model)
    unbiased_choices = None
    for step in range(1, steps + 1):
        replay.step(rows[4 * (step - 1):4 * step])
        got = checkpoint_biases(tmp_path / "replay", step)
        for layer, want, have in zip(SPARSE, replay.bias, got):
            assert torch.equal(have, want), (step, layer, have, want)
        if step == 1:
            unbiased_choices = [torch.cat(c) for c in replay.chosen]
    # The biases moved the routing: step 1's documents routed with the final
    # biases choose otherwise than with none.
    replay.step(rows[:4])
    assert any(not torch.equal(a, torch.cat(b)) for a, b in zip(unbiased_choices, replay.chosen))
    # Nothing else moved them: the biases are not the trained parameters'.
    assert all(b.abs().max() > 0 for b in replay.bias)

    # The export holds the last step's biases under DeepSeek-V3's name.
    for have, want in zip(exported_biases(tmp_path / "replay"),
                          checkpoint_biases(tmp_path / "replay", steps)):
        assert torch.equal(have, want)
    assert "e_score_correction_bias (DeepSeek-V3's name" in log
    # transformers' Qwen3-MoE loads the export, leaving the biases unused.
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "replay" / "model"))


def test_ga_4x1_equals_1x4_and_two_ranks_equal_one(inputs, tmp_path):
    _, model_dir, data, _ = inputs
    runs = {
        "1x4": spec_for(model_dir, data, 4),
        "4x1": spec_for(model_dir, data, 4, micro_batch_size=4, grad_accum_steps=1),
        "n2": spec_for(model_dir, data, 4, devices=2),
    }
    curves = {}
    for name, spec in runs.items():
        extra = ("--nproc", "2") if name == "n2" else ()
        curves[name], _ = train(tmp_path, name, spec, *extra)
    want = exported_biases(tmp_path / "1x4")
    assert all(b.abs().max() > 0 for b in want)
    # An aux_free job from that export goes on from its biases.
    again = spec_for(str(tmp_path / "1x4" / "model"), data, 1)
    again["schedule"] = {"kind": "cosine", "warmup_steps": 0}
    _, log = train(tmp_path, "again", again)
    assert "from the model folder's biases" in log, log
    for have, w in zip(checkpoint_biases(tmp_path / "again", 1), want):
        assert (have - w).abs().max() <= RATE * 1.0001 and not torch.equal(have, w)
    for name in ("4x1", "n2"):
        for have, w in zip(exported_biases(tmp_path / name), want):
            assert torch.equal(have, w), (name, have, w)
        for key in ("loss", "grad_norm"):
            a = [m[key] for m in curves["1x4"]]
            b = [m[key] for m in curves[name]]
            assert max(abs(x - y) / abs(y) for x, y in zip(a, b)) <= 1e-5, (name, key, a, b)


def test_resume_from_a_checkpoint_continues_the_uninterrupted_run(inputs, tmp_path):
    _, model_dir, data, _ = inputs
    spec = spec_for(model_dir, data, 6)
    spec["checkpoint_every"] = 3
    # Good as soon as written, so that a resume may start from it.
    spec["guard"] = {"good_after_steps": 0}
    full, _ = train(tmp_path, "full", spec)
    # A run that stopped after step 3: its out dir holds that checkpoint only.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-00000003",
                    resumed_dir / "checkpoints" / "step-00000003")
    assert any(b.abs().max() > 0 for b in checkpoint_biases(resumed_dir, 3))
    resumed, log = train(tmp_path, "resumed", spec)
    assert [m["step"] for m in resumed] == [4, 5, 6], log
    for key in ("loss", "grad_norm", "aux_loss"):
        assert [m[key] for m in resumed] == pytest.approx([m[key] for m in full[3:]],
                                                          rel=1e-6), key
    for have, want in zip(exported_biases(resumed_dir), exported_biases(tmp_path / "full")):
        assert torch.equal(have, want)
    # The resumed run would differ without the step-3 biases: zero them and
    # the same resume takes another course.
    zeroed_dir = tmp_path / "zeroed"
    shutil.copytree(resumed_dir / "checkpoints", zeroed_dir / "checkpoints")
    buffers = zeroed_dir / "checkpoints" / "step-00000003" / "buffers.safetensors"
    save_file({k: torch.zeros_like(v) for k, v in load_file(str(buffers)).items()}, str(buffers))
    zeroed, _ = train(tmp_path, "zeroed", spec)
    assert [m["loss"] for m in zeroed] != pytest.approx([m["loss"] for m in full[3:]], rel=1e-6)


def test_aux_free_brings_a_collapsed_routers_load_down(tmp_path):
    """A router pushed towards expert 0 for most tokens (its row gains the
    mean direction of the layer's inputs), every step the same 16 documents:
    without balancing the max/mean load stays where it starts; aux_free
    brings it down step by step. The rate is small for the softmax's
    near-zero second choices: at 0.05 and above, each sign update moves
    many tokens' near-tied second choice at once, and the load jumps
    between steps (seen here: 0.1 swings between 1.6 and 3.6)."""
    model = make_model(ARCH, str(tmp_path / "model"), seed=21)
    rows = make_dataset(tmp_path / "docs.jsonl", n=16, vocab=320, seed=23, max_len=40)
    inputs = {layer: [] for layer in SPARSE}
    hooks = [model.model.layers[layer].mlp.gate.register_forward_hook(
        lambda module, args, out, layer=layer: inputs[layer].append(args[0].detach()))
        for layer in SPARSE]
    with torch.no_grad():
        for r in rows:
            model(torch.tensor([r["input_ids"]]))
    for h in hooks:
        h.remove()
    tensors = load_file(str(tmp_path / "model" / "model.safetensors"))
    for layer in SPARSE:
        mean = torch.cat(inputs[layer]).mean(0)
        tensors[f"model.layers.{layer}.mlp.gate.weight"][0] += 4 * mean / (mean @ mean)
    save_file(tensors, str(tmp_path / "model" / "model.safetensors"), metadata={"format": "pt"})

    steps = 20
    ratio = {}
    for name, moe in (("none", {"balance": "aux_loss", "router_aux_loss_coef": 0.0}),
                      ("aux_free", {"balance": "aux_free", "aux_free_rate": 0.02})):
        spec = spec_for(str(tmp_path / "model"), str(tmp_path / "docs.jsonl"), steps, moe=moe,
                        micro_batch_size=4, grad_accum_steps=4)
        spec["optimizer"] = {"lr": 1e-4, "weight_decay": 0.0, "max_grad_norm": 1.0}
        metrics, _ = train(tmp_path, name, spec)
        ratio[name] = [m["moe"]["expert_load_max_ratio"] for m in metrics]
    # The same start (~2.5 of E/k = 4); no balancing keeps it.
    assert ratio["none"][0] > 2 and ratio["aux_free"][0] == ratio["none"][0], ratio
    assert min(ratio["none"]) > 0.9 * ratio["none"][0], ratio
    assert max(ratio["aux_free"][-3:]) < 0.8 * min(ratio["none"][-3:]), ratio


def test_a_step_the_guard_skips_leaves_the_biases_alone(inputs, tmp_path):
    _, model_dir, data, _ = inputs
    spec = spec_for(model_dir, data, 4)
    spec["checkpoint_every"] = 1
    spec["guard"] = {"inject": {"nan_grad_at_step": [3]}, "rerun_bad_step": False}
    metrics, _ = train(tmp_path, "skip", spec)
    assert [m.get("skipped", False) for m in metrics] == [False, False, True, False], metrics
    biases = [checkpoint_biases(tmp_path / "skip", step) for step in (2, 3, 4)]
    assert all(torch.equal(a, b) for a, b in zip(biases[0], biases[1]))
    assert any(not torch.equal(a, b) for a, b in zip(biases[1], biases[2]))


def test_a_lora_job_writes_the_biases_beside_its_adapter_and_merge_folds_them_in(inputs, tmp_path):
    _, model_dir, data, _ = inputs
    spec = spec_for(model_dir, data, 3)
    spec["method"] = "lora"
    metrics, log = train(tmp_path, "lora", spec)
    adapter = tmp_path / "lora" / "adapter"
    assert "beside the adapter; merge folds them into the model" in log, log
    beside = load_file(str(adapter / "routing_bias.safetensors"))
    want = checkpoint_biases(tmp_path / "lora", 3)
    assert sorted(beside) == [bias_name(layer) for layer in SPARSE]
    assert all(torch.equal(beside[bias_name(layer)], w) for layer, w in zip(SPARSE, want))
    assert all(w.abs().max() > 0 for w in want)
    r = subprocess.run([TRAIN, "merge", "--model", model_dir, "--adapter", str(adapter), "--out",
                        str(tmp_path / "merged")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert all(torch.equal(merged[bias_name(layer)], w) for layer, w in zip(SPARSE, want))


def test_a_rollback_puts_the_biases_back_with_the_weights(inputs, tmp_path):
    """A spike at step 10 rolls back to the snapshot of step 6, past the
    documents of steps 7 to 10. At a learning rate of 1e-12 the biases
    alone move the routing, so the replay of what the run did (steps 1-6,
    then 7-12 on the documents after the skipped ones) gives the final
    biases; without the rollback restoring them, steps 7-9's updates would
    stay in them."""
    model, model_dir, data, rows = inputs
    spec = spec_for(model_dir, data, 12)
    spec["optimizer"] = {"lr": 1e-12, "weight_decay": 0.0, "max_grad_norm": 1.0}
    spec["guard"] = {"snapshot_every": 2, "good_after_steps": 2, "spike_window": 8,
                     "loss_spike_zscore": 20, "inject": {"spike_at_step": [10]}}
    metrics, log = train(tmp_path, "rollback", spec)
    assert [m["step"] for m in metrics] == list(range(1, 13)), log
    assert "rolled back" in log.lower() or "roll back" in log.lower(), log

    replay = BiasedRouting(make_model(ARCH, str(tmp_path / "model"), seed=21))
    documents = list(range(24)) + list(range(40, 64))
    for step in range(12):
        replay.step([rows[d % len(rows)] for d in documents[4 * step:4 * step + 4]])
    for have, want in zip(exported_biases(tmp_path / "rollback"), replay.bias):
        assert torch.equal(have, want), (have, want)
