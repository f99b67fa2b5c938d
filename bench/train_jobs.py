"""What the ballast-train benchmarks share: the tiny Qwen3, Qwen3.5 and Qwen3-MoE they train, the
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


def save_qwen3_5_tiny(path):
    """The benchmarks' Qwen3.5 text model, the hybrid at the same width as
    save_qwen3_tiny: 4 layers (3 Gated DeltaNet, 1 gated full attention,
    transformers' default pattern), hidden 256, 8 heads / 4 KV of head_dim 32
    with a quarter of it rotated, linear heads 4 key / 8 value of dim 32,
    vocabulary 4096, seed 0. Needs transformers 5.x (build/hf5)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(vocab_size=4096, hidden_size=256, intermediate_size=768,
                            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                            head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8,
                            linear_key_head_dim=32, linear_value_head_dim=32,
                            max_position_embeddings=1024, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def save_qwen3_moe_tiny(path):
    """The benchmarks' Qwen3-MoE at the width of save_qwen3_tiny: 4 layers,
    all sparse, of 16 experts with 4 active per token and an expert width of
    192, so that a token's active MLP (4 x 192) is the dense model's 768;
    router_aux_loss_coef 0.001 and output_router_logits, so that
    transformers adds the load-balancing loss as Ballast always does."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=4096, hidden_size=256, intermediate_size=768,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True,
                         num_experts=16, num_experts_per_tok=4, moe_intermediate_size=192,
                         decoder_sparse_step=1, norm_topk_prob=True, router_aux_loss_coef=0.001,
                         output_router_logits=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


# LoRA on every linear layer but a MoE's router, named as PEFT names them, so
# that both sides adapt the same modules: PEFT's "all-linear" also takes the
# router (mlp.gate), which Ballast's leaves out (README, Mixture of Experts).
LINEAR_BUT_ROUTER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_lora_job(root, name, model, data, steps, target_modules=("all-linear",), **fields):
    """Writes root/name.yaml, a LoRA r16 job on `target_modules` at lr 1e-4 for
    `steps` steps on the model folder `model` with `data` as its data section,
    and `fields` as more top-level fields; returns its path."""
    import yaml
    spec = {"model": {"path": model}, "method": "lora",
            "lora": {"r": 16, "lora_alpha": 32, "target_modules": list(target_modules)},
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
