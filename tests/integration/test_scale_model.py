"""bench/scale_model.py, the modelled step time against node count: its
formulas against hand-computed values, its traffic against the bytes the CPU
run counted, and docs/scaling.md's tables against its output."""
import importlib.util
import math
import os
import random
import re
import subprocess
import sys

import pytest

ROOT = os.environ.get("BALLAST_SOURCE_DIR",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "scale_model.py")

spec = importlib.util.spec_from_file_location("scale_model", SCRIPT)
sm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm)

GPU = sm.Hardware()
MIB = 2**20


def test_parameter_counts_are_the_published_models():
    # Layer by layer: q, k, v, o; gate, up, down; two norms, q_norm, k_norm.
    dense_layer = (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 12288
                   + 2 * 4096 + 2 * 128)
    p = sm.count(sm.QWEN3_8B, "full", 16)
    assert p.layers == 36 * dense_layer
    assert p.roots == 2 * 151936 * 4096 + 4096
    # transformers' Qwen3ForCausalLM of Qwen3-8B's config, on the meta device.
    assert p.total == 8_190_735_360
    expert = 3 * 2048 * 768
    moe_layer = (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 128 * expert + 128 * 2048
                 + 2 * 2048 + 2 * 128)
    p = sm.count(sm.QWEN3_30B_A3B, "full", 16)
    assert p.layers == 48 * moe_layer
    assert p.total == 30_532_122_624
    # A token multiplies by 8 of the 128 experts, the router and lm_head.
    assert p.matmul_active == 48 * (moe_layer - 120 * expert - 2 * 2048 - 2 * 128) + 151936 * 2048


def test_lora_trains_the_adapters_of_every_linear():
    p = sm.count(sm.QWEN3_8B, "lora", 16)
    per_layer = 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 12288)
                      + (12288 + 4096))
    assert p.trainable == p.adapter_active == p.weight_grads_active == 36 * per_layer
    # Gathered with the frozen weights: in V, never reduced but in the adapters' share.
    full = sm.count(sm.QWEN3_8B, "full", 16)
    assert p.layers == full.layers + 36 * per_layer and p.roots == full.roots
    assert sm.bytes_per_micro_batch(p, 2, 1) == 2 * (2 * p.layers + p.roots) + 4 * p.trainable
    # 2 forward + 2 input gradients through base and adapters, 2 weight gradients of adapters.
    assert sm.flops_per_token(sm.QWEN3_8B, p, 0) == 4 * p.matmul_active + 6 * p.trainable
    assert sm.flops_per_token(sm.QWEN3_8B, full, 1000) == \
        6 * full.matmul_active + 6 * 36 * 32 * 128 * 1000


def bench_row_mib(text, n):
    m = re.search(rf"zero3_cpu/qwen3-8L full N={n} bytes sent per rank per micro-batch .*?"
                  r"\(([0-9.]+) vs ([0-9.]+) MiB", text)
    assert m, f"no N={n} bytes row in bench/results/latest.md"
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("n", [2, 4])
def test_gloo_schedule_is_what_the_cpu_run_counted(n):
    """The fp32 Gloo schedule (layers gathered twice, roots once, one
    reduce-scatter pass: an all-to-all and a local sum) against the MiB
    bench/sharded_trainer.py reported."""
    p = sm.count(sm.BENCH_QWEN3_8L, "full", 0)
    layers = 8 * (1024 * 1024 + 2 * 1024 * 512 + 1024 * 1024 + 3 * 1024 * 2816 + 2 * 1024 + 2 * 64)
    roots = 8192 * 1024 + 1024  # tied: one embedding
    per_rank = (4 * (2 * layers + roots) + 4 * (layers + roots)) * (n - 1) / n
    assert sm.bytes_per_micro_batch(p, compute_bytes=4, reduce_passes=1) * (n - 1) / n == per_rank
    with open(os.path.join(ROOT, "bench", "results", "latest.md")) as f:
        counted, textbook = bench_row_mib(f.read(), n)
    assert per_rank / MIB == pytest.approx(counted, abs=0.05)
    assert 3 * 4 * (layers + roots) * (n - 1) / n / MIB == pytest.approx(textbook, abs=0.05)
    assert sm.cpu_check(counted / textbook)[1] == pytest.approx(1.0, abs=2e-4)


def random_hardware(rng):
    return sm.Hardware(peak_flops=rng.uniform(100e12, 2000e12), mfu=rng.uniform(0.1, 0.7),
                       nvlink=rng.uniform(100e9, 900e9), ib=rng.uniform(10e9, 100e9),
                       gpus_per_node=rng.choice([2, 4, 8]), traffic_scale=rng.uniform(0.9, 1.4))


def test_two_gpus_send_half_of_v_per_micro_batch():
    rng = random.Random()
    hw = random_hardware(rng)
    hw = sm.Hardware(**{**hw.__dict__, "gpus_per_node": 2})
    shape = rng.choice([sm.QWEN3_8B, sm.QWEN3_30B_A3B])
    p = sm.count(shape, "full", 16)
    tokens = rng.choice([2048, 8192])
    s = sm.step(shape, p, hw, tokens, nodes=1, global_tokens=2 * tokens)
    v = hw.traffic_scale * (2 * 2 * p.layers + 2 * p.roots + 4 * p.total)  # bf16 gathers, NCCL
    assert s.micro_batches == 1
    assert s.zero3_comm == pytest.approx(v / 2 / hw.nvlink, rel=1e-12)
    assert s.overlapped(s.zero3_comm) == max(s.compute, s.zero3_comm)
    assert s.serial(s.zero3_comm) == s.compute + s.zero3_comm


