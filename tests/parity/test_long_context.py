"""One training step at 70,000 and 131,072 tokens in one document (past the
2^16 where PyTorch's memory-efficient SDPA went wrong, the Qwen3.5 failure
in DESIGN.md), on the CPU with gradient checkpointing: ballast-train's loss
equals transformers' Qwen3 in float64 with a chunked causal attention (no
[T, T] matrix exists on either side), and every gradient is finite.

The model is a Qwen3 of one layer, one head of dimension 8 and hidden size
64, so that the quadratic attention fits a CI budget; every other part
(embedding, RMSNorm, q/k norms, RoPE at positions past 2^16, SwiGLU, the
lm_head and the loss) is the real one."""
import json
import math

import pytest
import torch

from reference import base_spec, read_metrics, run_train, write_spec

CHUNK = 2048


def chunked_causal_attention(module, query, key, value, attention_mask, scaling=None,
                             dropout=0.0, **kwargs):
    """softmax(q k^T * scaling + causal) v, a block of query rows at a time."""
    batch, heads, tokens, dim = query.shape
    groups = heads // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    out = torch.empty_like(query)
    for start in range(0, tokens, CHUNK):
        end = min(tokens, start + CHUNK)
        scores = torch.matmul(query[:, :, start:end], key[:, :, :end].transpose(-1, -2)) * scaling
        rows = torch.arange(start, end).unsqueeze(1)
        cols = torch.arange(end).unsqueeze(0)
        scores.masked_fill_(cols > rows, float("-inf"))
        out[:, :, start:end] = torch.matmul(torch.softmax(scores, dim=-1), value[:, :, :end])
        del scores
    return out.transpose(1, 2).contiguous(), None


def make_long_model(path):
    from transformers import AutoModelForCausalLM, Qwen3Config
    torch.manual_seed(11)
    config = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=112,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=131072, rms_norm_eps=1e-6,
                         rope_theta=1e6, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.2)
    model.save_pretrained(path, safe_serialization=True)


def reference_loss(model_dir, ids):
    from transformers import AttentionInterface, AutoModelForCausalLM
    AttentionInterface.register("chunked_causal", chunked_causal_attention)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64,
                                                 attn_implementation="chunked_causal")
    with torch.no_grad():
        batch = torch.tensor([ids])
        # From the float64 logits: transformers' own loss casts them to fp32.
        logits = model(input_ids=batch).logits[0]
        return torch.nn.functional.cross_entropy(logits[:-1], batch[0, 1:]).item()


@pytest.mark.parametrize("tokens", [70_000, 131_072])
def test_one_long_step_matches_a_chunked_float64_reference(tmp_path, tokens):
    model = str(tmp_path / "model")
    make_long_model(model)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, 320, (tokens,), generator=g).tolist()
    data = str(tmp_path / "long.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"input_ids": ids}) + "\n")
    spec = base_spec(model, data, max_steps=1, gradient_checkpointing=True,
                     data={"seq_len": tokens, "micro_batch_size": 1, "grad_accum_steps": 1},
                     schedule={"kind": "constant", "warmup_steps": 0})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    [step] = read_metrics(str(tmp_path / "out"))
    assert step["tokens"] == tokens and step["supervised_tokens"] == tokens - 1
    assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0
    want = reference_loss(model, ids)
    # fp32 sums over up to 2^17 keys and tokens against float64.
    print(f"{tokens} tokens: ballast {step['loss']!r}, float64 reference {want!r}")
    assert abs(step["loss"] - want) <= 1e-4 * abs(want), (step["loss"], want)
