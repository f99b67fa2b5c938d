"""The validation set (eval.path, issue 39 item 1): its loss is the training
objective's, over the same masks and normalised by the supervised tokens of
the whole set, so:

- causal_lm: it equals a float64 transformers forward of each eval document
  alone (packed rows included: no attention and no loss across documents),
  before the first step and on the exported weights after the last;
- `--nproc 2` gives the eval of 1 rank, and a run with evaluations trains
  exactly as one without (no gradient, optimizer state or generator moved);
- block_diffusion: it equals a float64 transformers forward of each eval
  document as [x_t ; x_0] under the block-diffusion mask, with the noise
  drawn here anew from eval.seed (SplitMix64, as the worker draws it); two
  evaluations of the same weights agree bit for bit, another eval.seed
  draws others;
- eval.fraction holds out the documents its seed picks (written anew here),
  evaluates them in file order, and trains on exactly the others;
- bad input exits 2 naming the key.
"""
import json
import os

import torch
from reference import (base_spec, eval_loss, make_dataset, make_model, model_class,
                       read_metrics, relative_error, run_train, write_rows, write_spec)

TOLERANCE = 1e-5


def steps_and_evals(out_dir):
    lines = read_metrics(out_dir)
    return [m for m in lines if "eval" not in m], [m["eval"] for m in lines if "eval" in m]


def hf_eval_loss(model_dir, rows):
    """transformers' validation loss of the model folder, in float64."""
    model = model_class("qwen3").from_pretrained(model_dir, torch_dtype=torch.float64).eval()
    return eval_loss(model, rows)


def inputs(tmp_path, seed):
    model_dir = str(tmp_path / "model")
    data, held_out = str(tmp_path / "train.jsonl"), str(tmp_path / "eval.jsonl")
    make_model("qwen3", model_dir, seed=seed)
    make_dataset(data, n=16, vocab=320, seed=seed + 1)
    eval_rows = make_dataset(held_out, n=16, vocab=320, seed=seed + 2)
    return model_dir, data, held_out, eval_rows


def train(tmp_path, name, spec, *extra):
    write_spec(tmp_path / f"{name}.yaml", **spec)
    run_train(str(tmp_path / f"{name}.yaml"), str(tmp_path / name), *extra)
    return steps_and_evals(str(tmp_path / name))


def test_causal_lm_eval_loss_equals_transformers(tmp_path):
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=40)
    spec = base_spec(model_dir, data, method="full", max_steps=4,
                     data={"packing": True, "micro_batch_size": 2},
                     eval={"path": held_out, "every": 2})
    steps, evals = train(tmp_path, "run", spec)
    assert [e["step"] for e in evals] == [0, 2, 4], evals
    supervised = sum(sum(t != -100 for t in r["labels"][1:]) for r in eval_rows)
    assert all(e["supervised_tokens"] == supervised for e in evals), evals
    assert all(e["tokens"] == sum(len(r["input_ids"]) for r in eval_rows) for e in evals)
    # The eval set is not trained on: its loss moves, but not to the train loss.
    assert len({e["loss"] for e in evals}) == 3, evals
    before = hf_eval_loss(model_dir, eval_rows)
    after = hf_eval_loss(str(tmp_path / "run" / "model"), eval_rows)
    assert relative_error([evals[0]["loss"], evals[-1]["loss"]], [before, after]) <= TOLERANCE, \
        (evals, before, after)


def test_two_ranks_equal_one_and_training_is_untouched(tmp_path):
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=50)
    spec = base_spec(model_dir, data, max_steps=4, data={"packing": True},
                     eval={"path": held_out, "every": 1, "max_tokens": 128})
    _, one = train(tmp_path, "n1", spec)
    _, two = train(tmp_path, "n2", {**spec, "devices": 2}, "--nproc", "2")
    assert [e["step"] for e in one] == [0, 1, 2, 3, 4], one
    # max_tokens bounds every evaluation, to a prefix of the set's rows.
    total = sum(len(r["input_ids"]) for r in eval_rows)
    assert all(0 < e["tokens"] <= 128 < total for e in one), one
    assert [e["tokens"] for e in one] == [e["tokens"] for e in two]
    assert [e["supervised_tokens"] for e in one] == [e["supervised_tokens"] for e in two]
    # The same weights (step 0): the same micro-batches in fp32, their sums
    # added in fp64 in another order.
    assert abs(one[0]["loss"] - two[0]["loss"]) <= 1e-12 * one[0]["loss"], (one, two)
    # Later, the weights themselves differ by the gradients' reduction order.
    assert relative_error([e["loss"] for e in two], [e["loss"] for e in one]) <= TOLERANCE

    # A LoRA run with dropout: an eval that drew from the generator, or kept a
    # gradient, would change the training curve. Bit for bit, it does not.
    dropout = {**spec, "lora": {**spec["lora"], "lora_dropout": 0.1}}
    with_eval, evals = train(tmp_path, "dropout", dropout)
    plain, none = train(tmp_path, "plain", {k: v for k, v in dropout.items() if k != "eval"})
    assert none == [] and len(evals) == 5
    assert [m["loss"] for m in with_eval] == [m["loss"] for m in plain]
    assert [m["grad_norm"] for m in with_eval] == [m["grad_norm"] for m in plain]


