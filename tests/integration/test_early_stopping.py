"""Early stopping and the best checkpoint (issue 39 item 2), on a run made to
overfit: a tiny model memorising four records at a high learning rate while
its loss on other documents rises.

- The run stops where the rule (README "Validation and early stopping"),
  written anew here over the eval losses in metrics.jsonl, says, with its
  reason; the exported adapter is the best evaluation's checkpoint (PEFT
  loads it to that evaluation's loss, and its tensors are the checkpoint's),
  and keep_checkpoints does not delete that checkpoint.
- A restart from a checkpoint between the best and the stop decides the
  same, to the bit (the progress is stored with the checkpoint).
- On two ranks (ZeRO-3) the run stops as its evaluations say, and exports
  the best checkpoint's shards.
- Through ballastd and a worker the job ends SUCCEEDED with the reason, and
  GetJob (`ballast get`) shows the exported step and why.
- Bad input exits 2 naming the key.
"""
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from reference import (base_spec, eval_loss, make_dataset, make_model, model_class,  # noqa: E402
                       read_metrics, relative_error, run_train, write_spec)

PATIENCE = 3
EVERY = 2


def inputs(root, seed):
    model_dir, data, held_out = (str(root / n) for n in ("model", "train.jsonl", "eval.jsonl"))
    make_model("qwen3", model_dir, seed=seed)
    make_dataset(data, n=4, vocab=320, seed=seed + 1)
    eval_rows = make_dataset(held_out, n=8, vocab=320, seed=seed + 2)
    return model_dir, data, held_out, eval_rows


def overfit_spec(model_dir, data, held_out, **overrides):
    """Every step trains on all four records, unclipped at lr 1e-2 with
    rank-16 adapters: the train loss falls steadily (5.9 to 3.0 in 16 steps)
    and the eval loss turns upwards after a step or two."""
    spec = dict(max_steps=40, checkpoint_every=EVERY, keep_checkpoints=2,
                lora={"r": 16, "lora_alpha": 32, "target_modules": ["all-linear"]},
                optimizer={"lr": 1e-2, "weight_decay": 0.0, "max_grad_norm": 0},
                schedule={"kind": "constant", "warmup_steps": 0},
                guard={"good_after_steps": 2},
                eval={"path": held_out, "every": EVERY},
                early_stopping={"patience": PATIENCE, "min_delta": 1e-3})
    return base_spec(model_dir, data, **{**spec, **overrides})


def decide(evals, patience, min_delta):
    """The rule, from its README description: the evaluation before step 1
    is not judged; the first after it is the best; an evaluation improves
    when its loss is below the best by more than min_delta; the run stops
    after `patience` evaluations in a row without one. Returns (best step,
    best loss, stop step or None)."""
    best_step, best, since = None, None, 0
    for e in evals:
        if e["step"] == 0:
            continue
        if best is None or best - e["loss"] > min_delta:
            best_step, best, since = e["step"], e["loss"], 0
        else:
            since += 1
            if since == patience:
                return best_step, best, e["step"]
    return best_step, best, None


def evals_of(out_dir, timed=True):
    """The eval lines of metrics.jsonl; without their wall time (which no
    two runs share) unless `timed`."""
    evals = [m["eval"] for m in read_metrics(out_dir) if "eval" in m]
    return evals if timed else [{k: v for k, v in e.items() if k != "time_s"} for e in evals]


def adapter_tensors(path):
    from safetensors.torch import load_file
    return load_file(os.path.join(path, "adapter_model.safetensors"))


