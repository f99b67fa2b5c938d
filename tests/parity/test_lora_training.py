"""(b) 20 LoRA steps equal transformers + peft + torch.optim.AdamW, step for
step; (d) the exported adapter loads in peft and reproduces ballast's logits,
and the merged export equals the adapter applied."""
import os

import pytest
import torch

from reference import (base_spec, ballast_logits, hf_logits, make_dataset, make_model,
                       read_metrics, reference_train, relative_error, run_train, write_spec)

# Per-step loss and grad_norm over 20 AdamW steps: fp32 on both sides, with
# differences only in summation order (packing, tiled attention, chunked CE).
# These stay ~1e-6 and grow slowly through the optimizer; the bound
# 1e-4 is what a numerics bug (wrong scaling, normalisation, schedule) breaks.
TOLERANCE = 1e-4


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_lora_steps_match_peft(arch, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    model = make_model(arch, model_dir, seed=3)
    rows = make_dataset(data, n=24, vocab=model.config.vocab_size, seed=4)

    # Both sides start from one PEFT-initialised adapter; B = 0 as PEFT inits it.
    torch.manual_seed(5)
    init = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                          LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                     task_type="CAUSAL_LM"))
    init.save_pretrained(str(tmp_path / "init"))

    spec = base_spec(model_dir, data, lora={"init_adapter": str(tmp_path / "init")})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))

    ref_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                                          str(tmp_path / "init"), is_trainable=True)
    losses, norms = reference_train(ref_model, rows, spec)
    assert [m["step"] for m in got] == list(range(1, 21))
    assert not any(m["skipped"] for m in got)
    assert relative_error([m["loss"] for m in got], losses) <= TOLERANCE
    assert relative_error([m["grad_norm"] for m in got], norms) <= TOLERANCE

    # (d) The adapter as PEFT loads it gives ballast's own logits.
    adapter = str(tmp_path / "out" / "adapter")
    assert os.path.exists(os.path.join(adapter, "adapter_model.safetensors"))
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)
    ours = ballast_logits(model_dir, data, str(tmp_path / "l.safetensors"), adapter_dir=adapter)
    peft_logits = hf_logits(loaded, rows)
    assert relative_error(ours["logits"], peft_logits) <= 1e-5
    # ...and equals the reference's trained adapter, which saw the same steps.
    assert relative_error(hf_logits(ref_model, rows), peft_logits) <= TOLERANCE

    # The merged export is a plain HF model with the adapter folded in.
    import subprocess
    from reference import TRAIN
    r = subprocess.run([TRAIN, "merge", "--model", model_dir, "--adapter", adapter, "--out",
                        str(tmp_path / "merged")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert relative_error(hf_logits(merged, rows), peft_logits) <= 1e-5


def test_modules_to_save_round_trip_through_peft(tmp_path):
    """lm_head trained in full beside the adapters is saved where PEFT looks
    for it, so the loaded PeftModel reproduces ballast's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    model = make_model("qwen2", model_dir, seed=16)
    rows = make_dataset(data, n=8, vocab=model.config.vocab_size, seed=17)
    spec = base_spec(model_dir, data, max_steps=3, lora={"modules_to_save": ["lm_head"],
                                                          "target_modules": ["q_proj", "v_proj"]})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    adapter = str(tmp_path / "out" / "adapter")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)
    trained_head = loaded.base_model.model.lm_head.modules_to_save["default"].weight
    assert not torch.equal(trained_head, model.lm_head.weight), "lm_head did not train"
    ours = ballast_logits(model_dir, data, str(tmp_path / "l.safetensors"), adapter_dir=adapter)
    assert relative_error(ours["logits"], hf_logits(loaded, rows)) <= 1e-5
