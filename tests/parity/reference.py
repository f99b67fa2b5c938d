"""Shared pieces of the parity tests: tiny random HF models, random tokenized
data, a ballast-train runner, and the reference training loop written with
transformers + peft + torch.optim.AdamW, the stack users trust.

Nothing is downloaded: models are built from config objects with random
weights and saved with save_pretrained.
"""
import json
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


# Qwen3.5 needs transformers >= 5.2 (tests that use it run under build/hf5):
# a hybrid of 2 Gated DeltaNet layers and 1 gated full-attention layer, with
# grouped value heads (Hv = 2 Hk), partial RoPE (a quarter of head_dim 32)
# and head_dim != hidden / heads, as in the real family.
QWEN3_5_TEXT = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=256, rms_norm_eps=1e-6,
                    layer_types=["linear_attention", "linear_attention", "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                     "partial_rotary_factor": 0.25})
# The vision tower only has to exist (and be kept byte for byte): tiny.
QWEN3_5_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                      out_hidden_size=64, num_position_embeddings=16, patch_size=4,
                      temporal_patch_size=2, spatial_merge_size=2)


# Qwen3-MoE (transformers 4.57.6's Qwen3MoeForCausalLM) at a tiny size: 8
# experts, top-2, 3 layers of which layer 0 is dense (mlp_only_layers), head_dim
# explicit as in the real family. output_router_logits makes transformers add
# the load-balancing loss (Ballast always adds it; README, Mixture of Experts);
# the coefficient is large enough that its gradient shows in every curve.
QWEN3_MOE = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
                 tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[0],
                 norm_topk_prob=True, router_aux_loss_coef=0.1, output_router_logits=True)


# Qwen3.5-MoE (transformers 5.23's Qwen3_5MoeTextConfig) at a tiny size: the
# QWEN3_5_TEXT hybrid with a mixture of experts in every layer, 8 experts of
# width 48, top-2, and a shared expert of width 80 (its config has no
# intermediate_size: no layer is dense). The aux loss as QWEN3_MOE's.
QWEN3_5_MOE_TEXT = dict({k: v for k, v in QWEN3_5_TEXT.items() if k != "intermediate_size"},
                        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                        shared_expert_intermediate_size=80, router_aux_loss_coef=0.1,
                        output_router_logits=True)


def make_config(arch, **overrides):
    if arch == "qwen3_5_moe_text":
        from transformers import Qwen3_5MoeTextConfig
        return Qwen3_5MoeTextConfig(**{**QWEN3_5_MOE_TEXT, **overrides}, tie_word_embeddings=False)
    if arch == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig
        return Qwen3_5MoeConfig(text_config={**QWEN3_5_MOE_TEXT, **overrides},
                                vision_config=QWEN3_5_VISION, tie_word_embeddings=True)
    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        return Qwen3MoeConfig(**{**QWEN3_MOE, **overrides})
    if arch == "qwen3_5_text":
        from transformers import Qwen3_5TextConfig
        return Qwen3_5TextConfig(**QWEN3_5_TEXT, tie_word_embeddings=False)
    if arch == "qwen3_5":
        from transformers import Qwen3_5Config
        # The released checkpoints' layout: the text decoder in text_config.
        return Qwen3_5Config(text_config=QWEN3_5_TEXT, vision_config=QWEN3_5_VISION,
                             tie_word_embeddings=True)

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


def use_transformers_torch_gdn():
    """transformers picks flash-linear-attention's Triton kernels for Gated
    DeltaNet when fla is installed (build/hf5 has it, for its CPU torch
    references), and those need a GPU. The reference is transformers' own
    torch path (torch_chunk_gated_delta_rule, the F.conv1d causal conv)."""
    import inspect

    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    for m in (modeling_qwen3_5, modeling_qwen3_5_moe):
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                     "causal_conv1d_fn", "causal_conv1d_update"):
            setattr(m, name, inspect.unwrap(getattr(m, name)))


def model_class(arch):
    """The transformers class a model of `arch` loads with."""
    if arch.startswith("qwen3_5"):
        use_transformers_torch_gdn()
    if arch == "qwen3_5":
        from transformers import Qwen3_5ForConditionalGeneration
        return Qwen3_5ForConditionalGeneration
    if arch == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForConditionalGeneration
        return Qwen3_5MoeForConditionalGeneration
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM


def randomize_qwen3_5(name, p):
    """Qwen3.5's tensors at random around their meaning: zero-centred norms
    (1 + w) near 0, the gated norm's w near 1, A_log and dt_bias spread so
    that the decays differ per head, the conv wide enough to matter."""
    if "linear_attn.norm" in name:
        p.copy_(1 + 0.1 * torch.randn_like(p))
    elif "norm" in name:
        p.copy_(0.1 * torch.randn_like(p))
    elif "A_log" in name or "dt_bias" in name:
        p.copy_(0.5 * torch.randn_like(p))
    elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
        # A router that prefers some experts per token, as a trained one
        # does; a shared-expert gate that differs per token.
        p.normal_(0, 0.5)
    elif "conv1d" in name:
        p.normal_(0, 0.3)
    else:
        p.normal_(0, 0.05)


