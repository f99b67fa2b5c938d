"""What the ballast-train benchmarks share: the tiny Qwen3 they train, the
LoRA job they write, and one run of ballast-train read back from its
metrics.jsonl."""
import json
import os
import shutil
import subprocess


def save_qwen3_tiny(path):
    """The benchmarks' Qwen3 (4 layers, hidden 256, 8 heads, vocabulary
    4096), initialised from seed 0, saved to `path`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def write_lora_job(root, name, model, data, steps, **fields):
    """Writes root/name.yaml, a LoRA r16 all-linear job at lr 1e-4 for `steps`
    steps on the model folder `model` with `data` as its data section, and
    `fields` as more top-level fields; returns its path."""
    import yaml
    spec = {"model": {"path": model}, "method": "lora",
            "lora": {"r": 16, "lora_alpha": 32, "target_modules": ["all-linear"]},
            "data": data, "optimizer": {"lr": 1e-4}, "max_steps": steps, **fields}
    path = os.path.join(root, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return path


def train(binary, job, out_dir):
    """Runs ballast-train on `job` into a fresh out_dir and returns its
    metrics.jsonl, one dict a step; raises when the run fails."""
    shutil.rmtree(out_dir, ignore_errors=True)
    subprocess.run([binary, "--spec", job, "--out", out_dir], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
