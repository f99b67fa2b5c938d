"""task: generative_reranker end to end with ballast-train (issue 17): a
LoRA reranker on the tiny random Qwen3, on a synthetic task it can learn in
30 steps (reference.make_reranker_groups), with the reranker prompt, its
groups packed whole."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
from reference import (TRAIN, base_spec, make_model, make_reranker_groups,  # noqa: E402
                       read_metrics, write_spec)
from test_chat_template import QWEN3  # noqa: E402
from trained_tokenizers import write_chat_tokenizer  # noqa: E402

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "model")
    make_model("qwen3", path, seed=1)
    write_chat_tokenizer(path, QWEN3)
    return path


def reranker_spec(model, data, **reranker):
    # The tiny tokenizer is nearly byte-level and the tiny model reads 256
    # positions: a short prompt keeps a group of four candidates in a row.
    return base_spec(model, data, task="generative_reranker", max_steps=30,
                     data={"seq_len": 256, "packing": True, "micro_batch_size": 2,
                           "grad_accum_steps": 2, "shuffle": True},
                     optimizer={"lr": 1e-2, "max_grad_norm": 1.0},
                     reranker={"loss": "listwise", "prefix": "<|im_start|>", "instruction": "f",
                               "suffix": "<|im_end|>\n", "yes_token": "y",
                               "no_token": "n", **reranker})


@pytest.mark.parametrize("loss,shape", [("listwise", "mteb"), ("pointwise", "swift")])
def test_a_reranker_job_trains_with_finite_gradients_and_a_falling_loss(model, tmp_path, loss,
                                                                        shape):
    data, held_out = str(tmp_path / "groups.jsonl"), str(tmp_path / "held-out.jsonl")
    make_reranker_groups(data, 64, seed=5, shape=shape)
    make_reranker_groups(held_out, 16, seed=6, shape=shape)
    write_spec(tmp_path / "job.yaml", **reranker_spec(model, data, loss=loss, eval_path=held_out,
                                                      eval_every=10))
    out = str(tmp_path / "out")
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", out],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "as reranker (detected from its first record)" in r.stderr
    lines = read_metrics(out)
    steps = [m for m in lines if "eval" not in m]
    assert len(steps) == 30
    assert all(math.isfinite(s["grad_norm"]) and s["loss"] is not None for s in steps)
    # Listwise normalises by groups (two a step), pointwise by candidates.
    # Normalised by groups (listwise) or candidates (pointwise): a group of
    # four candidates fills most of a 256-token row, so a step's 4 rows hold
    # 4 groups, 16 candidates.
    assert all(s["supervised_tokens"] == (4 if loss == "listwise" else 16) for s in steps), [
        s["supervised_tokens"] for s in steps]
    first = sum(s["loss"] for s in steps[:6]) / 6
    last = sum(s["loss"] for s in steps[-6:]) / 6
    assert last < 0.5 * first, [round(s["loss"], 3) for s in steps]
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    # Ranked before the first step, every 10 steps and at the end (step 30
    # once): MRR@10 rises from chance (about 0.52 for four candidates).
    evals = re.findall(r"eval step (\d+): MRR@10 ([0-9.]+), NDCG@10 ([0-9.]+) over 16 held-out",
                       r.stderr)
    assert [int(step) for step, _, _ in evals] == [0, 10, 20, 30], r.stderr
    mrr = [float(m) for _, m, _ in evals]
    assert mrr[-1] > mrr[0] and mrr[-1] > 0.9, mrr
    # metrics.jsonl has each evaluation after its step's line, as a causal
    # LM's validation loss is (README "Validation").
    logged = [(m["step"], m["eval"]) for m in lines if "eval" in m]
    assert [(step, f"{e['mrr_at_10']:.4f}", f"{e['ndcg_at_10']:.4f}") for step, e in logged] == \
        [(int(step), m, n) for step, m, n in evals], (logged, evals)
    assert all(e["groups"] == 16 and e["loss"] is None and e["time_s"] > 0 for _, e in logged)
    assert [m["step"] for m in lines] == [0] + [s for s in range(1, 31)
                                               for _ in range(1 + (s % 10 == 0))]

    # The exported adapter scores the held-out pairs as the last evaluation
    # ranked them, rendered with the job's prompt (--spec).
    with open(held_out, "a") as f:
        f.write(json.dumps({"query": "apple", "documents": ["an apple a day", "stone"]}) + "\n")
        f.write("not json\n")
    r = subprocess.run([TRAIN, "rerank", "--model", model, "--adapter",
                        os.path.join(out, "adapter"), "--queries", held_out, "--spec",
                        str(tmp_path / "job.yaml")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr  # the bad line
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 18
    assert all(len(x["scores"]) == 4 and all(0 <= p <= 1 for p in x["scores"]) for x in lines[:16])
    assert lines[16]["scores"][0] > lines[16]["scores"][1]
    assert lines[17]["error"].startswith("line 18: not a JSON object")
    final = re.search(r"MRR@10 ([0-9.]+), NDCG@10 [0-9.]+ over 16 queries", r.stderr)
    assert final and abs(float(final.group(1)) - mrr[-1]) < 1e-3, (r.stderr, mrr)


@pytest.mark.parametrize("key,value,message", [
    ("reranker.loss", "ranknet", "reranker.loss"),
    ("reranker.max_negatives", "-1", "reranker.max_negatives = -1 is out of range"),
    ("data.format", "messages", "does not fit task generative_reranker"),
])
def test_reranker_keys_that_do_not_fit_are_refused_naming_the_key(model, tmp_path, key, value,
                                                                   message):
    data = str(tmp_path / "groups.jsonl")
    make_reranker_groups(data, 4, seed=1)
    write_spec(tmp_path / "job.yaml", **reranker_spec(model, data))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                        str(tmp_path / "out"), "--set", f"{key}={value}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert message in r.stderr


def test_reranker_records_without_a_positive_or_for_another_task_are_refused(model, tmp_path):
    data = str(tmp_path / "groups.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"query": "q", "negative": ["n"]}) + "\n")
    write_spec(tmp_path / "job.yaml", **reranker_spec(model, data))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert f"{data}:1: a reranker record needs a positive document" in r.stderr
    make_reranker_groups(data, 4, seed=1)
    spec = reranker_spec(model, data)
    del spec["reranker"]
    spec["task"] = "causal_lm"
    write_spec(tmp_path / "lm.yaml", **spec)
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "lm.yaml"), "--out",
                        str(tmp_path / "out2")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "reranker records are for task generative_reranker" in r.stderr


def test_a_sharded_reranker_ranks_on_every_rank_as_one_rank_does(model, tmp_path):
    """ZeRO-3 over 2 ranks: every rank ranks the held-out groups with the
    layers gathered around their use, and gets what one rank gets."""
    data, held_out = str(tmp_path / "groups.jsonl"), str(tmp_path / "held-out.jsonl")
    make_reranker_groups(data, 32, seed=5)
    make_reranker_groups(held_out, 16, seed=6)
    spec = reranker_spec(model, data, eval_path=held_out, eval_every=5)
    spec.update(max_steps=5)
    write_spec(tmp_path / "job.yaml", **spec)
    evals = {}
    for nproc in (1, 2):
        r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                            str(tmp_path / f"out{nproc}"), "--set", f"devices={nproc}",
                            "--nproc", str(nproc)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        evals[nproc] = re.findall(r"eval step (\d+): MRR@10 ([0-9.]+), NDCG@10 ([0-9.]+)",
                                  r.stderr)
    # Each rank reports both evaluations (before step 1 and at step 5).
    assert len(evals[2]) == 4 and len(set(evals[2])) == 2, evals
    # Before any step the model is the same at any world size.
    assert evals[1][0] == [e for e in evals[2] if e[0] == "0"][0], evals


def test_early_stopping_on_mrr_keeps_the_best_ranking(model, tmp_path):
    """early_stopping.metric mrr_at_10 (higher is better): the run stops
    once MRR@10 stops rising, and the export is the best ranking's
    checkpoint, which ranks the held-out groups as that evaluation did."""
    data, held_out = str(tmp_path / "groups.jsonl"), str(tmp_path / "held-out.jsonl")
    make_reranker_groups(data, 64, seed=7)
    make_reranker_groups(held_out, 16, seed=8)
    spec = reranker_spec(model, data, eval_path=held_out, eval_every=2)
    spec.update(max_steps=40, checkpoint_every=4, keep_checkpoints=1,
                early_stopping={"metric": "mrr_at_10", "patience": 2})
    write_spec(tmp_path / "job.yaml", **spec)
    out = str(tmp_path / "out")
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", out],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    evals = re.findall(r"eval step (\d+): MRR@10 ([0-9.]+), NDCG@10 [0-9.]+ over 16 held-out "
                       r"groups(; the best so far)?", r.stderr)
    best = [int(step) for step, _, flag in evals if flag]
    stop = re.search(r"stopped early at step (\d+): mrr_at_10 did not improve by 0 for 2 "
                     r"evaluations since step (\d+); exporting step (\d+), the best mrr_at_10, ",
                     r.stderr)
    assert stop, r.stderr
    stopped, since, exported = (int(g) for g in stop.groups())
    assert since == exported == best[-1] and stopped == best[-1] + 4 < 40, (evals, stop.groups())
    assert int(evals[-1][0]) == stopped
    assert os.path.isdir(os.path.join(out, "checkpoints", f"step-{since:08d}"))
    # The exported adapter ranks the held-out groups as the best evaluation did.
    r = subprocess.run([TRAIN, "rerank", "--model", model, "--adapter",
                        os.path.join(out, "adapter"), "--queries", held_out, "--spec",
                        str(tmp_path / "job.yaml")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    final = re.search(r"MRR@10 ([0-9.]+), NDCG@10 [0-9.]+ over 16 queries", r.stderr)
    best_mrr = [float(m) for step, m, _ in evals if int(step) == since][0]
    assert final and abs(float(final.group(1)) - best_mrr) < 1e-3, (r.stderr, best_mrr)