def test_stops_early_exports_the_best_checkpoint_and_a_restart_decides_the_same(tmp_path):
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=90)
    out = str(tmp_path / "run")
    write_spec(tmp_path / "job.yaml", **overfit_spec(model_dir, data, held_out))
    r = run_train(str(tmp_path / "job.yaml"), out)

    evals = evals_of(out)
    best_step, best_loss, stop = decide(evals, PATIENCE, 1e-3)
    assert stop is not None and stop < 40, evals
    assert best_step > 0 and stop == best_step + PATIENCE * EVERY, evals
    steps = [m["step"] for m in read_metrics(out) if "eval" not in m]
    assert steps == list(range(1, stop + 1)), steps
    # Each evaluation says whether it was the best so far, and where it is kept.
    flagged = [e["step"] for e in evals if e.get("best")]
    assert flagged[-1] == best_step, evals
    assert all(e.get("best", False) == (e["step"] in flagged) for e in evals)
    best_folder = os.path.join(out, "checkpoints", f"step-{best_step:08d}")
    assert [e["checkpoint"] for e in evals if e["step"] == best_step] == [best_folder]
    reason = (f"stopped early at step {stop}: eval_loss did not improve by 0.001 for "
              f"{PATIENCE} evaluations since step {best_step}")
    assert f"{reason}; exporting step {best_step}, the best eval_loss, " in r.stderr, r.stderr

    # keep_checkpoints 2 kept the two newest, and the best's beside them.
    kept = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert kept == sorted({f"step-{best_step:08d}", f"step-{stop:08d}",
                           f"step-{stop - EVERY:08d}"}), kept

    # The export is the best checkpoint's weights: PEFT loads it to the best
    # evaluation's loss, and to no other evaluation's.
    from peft import PeftModel
    adapter = os.path.join(out, "adapter")
    base = model_class("qwen3").from_pretrained(model_dir, torch_dtype=torch.float64)
    peft = PeftModel.from_pretrained(base, adapter).to(torch.float64).eval()
    loss = eval_loss(peft, eval_rows)
    assert relative_error([loss], [best_loss]) <= 1e-5, (loss, best_loss)
    others = [e["loss"] for e in evals if e["step"] != best_step]
    assert all(relative_error([loss], [o]) > 1e-4 for o in others), (loss, evals)

    # A restart from the checkpoint between the best and the stop (its
    # progress: best_step, and PATIENCE - 1 evaluations without improvement)
    # trains the same steps and stops at the same one, exporting the same.
    first = adapter_tensors(adapter)
    first_evals = evals_of(out, timed=False)
    shutil.rmtree(adapter)
    r = run_train(str(tmp_path / "job.yaml"), out, "--resume-at-or-before", str(stop - 1))
    assert f"resuming from checkpoint step {stop - EVERY}" in r.stderr, r.stderr
    assert f"{reason}; exporting step {best_step}," in r.stderr, r.stderr
    assert evals_of(out, timed=False) == first_evals
    again = adapter_tensors(adapter)
    assert again.keys() == first.keys()
    assert all(torch.equal(again[n], first[n]) for n in first)


def test_two_ranks_stop_where_their_evaluations_say_and_export_the_best_shards(tmp_path):
    """ZeRO-3 over two ranks: both ranks act on rank 0's eval loss, the run
    stops where its own evaluations say, and the export gathers the best
    checkpoint's shards (sharded layout) into the adapter PEFT loads to that
    evaluation's loss."""
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=93)
    out = str(tmp_path / "run")
    write_spec(tmp_path / "job.yaml", **overfit_spec(model_dir, data, held_out, devices=2))
    r = run_train(str(tmp_path / "job.yaml"), out, "--nproc", "2")
    evals = evals_of(out)
    best_step, best_loss, stop = decide(evals, PATIENCE, 1e-3)
    assert stop is not None and best_step > 0 and stop == best_step + PATIENCE * EVERY, evals
    assert [m["step"] for m in read_metrics(out) if "eval" not in m] == list(range(1, stop + 1))
    assert f"exporting step {best_step}, the best eval_loss, " in r.stderr, r.stderr
    best_folder = os.path.join(out, "checkpoints", f"step-{best_step:08d}")
    assert sorted(f for f in os.listdir(best_folder) if f.startswith("rank-")) == \
        ["rank-0.safetensors", "rank-1.safetensors"], os.listdir(best_folder)
    from peft import PeftModel
    base = model_class("qwen3").from_pretrained(model_dir, torch_dtype=torch.float64)
    peft = PeftModel.from_pretrained(base, os.path.join(out, "adapter")).to(torch.float64).eval()
    loss = eval_loss(peft, eval_rows)
    assert relative_error([loss], [best_loss]) <= 1e-5, (loss, best_loss)