def add_mtp_tensors(path, seed):
    """Adds multi-token-prediction tensors (mtp.*, which transformers does
    not load) to the checkpoint at `path`, as the released Qwen3.5 files
    have them, in a shard of their own listed in the index (a single file
    becomes a sharded checkpoint). Returns their names."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    mtp = {"mtp.fc.weight": torch.randn(64, 128, generator=g).to(torch.bfloat16),
           "mtp.norm.weight": torch.randn(64, generator=g).to(torch.bfloat16),
           "mtp.layers.0.mlp.up_proj.weight": torch.randn(112, 64, generator=g)}
    save_file(mtp, os.path.join(path, "model-mtp.safetensors"), metadata={"format": "pt"})
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    else:
        from safetensors import safe_open
        single = os.path.join(path, "model.safetensors")
        with safe_open(single, "pt") as f:
            names = list(f.keys())
        os.rename(single, os.path.join(path, "model-text.safetensors"))
        index = {"metadata": {}, "weight_map": {n: "model-text.safetensors" for n in names}}
    index["weight_map"].update({n: "model-mtp.safetensors" for n in mtp})
    with open(index_path, "w") as f:
        json.dump(index, f)
    return sorted(mtp)


def make_model(arch, path, seed, **config):
    """A random model saved at `path`. Every tensor (biases and norms too) is
    drawn at random so that no term of the forward is trivially zero or one.
    A Qwen3.5 VLM ("qwen3_5", "qwen3_5_moe") also gets mtp.* tensors and a
    sharded layout. `config` overrides keys of the tiny config (the MoE
    families only)."""
    torch.manual_seed(seed)
    vlm = arch in ("qwen3_5", "qwen3_5_moe")
    if vlm:
        # An explicit class, not an Auto one: AutoModelForCausalLM makes the text model alone.
        model = model_class(arch)(make_config(arch, **config)).to(torch.float32)
    else:
        # transformers 5 renamed torch_dtype to dtype; 4.57 (the dense archs) has the old name.
        dtype = {"dtype" if arch.startswith("qwen3_5") else "torch_dtype": torch.float32}
        model = model_class(arch).from_config(make_config(arch, **config), **dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if arch.startswith("qwen3_5"):
                randomize_qwen3_5(name, p)
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                # A router that prefers some experts per token, as a trained one does.
                p.normal_(0, 0.5)
            else:
                p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    if vlm:
        add_mtp_tensors(path, seed)
    return model


def assert_outside_decoder_kept(model_dir, exported_dir):
    """The export of a Qwen3.5 vision-language checkpoint keeps its
    model.visual.* and mtp.* tensors byte for byte, in their own dtypes."""
    from safetensors import safe_open

    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        shards = json.load(f)["weight_map"]
    kept = [n for n in shards if n.startswith(("model.visual.", "mtp."))]
    assert any(n.startswith("mtp.") for n in kept) and any("visual" in n for n in kept)
    with safe_open(os.path.join(exported_dir, "model.safetensors"), "pt") as out:
        for name in kept:
            with safe_open(os.path.join(model_dir, shards[name]), "pt") as base:
                a, b = out.get_tensor(name), base.get_tensor(name)
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8),
                                                      b.view(torch.uint8)), name


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


def run_measuring_rss(cmd):
    """Runs cmd to its end, polling its RSS every 10 ms; returns (exit code,
    stdout, stderr, peak RSS in bytes). The output goes through files, so a
    chatty process never blocks on a full pipe while it is polled."""
    import tempfile
    import time

    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        ps, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), peak


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def eval_loss(model, rows):
    """The validation loss as training defines it (README "Validation"): the
    sum over supervised targets of -log p(labels[t + 1] | ids[:t + 1]) over
    their count, each document alone, with `model` as it is (float64 for a
    reference)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            logits = model(torch.tensor([r["input_ids"]])).logits[0]
            targets = torch.tensor(r["labels"][1:])
            kept = targets != -100
            lp = torch.log_softmax(logits[:-1][kept], dim=-1)
            total -= lp.gather(1, targets[kept][:, None]).sum().item()
            count += int(kept.sum())
    return total / count


def write_rows(path, rows):
    """Documents as a tokens JSONL (input_ids, labels)."""
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def ballast_gradients(model_dir, data, out, adapter=None):
    """`ballast-train logits --gradients`: each trainable tensor's gradient
    by its checkpoint name (inference.h says of which loss)."""
    cmd = [TRAIN, "logits", "--model", model_dir, "--tokens", data, "--out", out, "--gradients"]
    if adapter:
        cmd += ["--adapter", adapter]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file
    return {k[len("grad."):]: v for k, v in load_file(out).items() if k.startswith("grad.")}


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


