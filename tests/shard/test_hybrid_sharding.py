"""Hybrid sharding (sharding.strategy hybrid, HSDP) across real ballast-train
processes over c10d Gloo: 4 ranks as 2 replicas x shard groups of 2 give the
single process's curve, send across the replica dimension nothing but the
allreduce of their gradient shards, write checkpoints that load into
ZeRO-3 at another world size and back, and validate and roll back as ZeRO-3
does, under ballast-train's own launcher (--nproc)."""
import json
import os
import re
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_sharded_training import (TOLERANCE, assert_same_curves, inputs, job,  # noqa: E402,F401
                                   load_safetensors, read_metrics, relative_error, train)

HYBRID = ("--set", "sharding.strategy=hybrid", "--set", "sharding.shard_group=2")


def replica_allreduce_bytes(layout, replicas):
    """What a ring allreduce of one rank's fp32 gradient shards sends: 2
    passes of (M - 1) / M of them, each bucket's shard its numel over the
    shard group's size, rounded up (the padding)."""
    group = layout["world_size"]
    shard_bytes = sum(4 * -(-b["numel"] // group) for b in layout["buckets"])
    return 2 * shard_bytes * (replicas - 1) // replicas


@pytest.mark.parametrize("method", ["lora", "full"])
def test_two_replicas_of_two_ranks_reproduce_one_process(inputs, tmp_path, method):
    spec = job(inputs, tmp_path, "qwen3", method, checkpoint_every=20)
    train(spec, tmp_path / "n1", 1)
    logs = train(spec, tmp_path / "hybrid", 4, *HYBRID)
    for rank, log in enumerate(logs):
        assert (f"rank {rank} of 4 on cpu (fp32) as rank {rank % 2} of shard group {rank // 2} "
                "(2 replicas of 2 ranks) holds") in log, log
    reference = read_metrics(str(tmp_path / "n1"))
    hybrid = read_metrics(str(tmp_path / "hybrid"))
    # fp32 sums in another grouping (per rank, in the shard group, across
    # the replicas): rounding only.
    assert_same_curves(reference, hybrid, TOLERANCE)

    # Across the replicas, per step: the gradient shards' allreduce, to the
    # byte, by the counters every collective goes through; the gathers and
    # reduce-scatters stay inside the shard group.
    layout = json.loads(
        (tmp_path / "hybrid" / "checkpoints" / "step-00000020" / "layout.json").read_text())
    assert layout["world_size"] == 2
    expected = replica_allreduce_bytes(layout, replicas=2)
    assert expected > 0
    for m in hybrid:
        assert m["replica_communicated_bytes"] == expected, m
        assert m["communicated_bytes"] > 2 * expected, m
    # ZeRO-3 over the same 4 ranks has no replicas.
    train(spec, tmp_path / "zero3", 4)
    assert all(m["replica_communicated_bytes"] == 0
               for m in read_metrics(str(tmp_path / "zero3")))


def resume(spec, checkpoint, metrics, out, world_size, *extra):
    """Trains `spec` into `out` from `checkpoint` (a step folder), with the
    metrics of the run that wrote it."""
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(checkpoint, out / "checkpoints" / checkpoint.name)
    shutil.copy(metrics, out / "metrics.jsonl")
    train(spec, out, world_size, *extra)
    return read_metrics(str(out))


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_hybrid_checkpoint_reshards_to_zero3_at_three_ranks_and_back(inputs, tmp_path, method):
    # Twelve micro-batches a step: 4 and 3 ranks both take an equal share.
    spec = job(inputs, tmp_path, "llama", method, max_steps=6, checkpoint_every=2,
               data={"grad_accum_steps": 12, "micro_batch_size": 1})
    train(spec, tmp_path / "hybrid", 4, *HYBRID)
    uninterrupted = read_metrics(str(tmp_path / "hybrid"))
    step2 = tmp_path / "hybrid" / "checkpoints" / "step-00000002"
    # The first replica writes the shards; the second its generators only.
    assert sorted(f for f in os.listdir(step2) if f.endswith(".safetensors")) == [
        "rank-0.safetensors", "rank-1.safetensors", "rng-2.safetensors", "rng-3.safetensors"]
    assert json.loads((step2 / "layout.json").read_text())["world_size"] == 2
    assert set(load_safetensors(str(step2 / "rng-3.safetensors"))) == {"__rng__"}

    zero3 = resume(spec, step2, tmp_path / "hybrid" / "metrics.jsonl", tmp_path / "zero3-n3", 3)
    assert_same_curves(uninterrupted, zero3, TOLERANCE)
    step4 = tmp_path / "zero3-n3" / "checkpoints" / "step-00000004"
    assert json.loads((step4 / "layout.json").read_text())["world_size"] == 3
    back = resume(spec, step4, tmp_path / "zero3-n3" / "metrics.jsonl", tmp_path / "back", 4,
                  *HYBRID)
    assert_same_curves(uninterrupted, back, TOLERANCE)

    export = "adapter/adapter_model.safetensors" if method == "lora" else "model/model.safetensors"
    want = load_safetensors(str(tmp_path / "hybrid" / export))
    got = load_safetensors(str(tmp_path / "back" / export))
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert (got[name] - t).abs().max().item() <= 1e-4 * max(1.0, t.abs().max().item()), name


def test_a_nan_on_either_replica_skips_the_step_on_every_rank(inputs, tmp_path):
    """After the replicas' allreduce every replica holds the same gradients,
    and grad_norm counts the first's: a NaN written into the second replica's
    own copy must still reach the guard (it adds 0 x NaN = NaN), or that
    replica alone would step on it and the replicas would part."""
    curves = {}
    for rank in (1, 3):  # the first replica's, the second's
        spec = job(inputs, tmp_path, "llama", "lora", max_steps=4,
                   guard={"inject": {"nan_grad_at_step": [2], "on_rank": rank}})
        out = tmp_path / f"nan-on-{rank}"
        train(spec, out, 4, *HYBRID)
        rows = read_metrics(str(out))
        assert [r["skipped"] for r in rows] == [False, True, False, False], rows
        assert f"on rank {rank};" in rows[1]["skip_reason"], rows[1]["skip_reason"]
        curves[rank] = rows
    # The same step skipped the same way: the replicas stayed equal after it.
    assert_same_curves(curves[1], curves[3], TOLERANCE, steps={1, 3, 4})


def test_evaluation_and_a_rollback_run_hybrid_as_they_run_on_zero3(inputs, tmp_path):
    """Around the steps: validation (every replica's forward gathers inside
    its shard group) and a guard rollback (every replica restores its
    snapshot alike), against ZeRO-3 over the same 4 ranks: the same steps
    kept, the same training and validation curves. The hybrid job's ranks
    are ballast-train's own (--nproc), as one node runs them."""
    spec = job(inputs, tmp_path, "llama", "lora", max_steps=10,
               eval={"fraction": 0.1, "every": 3},
               guard={"snapshot_every": 2, "good_after_steps": 2,
                      "inject": {"nan_grad_at_step": [5, 6, 7], "on_rank": 3}})
    runs = {}
    for name, world_size, extra in (("zero3", 4, ()),
                                    ("hybrid", 1, ("--nproc", "4", "--set", "devices=4", *HYBRID))):
        log = train(spec, tmp_path / name, world_size, *extra)[0]
        assert re.search(r"guard rollback at step 7: .* rolled back to step 2", log), log
        assert ("(2 replicas of 2 ranks)" in log) == (name == "hybrid"), log
        runs[name] = read_metrics(str(tmp_path / name))
    steps = {name: [m for m in rows if "eval" not in m] for name, rows in runs.items()}
    evals = {name: [m["eval"] for m in rows if "eval" in m] for name, rows in runs.items()}
    assert [m["step"] for m in steps["hybrid"]] == list(range(1, 11))
    assert not any(m["skipped"] for m in steps["hybrid"])
    assert_same_curves(steps["zero3"], steps["hybrid"], TOLERANCE)
    # Before step 1, at steps 3, 6 and 9, and at the end.
    assert [e["step"] for e in evals["hybrid"]] == [e["step"] for e in evals["zero3"]]
    assert len(evals["hybrid"]) >= 4
    for a, b in zip(evals["zero3"], evals["hybrid"]):
        assert relative_error(b["loss"], a["loss"]) <= TOLERANCE, (a, b)