def split_mix(state):
    mask = (1 << 64) - 1
    state = (state + 0x9e3779b97f4a7c15) & mask
    z = ((state ^ (state >> 30)) * 0xbf58476d1ce4e5b9) & mask
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & mask
    return state, z ^ (z >> 31)


def held_out_documents(n, fraction, seed):
    """eval.fraction's split as README "Validation" defines it, written anew:
    the first round(fraction x n) of a Fisher-Yates permutation over SplitMix64."""
    order, state = list(range(n)), seed ^ 0x8ebc6af09c88c6e3
    for i in range(n - 1, 0, -1):
        state, r = split_mix(state)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return set(order[:min(max(int(fraction * n + 0.5), 1), n - 1)])


def test_fraction_holds_out_a_seeded_split_disjoint_from_training(tmp_path):
    model_dir, data, _, _ = inputs(tmp_path, seed=80)
    rows = make_dataset(data, n=20, vocab=320, seed=81)
    held = held_out_documents(len(rows), 0.25, seed=3)
    assert len(held) == 5
    spec = base_spec(model_dir, data, max_steps=3, data={"shuffle": True, "packing": True},
                     eval={"fraction": 0.25, "seed": 3})
    steps, evals = train(tmp_path, "split", spec)
    # The held-out documents, in file order: transformers' loss over them.
    eval_rows = [r for i, r in enumerate(rows) if i in held]
    assert relative_error([evals[0]["loss"]], [hf_eval_loss(model_dir, eval_rows)]) <= TOLERANCE
    assert evals[0]["supervised_tokens"] == sum(sum(t != -100 for t in r["labels"][1:])
                                                for r in eval_rows)
    # Training reads exactly the others: the same steps, bit for bit, as a
    # run on a file of them alone.
    kept = str(tmp_path / "kept.jsonl")
    write_rows(kept, [r for i, r in enumerate(rows) if i not in held])
    rest, _ = train(tmp_path, "kept", {**base_spec(model_dir, kept, max_steps=3,
                                                   data={"shuffle": True, "packing": True})})
    assert [m["loss"] for m in steps] == [m["loss"] for m in rest], (steps, rest)
    assert [m["tokens"] for m in steps] == [m["tokens"] for m in rest]


def split_mix_uniform(state):
    state, z = split_mix(state)
    return state, (z >> 11) * 2.0 ** -53


def diffusion_noise(labels, seed, document, eps):
    """The eval set's mask draw of one document (README "Block diffusion"),
    written anew: p = (1 - eps) t + eps with t ~ U(0, 1), each answer token
    masked with probability p, redrawn up to 10 times while none is, then one
    forced. Seeded by eval.seed, epoch 0 and the document's index."""
    mask = (1 << 64) - 1
    state = seed ^ 0x9e3779b97f4a7c15 ^ ((0xc2b2ae3d27d4eb4f * (document + 1)) & mask)
    answers = [i for i, t in enumerate(labels) if t != -100]
    state, t = split_mix_uniform(state)
    p = (1 - eps) * t + eps
    masked = set()
    for _ in range(10):
        if masked or not answers:
            break
        for i in answers:
            state, u = split_mix_uniform(state)
            if u < p:
                masked.add(i)
    if not masked and answers:
        state, r = split_mix(state)
        masked.add(answers[r % len(answers)])
    return masked, p, len(answers)


def block_diffusion_mask(n, block):
    """The additive mask of one [x_t ; x_0] document of 2n tokens: within a
    half, a block sees its own block both ways; a noisy block also sees the
    clean blocks strictly before it; a clean block, the clean blocks up to
    its own."""
    blocks = torch.arange(n) // block
    same = blocks[:, None] == blocks[None, :]
    seen = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    seen[:n, :n] = same
    seen[:n, n:] = blocks[None, :] < blocks[:, None]
    seen[n:, n:] = blocks[None, :] <= blocks[:, None]
    additive = torch.zeros(2 * n, 2 * n, dtype=torch.float64)
    additive[~seen] = torch.finfo(torch.float64).min
    return additive[None, None]


