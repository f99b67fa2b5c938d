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
from special_token_chats import plain_chat_ids  # noqa: E402
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


# Issue 34: special-token text inside records. `tokenizers` splits special
# tokens out of the text by default and, with encode_special_tokens=True,
# encodes their text as plain text (added tokens that are not special, such
# as <think>, are matched either way).
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def special_texts(rng, n):
    pieces = ["hello", " world", " 42", "\n", "é", "<think>"] + SPECIAL
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return texts + ["plain " + SPECIAL[0] + " and " + SPECIAL[1], "plain"]


def references(model):
    from tokenizers import Tokenizer
    allowed = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    plain = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    plain.encode_special_tokens = True
    return {True: allowed, False: plain}


def special_chats(rng, n):
    """Chats whose messages hold special-token text. An assistant's content
    starts with a letter, as a chat's answer mostly does."""
    chats = []
    for texts in zip(special_texts(rng, n), special_texts(rng, n), special_texts(rng, n)):
        chat = [{"role": "user", "content": texts[0]},
                {"role": "assistant", "content": "a" + texts[1]}]
        if rng.random() < 0.5:
            chat += [{"role": "user", "content": texts[2]}, {"role": "assistant", "content": "b"}]
        chats.append(chat)
    return chats


def test_tokenize_encodes_special_token_text_as_tokenizers_does(model):
    import random
    import time
    from transformers import PreTrainedTokenizerFast
    seed = time.time_ns() % 2**32
    rng = random.Random(seed)
    texts = special_texts(rng, 40)
    chats = special_chats(rng, 20)
    lines = ([json.dumps({"text": t}) for t in texts]
             + [json.dumps({"messages": chat}) for chat in chats])
    holding = (sum(any(s in t for s in SPECIAL) for t in texts)
               + sum(any(s in m["content"] for m in chat for s in SPECIAL) for chat in chats))
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model, "tokenizer.json"))
    hf.chat_template = QWEN3
    for allow, reference in references(model).items():
        r = run("tokenize", "--tokenizer", model, *(["--allow-special"] if allow else []),
                stdin="\n".join(lines) + "\n")
        assert r.returncode == 0, r.stderr
        replies = [json.loads(line) for line in r.stdout.splitlines()]
        for text, reply in zip(texts, replies):
            assert reply["ids"] == reference.encode(text, add_special_tokens=False).ids, \
                f"seed {seed}, allow {allow}: {text!r}"
        for chat, reply in zip(chats, replies[len(texts):]):
            # Allowed, the text is the token, as apply_chat_template makes it;
            # else plain text between the template's own tokens.
            want = (hf.apply_chat_template(chat, tokenize=True) if allow
                    else plain_chat_ids(hf, reference, chat, SPECIAL))
            assert reply["ids"] == want, f"seed {seed}, allow {allow}: {chat!r}"
        assert (f"{holding} lines contained special-token text, encoded as "
                + ("special tokens" if allow else "plain text")) in r.stderr, f"seed {seed}"


def test_a_job_encodes_special_token_text_as_tokenizers_does_and_counts_it(model, tmp_path):
    import random
    import time
    import numpy as np
    seed = time.time_ns() % 2**32
    texts = special_texts(random.Random(seed), 30)
    holding = sum(any(s in t for s in SPECIAL) for t in texts)
    data = str(tmp_path / "texts.jsonl")
    with open(data, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
        f.write('{"text": "<|im_start|> not counted"}\0junk\n')  # a bad record, skipped
    eos = references(model)[True].token_to_id("<|im_end|>")
    for allow, reference in references(model).items():
        note = (f"{holding} records contained special-token text, encoded as "
                + ("special tokens (data.allow_special_tokens: true)" if allow
                   else "plain text (data.allow_special_tokens: false)"))
        spec = tmp_path / f"job-{allow}.yaml"
        write_spec(spec, **base_spec(model, data, max_steps=1, schedule={"warmup_steps": 0},
                                     data={"seq_len": 256, "format": "text",
                                           "on_bad_record": "skip",
                                           "allow_special_tokens": allow}))
        r = run("data-check", "--spec", str(spec), "--rows", "0")
        assert r.returncode == 0, r.stderr
        assert note in r.stdout, f"seed {seed}: {r.stdout}"
        out = str(tmp_path / f"out-{allow}")
        for tokenized in ("tokenized into", "read from"):
            r = run("--spec", str(spec), "--out", out)
            assert r.returncode == 0, r.stderr
            assert f"{tokenized} the job's token cache" in r.stderr
            assert note in r.stderr, f"seed {seed}: {r.stderr}"
        cache = os.path.join(out, "data-cache")
        ids = np.fromfile(os.path.join(cache, "documents.ids"), dtype=np.int32)
        index = np.fromfile(os.path.join(cache, "documents.index"), dtype=np.int64).reshape(-1, 5)
        assert len(index) == len(texts)
        for (offset, length, line, _, _), text in zip(index, texts):
            want = reference.encode(text, add_special_tokens=False).ids + [eos]
            assert ids[offset:offset + length].tolist() == want, \
                f"seed {seed}, allow {allow}, line {line + 1}: {text!r}"