def check_adapter_round_trip(tmp_path, model_dir, data, rows, adapter, trained, load_base,
                             tolerance):
    """A trained adapter folder as users take it: PEFT loads it onto the base
    (`load_base(path)` loads a model folder) to the logits of `trained`, the
    reference model that took the same steps (within `tolerance`);
    ballast-train reads it back to PEFT's logits, and `ballast-train merge`
    folds it into a model that gives them too (within 1e-5, fp32 both sides)."""
    from peft import PeftModel

    peft_logits = hf_logits(PeftModel.from_pretrained(load_base(model_dir), adapter), rows)
    assert relative_error(peft_logits, hf_logits(trained, rows)) <= tolerance
    ours = ballast_logits(model_dir, data, str(tmp_path / "l.safetensors"), adapter_dir=adapter)
    assert relative_error(ours["logits"], peft_logits) <= 1e-5
    r = subprocess.run([TRAIN, "merge", "--model", model_dir, "--adapter", adapter, "--out",
                        str(tmp_path / "merged")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert relative_error(hf_logits(load_base(str(tmp_path / "merged")), rows),
                          peft_logits) <= 1e-5


def lora_against_peft(tmp_path, model_dir, rows, load_base, spec, tolerance):
    """ballast-train runs `spec`, a LoRA job whose lora.init_adapter is a PEFT
    adapter folder, and the reference trains that adapter on `load_base`'s
    model (reference_train): neither skips a step, and the loss and grad_norm
    curves agree within `tolerance`. Returns (ballast-train's run, its
    metrics, the trained reference, the job's adapter folder)."""
    from peft import PeftModel

    write_spec(tmp_path / "job.yaml", **spec)
    r = run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))
    ref = PeftModel.from_pretrained(load_base(model_dir), spec["lora"]["init_adapter"],
                                    is_trainable=True)
    losses, norms = reference_train(ref, rows, spec)
    assert not any(m["skipped"] for m in got)
    assert relative_error([m["loss"] for m in got], losses) <= tolerance
    assert relative_error([m["grad_norm"] for m in got], norms) <= tolerance
    return r, got, ref, str(tmp_path / "out" / "adapter")


def lr_lambda(kind, warmup, max_steps):
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)
    return {"constant": lambda o: get_constant_schedule_with_warmup(o, warmup),
            "linear": lambda o: get_linear_schedule_with_warmup(o, warmup, max_steps),
            "cosine": lambda o: get_cosine_schedule_with_warmup(o, warmup, max_steps)}[kind]


def routed_experts(router_logits, top_k):
    """The set of experts that the top-k of `router_logits` (tokens, E) chooses."""
    return set(torch.topk(router_logits.softmax(-1), top_k, dim=-1).indices.flatten().tolist())


def reference_train(model, rows, spec):
    """The reference loop: per optimizer step, every micro-batch's summed
    token CE divided by the step's supervised-token count, backward,
    clip_grad_norm_, AdamW, scheduler. Returns per-step (loss, grad_norm).

    A mixture of experts (config.num_experts) adds transformers'
    load_balancing_loss_func of each micro-batch's documents (their router
    logits concatenated, as one padded forward of them gives it) times
    router_aux_loss_coef, averaged over the step's micro-batches, and its loss
    includes that. Every expert of every sparse layer must be routed to in
    every step (asserted): transformers leaves an unrouted expert's gradient
    None and AdamW skips it, where Ballast gives it a zero gradient."""
    import inspect

    data, opt_spec, sched = spec["data"], spec["optimizer"], spec.get("schedule", {})
    config = getattr(model.config, "text_config", model.config)  # a VLM's decoder keys
    experts = getattr(config, "num_experts", 0)
    if experts:
        # The model's own (Qwen3-MoE's, Qwen3.5-MoE's).
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        load_balancing_loss_func = inspect.getmodule(type(base)).load_balancing_loss_func
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
        micro, accum = data.get("micro_batch_size", 1), data.get("grad_accum_steps", 1)
        routed = {}
        for m in range(accum):
            router_logits, micro_loss = [], 0.0
            for r in step_rows[m * micro:(m + 1) * micro]:
                out = model(torch.tensor([r["input_ids"]]), **(
                    {"output_router_logits": True} if experts else {}))
                logits = out.logits[0].float()
                ce = F.cross_entropy(logits[:-1], torch.tensor(r["labels"][1:]),
                                     ignore_index=-100, reduction="sum")
                total += ce.item()
                if not experts:
                    (ce / n).backward()
                    continue
                micro_loss = micro_loss + ce / n
                router_logits += list(out.router_logits)
                for layer, z in enumerate(out.router_logits):
                    routed.setdefault(layer, set()).update(
                        routed_experts(z.detach(), config.num_experts_per_tok))
            if experts:
                aux = load_balancing_loss_func(tuple(router_logits), experts,
                                               config.num_experts_per_tok)
                (micro_loss + config.router_aux_loss_coef * aux / accum).backward()
                total += n * config.router_aux_loss_coef * aux.item() / accum
        for layer, hit in routed.items():
            assert hit == set(range(experts)), f"sparse layer {layer} left experts out: {hit}"
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