def hf_block_diffusion_eval_loss(model_dir, rows, seed, block, mask_token_id, eps=1e-3):
    """transformers' block-diffusion validation loss of the model folder, in
    float64: the sum over masked x_t positions of -log p(clean token) x
    float32(1 / p), over the eval set's answer tokens."""
    model = model_class("qwen3").from_pretrained(model_dir, torch_dtype=torch.float64,
                                                 attn_implementation="eager").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for d, r in enumerate(rows):
            ids, n = r["input_ids"], len(r["input_ids"])
            masked, p, answers = diffusion_noise(r["labels"], seed, d, eps)
            noisy = [mask_token_id if i in masked else t for i, t in enumerate(ids)]
            positions = torch.tensor([list(range(n)) * 2])
            logits = model(torch.tensor([noisy + ids]), position_ids=positions,
                           attention_mask=block_diffusion_mask(n, block)).logits[0]
            at = torch.tensor(sorted(masked))
            lp = torch.log_softmax(logits[at], dim=-1)
            weight = float(torch.tensor(1.0 / p, dtype=torch.float32))
            total -= weight * lp.gather(1, torch.tensor(ids)[at][:, None]).sum().item()
            count += answers
    return total / count


def test_block_diffusion_eval_loss_equals_transformers_and_repeats_bit_for_bit(tmp_path):
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=60)
    spec = base_spec(model_dir, data, task="block_diffusion", max_steps=3, data={"seq_len": 128},
                     block_diffusion={"block_length": 4, "mask_token_id": 319},
                     eval={"path": held_out, "every": 1, "seed": 5})
    _, a = train(tmp_path, "a", spec)
    # Step 0's weights are the base model's (LoRA's B starts at 0).
    reference = [hf_block_diffusion_eval_loss(model_dir, eval_rows, seed, 4, 319)
                 for seed in (5, 6)]
    assert relative_error([a[0]["loss"]], reference[:1]) <= TOLERANCE, (a[0], reference)
    assert a[0]["supervised_tokens"] == sum(sum(t != -100 for t in r["labels"]) for r in eval_rows)
    # Another training seed: other LoRA init (B = 0 leaves the step-0 model the
    # base), other training noise; the eval noise is eval.seed's alone.
    _, b = train(tmp_path, "b", {**spec, "seed": 8})
    _, c = train(tmp_path, "c", {**spec, "eval": {**spec["eval"], "seed": 6}})
    assert a[0]["loss"] == b[0]["loss"], (a, b)
    assert relative_error([c[0]["loss"]], reference[1:]) <= TOLERANCE, (c[0], reference)
    assert a[0]["loss"] != c[0]["loss"], (a, c)
    assert all(e["loss"] is not None and e["supervised_tokens"] > 0 for e in a + b + c)


def test_bad_eval_input_exits_2_naming_the_key(tmp_path):
    model_dir, data, held_out, eval_rows = inputs(tmp_path, seed=70)
    messages = str(tmp_path / "messages.jsonl")
    with open(messages, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    unsupervised = str(tmp_path / "unsupervised.jsonl")
    write_rows(unsupervised, [{"input_ids": r["input_ids"], "labels": [-100] * len(r["labels"])}
                              for r in eval_rows[:3]])
    cases = [("eval.path", {"path": messages}),  # another format than data.path's
             ("eval.path", {"path": unsupervised}),  # no supervised token
             ("eval.path", {"every": 1}),  # none given
             ("eval.every", {"path": held_out, "every": 99}),
             ("eval.max_tokens", {"path": held_out, "max_tokens": 10}),
             ("eval.fraction", {"path": held_out, "fraction": 0.5}),  # both
             ("eval.fraction", {"fraction": 1.5})]
    for i, (key, section) in enumerate(cases):
        spec = base_spec(model_dir, data, max_steps=3, eval=section)
        write_spec(tmp_path / f"bad{i}.yaml", **spec)
        r = run_train(str(tmp_path / f"bad{i}.yaml"), str(tmp_path / f"bad{i}"), check=False)
        assert r.returncode == 2, (key, section, r.returncode, r.stderr)
        assert key in r.stderr, (key, section, r.stderr)
        assert not os.path.exists(tmp_path / f"bad{i}" / "metrics.jsonl"), key
