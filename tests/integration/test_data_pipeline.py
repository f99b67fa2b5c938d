"""The data pipeline as a user meets it: chats in a JSONL file, the model's
tokenizer.json and tokenizer_config.json, and ballast-train's data-check,
tokenize and training runs (issue 16). The tokenizer is trained here and the
Qwen3 template text is the parity test's, so nothing is downloaded."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
from reference import TRAIN, base_spec, make_model, write_spec  # noqa: E402
from test_chat_template import QWEN3  # noqa: E402
from trained_tokenizers import write_chat_tokenizer  # noqa: E402

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
     {"role": "assistant", "content": "Hi!", "reasoning_content": "A greeting."}],
    [{"role": "user", "content": "Count: 1, 2, 3"},
     {"role": "assistant", "content": "4, 5, 6\n\nand so on."}],
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The parity tests' tiny qwen3 (vocabulary 320) with a tokenizer of
    fewer ids trained here, Qwen3's template and EOS."""
    root = tmp_path_factory.mktemp("model")
    path = str(root / "model")
    make_model("qwen3", path, seed=1)
    write_chat_tokenizer(path, QWEN3)
    return path


def write_chats(path, chats, bad_line=None):
    with open(path, "w") as f:
        for i, chat in enumerate(chats):
            if bad_line is not None and i == bad_line:
                f.write('{"messages": [{"role": "user", "content": "no answer"}]}\n')
            f.write(json.dumps({"messages": chat}) + "\n")


def run(*args, stdin=None):
    return subprocess.run([TRAIN, *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_tokenize_gives_the_ids_and_masks_of_apply_chat_template(model):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model, "tokenizer.json"))
    hf.chat_template = QWEN3
    lines = [json.dumps({"messages": c}) for c in CHATS] + [json.dumps({"text": "héllo  wörld"})]
    r = run("tokenize", "--tokenizer", model, stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    for chat, reply in zip(CHATS, replies):
        assert reply["ids"] == hf.apply_chat_template(chat, tokenize=True)
        # The assistant answer and its <|im_end|> are trained; the header is not.
        trained = [i for i, m in zip(reply["ids"], reply["assistant_masks"]) if m]
        assert hf.decode(trained).endswith("<|im_end|>")
        assert chat[-1]["content"] in hf.decode(trained)
        assert "<|im_start|>" not in hf.decode(trained)
    assert replies[-1]["ids"] == hf.encode("héllo  wörld", add_special_tokens=False)
    # A bad line is answered in place, and the exit code says so.
    r = run("tokenize", "--tokenizer", model, stdin='{"messages": 3}\n{"text": "ok"}\n')
    assert r.returncode == 1
    first, second = [json.loads(line) for line in r.stdout.splitlines()]
    assert first["error"].startswith("line 1:")
    assert "ids" in second


def test_data_check_shows_the_choices_the_counts_and_the_trained_tokens(model, tmp_path):
    data = str(tmp_path / "chats.jsonl")
    write_chats(data, CHATS, bad_line=2)
    write_spec(tmp_path / "job.yaml", **base_spec(model, data, max_steps=4, data={"seq_len": 256}))
    r = run("data-check", "--spec", str(tmp_path / "job.yaml"), "--set",
            "data.on_bad_record=skip", "--set", "data.packing=true", "--rows", "5")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "as messages (detected from its first record), template qwen3 " \
           "(from tokenizer_config.json), train_on assistant" in out
    assert "records 4, documents 3, bad records skipped 1" in out
    assert f"bad record: {data}:3: no token to train on" in out
    assert "(packed)" in out
    assert "⟦4<|im_end|>⟧" in out
    # The final turn's reasoning is trained; an empty think block is not.
    assert "⟦<think>\\nA greeting.\\n</think>\\n\\nHi!<|im_end|>⟧" in out
    assert "<think>\\n\\n</think>\\n\\n⟦4<|im_end|>⟧" in out

    # Under "fail", the same record stops the check, naming file and line.
    r = run("data-check", "--spec", str(tmp_path / "job.yaml"))
    assert r.returncode == 2
    assert f"{data}:3: no token to train on" in r.stderr


def test_a_job_on_chats_tokenizes_once_and_trains(model, tmp_path):
    data = str(tmp_path / "chats.jsonl")
    write_chats(data, CHATS * 4)
    write_spec(tmp_path / "job.yaml",
               **base_spec(model, data, max_steps=4,
                          data={"seq_len": 256, "packing": True, "micro_batch_size": 2}))
    out = str(tmp_path / "out")
    r = run("--spec", str(tmp_path / "job.yaml"), "--out", out)
    assert r.returncode == 0, r.stderr
    assert "as messages (detected from its first record), template qwen3" in r.stderr
    assert "tokenized into the job's token cache" in r.stderr
    assert os.path.exists(os.path.join(out, "data-cache", "cache.json"))
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["loss"] is not None and s["loss"] > 0 for s in steps)
    # Again on the same folder: the cache is read, not rebuilt.
    r = run("--spec", str(tmp_path / "job.yaml"), "--out", out)
    assert r.returncode == 0, r.stderr
    assert "read from the job's token cache" in r.stderr
