"""Shared pieces of the parity tests: tiny random HF models, random tokenized
data, a ballast-train runner, and the reference training loop written with
transformers + peft + torch.optim.AdamW, the stack users trust.

Nothing is downloaded: models are built from config objects with random
weights and saved with save_pretrained.
"""
import json
import math
import os
import subprocess

import torch
import torch.nn.functional as F
import yaml

BIN = os.environ.get("BALLAST_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
TRAIN = os.path.join(BIN, "ballast-train")


def relative_error(a, b):
    """‖a − b‖ / ‖b‖ over the whole tensor or curve."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm()).item()


def make_config(arch):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6)
    if arch == "qwen3":
        # head_dim is explicit and not hidden/heads, as in the real Qwen3 family.
        return Qwen3Config(**common, head_dim=32, rope_theta=1e6, tie_word_embeddings=True)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=5e5, tie_word_embeddings=False,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64})
    raise ValueError(arch)


def make_model(arch, path, seed):
    """A random model saved at `path`. Every tensor (biases and norms too) is
    drawn at random so that no term of the forward is trivially zero or one."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(arch), torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    return model


RERANKER_MARKERS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "rocket"]


def make_reranker_groups(path, n, seed, shape="mteb"):
    """Reranker records a tiny model learns in a few dozen steps: every query
    asks for "apple", which its positive document holds; its three negatives
    hold other marker words. `shape` is "mteb" ({query, positive, negative})
    or "swift" (ms-swift's messages / positive_messages / negative_messages).
    Short texts: a tiny, nearly byte-level tokenizer fits a group in 256."""
    import random
    rng = random.Random(seed)
    filler = ["the", "a", "of", "and", "is", "on", "with", "for"]

    def doc(word):
        words = [rng.choice(filler) for _ in range(rng.randint(2, 4))]
        words.insert(rng.randint(0, len(words)), word)
        return " ".join(words)
    with open(path, "w") as f:
        for _ in range(n):
            marker, others = RERANKER_MARKERS[0], rng.sample(RERANKER_MARKERS[1:], 3)
            query, positive, negatives = marker, doc(marker), [doc(w) for w in others]
            if shape == "mteb":
                record = {"query": query, "positive": [positive], "negative": negatives}
            else:
                record = {"messages": [{"role": "user", "content": query}],
                          "positive_messages": [[{"role": "assistant", "content": positive}]],
                          "negative_messages": [[{"role": "assistant", "content": d}]
                                                for d in negatives]}
            f.write(json.dumps(record) + "\n")


def make_dataset(path, n, vocab, seed, min_len=6, max_len=40):
    """JSONL of documents of random length; a random-length prompt prefix of
    each is unsupervised (-100), so rows differ in supervised tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        prompt = int(torch.randint(0, length - 1, (1,), generator=g))
        labels = [-100] * prompt + ids[prompt:]
        rows.append({"input_ids": ids, "labels": labels})
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return rows


def write_spec(path, **spec):
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)


def run_train(spec_path, out_dir, *extra, check=True):
    r = subprocess.run([TRAIN, "--spec", spec_path, "--out", out_dir, *extra],
                       capture_output=True, text=True, timeout=900)
    if check:
        assert r.returncode == 0, f"ballast-train failed ({r.returncode}):\n{r.stderr}"
    return r


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def ballast_logits(model_dir, tokens_path, out_path, adapter_dir=None):
    from safetensors.torch import load_file

    cmd = [TRAIN, "logits", "--model", model_dir, "--tokens", tokens_path, "--out", out_path]
    if adapter_dir:
        cmd += ["--adapter", adapter_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return load_file(out_path)


def hf_logits(model, rows):
    """Logits of each document run alone, concatenated: what packing must equal."""
    with torch.no_grad():
        return torch.cat([model(torch.tensor([r["input_ids"]])).logits[0].float() for r in rows])


def lr_lambda(kind, warmup, max_steps):
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)
    return {"constant": lambda o: get_constant_schedule_with_warmup(o, warmup),
            "linear": lambda o: get_linear_schedule_with_warmup(o, warmup, max_steps),
            "cosine": lambda o: get_cosine_schedule_with_warmup(o, warmup, max_steps)}[kind]


def reference_train(model, rows, spec):
    """The reference loop: per optimizer step, every micro-batch's summed
    token CE divided by the step's supervised-token count, backward,
    clip_grad_norm_, AdamW, scheduler. Returns per-step (loss, grad_norm)."""
    data, opt_spec, sched = spec["data"], spec["optimizer"], spec.get("schedule", {})
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=opt_spec["lr"], betas=(opt_spec.get("beta1", 0.9),
                            opt_spec.get("beta2", 0.999)), eps=opt_spec.get("eps", 1e-8),
                            weight_decay=opt_spec.get("weight_decay", 0.0))
    scheduler = lr_lambda(sched.get("kind", "constant"), sched.get("warmup_steps", 0),
                          spec["max_steps"])(opt)
    per_step = data.get("micro_batch_size", 1) * data.get("grad_accum_steps", 1)
    cursor, losses, norms = 0, [], []
    for _ in range(spec["max_steps"]):
        step_rows = [rows[(cursor + i) % len(rows)] for i in range(per_step)]
        cursor += per_step
        n = sum(sum(1 for t in r["labels"][1:] if t != -100) for r in step_rows)
        total = 0.0
        for r in step_rows:
            logits = model(torch.tensor([r["input_ids"]])).logits[0].float()
            ce = F.cross_entropy(logits[:-1], torch.tensor(r["labels"][1:]), ignore_index=-100,
                                 reduction="sum")
            (ce / n).backward()
            total += ce.item()
        norm = torch.nn.utils.clip_grad_norm_(params, opt_spec.get("max_grad_norm", 1.0))
        opt.step()
        scheduler.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / n)
        norms.append(norm.item())
    return losses, norms


def base_spec(model_dir, data_path, **overrides):
    spec = {
        "model": {"path": model_dir},
        "method": "lora",
        "lora": {"r": 8, "lora_alpha": 16, "target_modules": ["all-linear"]},
        "data": {"path": data_path, "seq_len": 64, "micro_batch_size": 2, "grad_accum_steps": 2,
                 "shuffle": False},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.01, "max_grad_norm": 1.0},
        "schedule": {"kind": "cosine", "warmup_steps": 3},
        "max_steps": 20,
        "seed": 7,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec
