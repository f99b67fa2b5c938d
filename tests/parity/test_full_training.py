"""(c) 20 steps of full finetuning equal transformers + torch.optim.AdamW."""
import pytest

from reference import (base_spec, hf_logits, make_dataset, make_model, read_metrics,
                       reference_train, relative_error, run_train, write_spec)

# As for LoRA: fp32 on both sides, differences only in summation order.
TOLERANCE = 1e-4


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_full_finetune_matches_torch(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    model = make_model(arch, model_dir, seed=6)
    rows = make_dataset(data, n=24, vocab=model.config.vocab_size, seed=7)
    spec = base_spec(model_dir, data, method="full", optimizer={"lr": 3e-4},
                     schedule={"kind": "linear", "warmup_steps": 2})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "out"))
    got = read_metrics(str(tmp_path / "out"))

    ref = AutoModelForCausalLM.from_pretrained(model_dir)
    losses, norms = reference_train(ref, rows, spec)
    assert relative_error([m["loss"] for m in got], losses) <= TOLERANCE
    assert relative_error([m["grad_norm"] for m in got], norms) <= TOLERANCE

    # The exported model is the reference's trained model.
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "model"))
    assert relative_error(hf_logits(exported, rows), hf_logits(ref, rows)) <= TOLERANCE
