"""(a) Forward logits equal transformers' on packed documents, for every architecture."""
import pytest

from reference import ballast_logits, hf_logits, make_dataset, make_model, relative_error

# fp32 on both sides with the same op order except attention (online softmax,
# tiled) and packing: measured differences are ~1e-7; 1e-5 leaves room for
# accumulation-order noise while catching any real numerics difference.
TOLERANCE = 1e-5


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_logits_match_transformers(arch, tmp_path):
    model = make_model(arch, tmp_path / "model", seed=1)
    rows = make_dataset(tmp_path / "docs.jsonl", n=5, vocab=model.config.vocab_size, seed=2,
                        max_len=200)
    got = ballast_logits(str(tmp_path / "model"), str(tmp_path / "docs.jsonl"),
                         str(tmp_path / "logits.safetensors"))
    want = hf_logits(model, rows)
    assert got["logits"].shape == want.shape
    err = relative_error(got["logits"], want)
    assert err <= TOLERANCE, f"{arch}: relative error {err:.2e}"