def test_export_best_without_early_stopping_runs_to_the_end(tmp_path):
    model_dir, data, held_out, _ = inputs(tmp_path, seed=91)
    spec = overfit_spec(model_dir, data, held_out, max_steps=12, export="best")
    del spec["early_stopping"]
    write_spec(tmp_path / "job.yaml", **spec)
    out = str(tmp_path / "run")
    r = run_train(str(tmp_path / "job.yaml"), out)
    evals = evals_of(out)
    best_step, _, _ = decide(evals, patience=10 ** 6, min_delta=0)
    assert [m["step"] for m in read_metrics(out) if "eval" not in m][-1] == 12
    assert best_step < 12, evals  # overfit: the best is not the last
    assert f"trained to step 12; exporting step {best_step}, the best eval_loss" in r.stderr
    checkpoint = os.path.join(out, "checkpoints", f"step-{best_step:08d}")
    assert os.path.isdir(checkpoint)


def test_bad_early_stopping_input_exits_2_naming_the_key(tmp_path):
    model_dir, data, held_out, _ = inputs(tmp_path, seed=92)
    good = overfit_spec(model_dir, data, held_out)
    no_eval = {k: v for k, v in good.items() if k != "eval"}
    cases = [("early_stopping.patience", {**good, "early_stopping": {"patience": -1}}),
             ("early_stopping.patience", {**good, "early_stopping": {"min_delta": 0.1}}),
             ("early_stopping.min_delta",
              {**good, "early_stopping": {"patience": 2, "min_delta": -0.5}}),
             ("early_stopping.warmup_evals",
              {**good, "early_stopping": {"patience": 2, "warmup_evals": -1}}),
             ("early_stopping.metric",
              {**good, "early_stopping": {"patience": 2, "metric": "accuracy"}}),
             ("early_stopping.metric",
              {**good, "early_stopping": {"patience": 2, "metric": "mrr_at_10"}}),
             ("early_stopping is set, but eval is not", no_eval),
             ("export = best needs eval",
              {**{k: v for k, v in no_eval.items() if k != "early_stopping"}, "export": "best"}),
             ("export = newest", {**good, "export": "newest"}),
             ("export = last contradicts early_stopping", {**good, "export": "last"})]
    for i, (key, spec) in enumerate(cases):
        write_spec(tmp_path / f"bad{i}.yaml", **spec)
        r = run_train(str(tmp_path / f"bad{i}.yaml"), str(tmp_path / f"bad{i}"), check=False)
        assert r.returncode == 2, (key, r.returncode, r.stderr)
        assert key in r.stderr, (key, r.stderr)
        assert not os.path.exists(tmp_path / f"bad{i}" / "metrics.jsonl"), key


def test_through_the_coordinator_the_job_succeeds_with_the_reason(tmp_path, cluster):
    model_dir, data, held_out, _ = inputs(tmp_path, seed=90)
    cluster.start_coordinator()
    cluster.start_worker("w1")
    job_id = cluster.submit(overfit_spec(model_dir, data, held_out))
    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    best_step, _, stop = decide(evals_of(job["output_dir"]), PATIENCE, 1e-3)
    reason = (f"stopped early at step {stop}: eval_loss did not improve by 0.001 for "
              f"{PATIENCE} evaluations since step {best_step}")
    end = job["end"]
    assert end["stop_reason"] == reason, end
    assert int(end["step"]) == stop and int(end["exported_step"]) == best_step, end
    assert end["export_reason"].startswith("the best eval_loss, "), end
    assert end["export_reason"].endswith(f" at step {best_step}"), end
    # `ballast watch` ends with it, and `ballast get` shows both.
    assert f"SUCCEEDED: {reason}" in r.stdout, r.stdout
    shown = cluster.cli("get", job_id)
    assert shown.returncode == 0, shown.stderr
    assert reason in shown.stdout, shown.stdout
    assert f"step {best_step}: the best eval_loss, " in shown.stdout, shown.stdout
    assert os.path.isdir(os.path.join(job["output_dir"], "checkpoints",
                                      f"step-{best_step:08d}"))
