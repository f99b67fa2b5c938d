"""Inputs on which a job can apply no step, as a user meets them: labels all
masked, a NaN in a base weight, an infinity in the embeddings, every record
bad, and bad records besides masked ones. Each is a short run (2 steps,
fewer than guard.max_consecutive_bad, so the bad streak never rolls back),
and comes with what ballast-train must say, exiting 2 (not restartable).
Shared by test_train_cli.py (ballast-train alone) and test_guard.py
(through the coordinator)."""
import json
import os
import random
import shutil

from safetensors.torch import load_file, save_file

SHORT_RUN = {"max_steps": 2, "schedule": {"kind": "constant", "warmup_steps": 0}}


def _masked(data, path, bad_lines=0):
    """`data` with every label -100, after `bad_lines` lines no reader takes."""
    with open(data) as f, open(path, "w") as out:
        out.write('{"input_ids": [1, 2,\n' * bad_lines)
        for line in f:
            record = json.loads(line)
            record["labels"] = [-100] * len(record["input_ids"])
            out.write(json.dumps(record) + "\n")
    return path


def _with_weight(model, path, tensor, value):
    """A copy of `model` holding `value` at a random element of `tensor`;
    the element's flat index and position."""
    shutil.copytree(model, path)
    weights = load_file(os.path.join(path, "model.safetensors"))
    t = weights[tensor]
    row, column = random.randrange(t.shape[0]), random.randrange(t.shape[1])
    t[row, column] = value
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path, row * t.shape[1] + column, f"[{row}, {column}]"


def untrainable_cases(root, model, data):
    """{case: (model dir, data path, spec overrides, message)} under `root`,
    from a good `model` and `data`."""
    os.makedirs(root, exist_ok=True)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    nan_model, nan_at, nan_element = _with_weight(model, os.path.join(root, "nan_model"), q_proj,
                                                  float("nan"))
    embed = "model.embed_tokens.weight"
    inf_model, inf_at, inf_element = _with_weight(model, os.path.join(root, "inf_model"), embed,
                                                  float("inf"))
    bad = os.path.join(root, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"input_ids": [1, 2,\n{"input_ids": [4, "five"]}\n' * 4)
    # The format named: detecting it from a bad first record would fail first.
    skip = {"data": {"on_bad_record": "skip", "format": "tokens"}}
    return {
        "labels_masked": (model, _masked(data, os.path.join(root, "masked.jsonl")), {},
                          "guard: step 2: no step was applied: every step had no supervised "
                          "tokens; the trained weights are not exported"),
        "nan_base_weight": (nan_model, data, {},
                            f"model.path {nan_model}: tensor {q_proj} holds nan at flat index "
                            f"{nan_at} (element {nan_element})"),
        "inf_embedding": (inf_model, data, {},
                          f"model.path {inf_model}: tensor {embed} holds inf at flat index "
                          f"{inf_at} (element {inf_element})"),
        "every_record_bad": (model, bad, skip,
                             f"{bad}: no documents to train on (8 records, 8 skipped as bad"),
        "bad_and_masked_records": (
            model, _masked(data, os.path.join(root, "bad_and_masked.jsonl"), bad_lines=3), skip,
            "guard: step 2: no step was applied: every step had no supervised tokens; the data "
            "lost 3 of its "),
    }