def test_hsdp_on_one_node_is_zero3_and_across_nodes_adds_one_all_reduce():
    rng = random.Random()
    hw = random_hardware(rng)
    shape = rng.choice([sm.QWEN3_8B, sm.QWEN3_30B_A3B])
    p = sm.count(shape, rng.choice(["full", "lora"]), rng.choice([8, 16, 64]))
    tokens = rng.choice([4096, 8192, 32768])
    global_tokens = 64 * hw.gpus_per_node * tokens
    one = sm.step(shape, p, hw, tokens, 1, global_tokens)
    assert one.hsdp_comm == one.zero3_comm
    m = rng.choice([2, 4, 8, 16])
    g = hw.gpus_per_node
    many = sm.step(shape, p, hw, tokens, m, global_tokens)
    a = 64 // m
    v = sm.traffic(p, hw)
    assert many.micro_batches == a
    assert many.compute == pytest.approx(one.compute / m, rel=1e-12)
    assert many.zero3_comm == pytest.approx(a * v * (g * m - 1) / (g * m) / hw.ib, rel=1e-12)
    all_reduce = 2 * (m - 1) / m * 4 * p.trainable / g / hw.ib * hw.traffic_scale
    assert many.hsdp_comm == pytest.approx(a * v * (g - 1) / g / hw.nvlink + all_reduce, rel=1e-12)


def test_zero3_crossover_tokens_balance_comm_and_compute():
    for shape in sm.MODELS.values():
        p = sm.count(shape, "full", 16)
        t = sm.zero3_tokens_crossover(shape, p, GPU)
        assert sm.compute_seconds(shape, p, GPU, t) == pytest.approx(sm.traffic(p, GPU) / GPU.ib,
                                                                     rel=1e-9)
        below = sm.step(shape, p, GPU, int(t * 0.9), 1024, 2**40)
        above = sm.step(shape, p, GPU, int(t * 1.1), 1024, 2**40)
        assert below.zero3_comm > below.compute and above.zero3_comm < above.compute


def test_hsdp_crossover_nodes_of_the_moe_full_finetune_at_8k():
    shape, tokens, global_tokens = sm.QWEN3_30B_A3B, 8192, 4 * 2**20
    p = sm.count(shape, "full", 16)
    s = sm.compute_seconds(shape, p, GPU, tokens) - sm.traffic(p, GPU) * 7 / 8 / GPU.nvlink
    m_star = 1 + global_tokens * s * GPU.ib / (8 * tokens * p.trainable)
    assert sm.hsdp_nodes_crossover(shape, p, GPU, tokens, global_tokens) == pytest.approx(m_star)
    assert 8 < m_star < 16 <= global_tokens / (8 * tokens)
    for nodes, comm_bound in [(8, False), (16, True)]:
        st = sm.step(shape, p, GPU, tokens, nodes, global_tokens)
        assert (st.hsdp_comm > st.compute) == comm_bound, (nodes, st)
    # The dense 8B sends so little per step that it never gets there.
    assert math.isinf(sm.hsdp_nodes_crossover(sm.QWEN3_8B, sm.count(sm.QWEN3_8B, "full", 16),
                                              GPU, tokens, global_tokens))


def test_docs_tables_are_the_scripts_output():
    out = subprocess.run([sys.executable, SCRIPT, "--table"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    with open(os.path.join(ROOT, "docs", "scaling.md")) as f:
        doc = f.read()
    m = re.search(r"<!-- generated: python3 bench/scale_model.py --table -->\n(.*)"
                  r"<!-- end of generated tables -->", doc, re.S)
    assert m, "docs/scaling.md lost its generated block"
    assert m.group(1) == out, "regenerate: python3 bench/scale_model.py --table into docs/scaling.md"
    assert "Modelled, not measured" in out


def test_bench_rows_say_modelled_and_take_the_measured_ratio():
    out = subprocess.run([sys.executable, SCRIPT, "--measured-ratio", "0.9728"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    rows = out.splitlines()
    assert rows[0].startswith("scale_model/") and "measured 0.973x: 1.000x of the model" in rows[0]
    assert all(r.startswith("scale_model/") and "modelled" in r for r in rows)


@pytest.mark.parametrize("args,name", [(["--mfu", "0"], "--mfu"), (["--mfu", "1.5"], "--mfu"),
                                       (["--ib-gbs", "-1"], "--ib-gbs"),
                                       (["--gpus-per-node", "0"], "--gpus-per-node"),
                                       (["--measured-ratio", "0"], "--measured-ratio")])
def test_bad_arguments_exit_2_naming_the_flag(args, name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [SCRIPT, *args])
    with pytest.raises(SystemExit) as e:
        sm.main()
    assert e.value.code == 2 and name in capsys.readouterr().err
