"""Parity of the Gated DeltaNet kernels (kernels/gated_delta_rule.h,
kernels/causal_conv1d.h) with fla and transformers 5.x, through
gated_delta_rule_check (tests/tools), under the hf5 venv.

References, per document (neither takes cu_seqlens): fla's
naive_recurrent_gated_delta_rule and naive_chunk_gated_delta_rule with q and
k L2-normalised as transformers does and repeated to the value heads;
transformers' torch_chunk_gated_delta_rule (use_qk_l2norm_in_kernel=True)
and causal_conv1d_fn. Tolerances: 1e-5 relative (Frobenius) in fp32, which
leaves room for two fp32 computations in different orders (each about 1e-6
from float64 here).

The packing defect (transformers #46851): on a packed row, transformers'
torch fallback ignores cu_seqlens and its conv runs across the row, so every
document after the first differs from the same document run alone; ours does
not. In 5.23, modeling_qwen3_5 wraps both functions
(use_kernel_func_from_hub_with_fallback): the rule goes to fla's Triton
kernel when fla is installed (GPU only; on this CPU it fails) and otherwise
refuses a `cu_seqlens` with a ValueError, while the conv goes to the
causal-conv1d package when installed and otherwise runs the torch path,
receiving the model's `cu_seq_lens_q` and dropping it. So the test calls the
rule's torch path unwrapped (inspect.unwrap), and the conv as the model does.
"""
import inspect
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from fla.ops.gated_delta_rule.naive import (naive_chunk_gated_delta_rule,
                                            naive_recurrent_gated_delta_rule)
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

TOOL = os.path.join(os.environ.get("BALLAST_BIN_DIR", "build/bin"), "gated_delta_rule_check")
LENGTHS = [37, 64, 1, 150, 90]
HK, HV, DK, DV, TAPS = 2, 4, 32, 16, 4
TOL = 1e-5
# transformers' torch implementation of the rule, under its hub/fla wrapper.
torch_chunk_gated_delta_rule = inspect.unwrap(hf.torch_chunk_gated_delta_rule)


def rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def random_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    t, n = sum(LENGTHS), len(LENGTHS)
    channels = 2 * HK * DK + HV * DV

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(t, HK, DK), "k": randn(t, HK, DK), "v": randn(t, HV, DV),
        "g": -torch.nn.functional.softplus(randn(t, HV) - 1.0),
        "beta": torch.sigmoid(randn(t, HV)),
        "cu_seqlens": torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int64),
        "initial_state": randn(n, HV, DK, DV) * 0.5,
        "d_out": randn(t, HV, DV), "d_final_state": randn(n, HV, DK, DV),
        "x": randn(t, channels), "conv_weight": randn(channels, TAPS) * 0.5,
        "d_y": randn(t, channels),
    }


def run_tool(tensors, tmp_path, *flags):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(src))
    subprocess.run([TOOL, "run", str(src), str(dst), *flags], check=True)
    return load_file(str(dst))


def documents(inp):
    cu = inp["cu_seqlens"].tolist()
    return [(n, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def gdn_reference(inp, fn, dtype=torch.float32):
    """fn per document; returns out, final_state and the gradients of
    sum(out * d_out) + sum(final_state * d_final_state)."""
    leaves = {name: inp[name].to(dtype).clone().requires_grad_(True)
              for name in ("q", "k", "v", "g", "beta", "initial_state")}
    group = HV // HK
    outs, finals = [], []
    for n, s, e in documents(inp):
        q = l2norm(leaves["q"][s:e]).repeat_interleave(group, 1)[None]
        k = l2norm(leaves["k"][s:e]).repeat_interleave(group, 1)[None]
        v, g, beta = leaves["v"][s:e][None], leaves["g"][s:e][None], leaves["beta"][s:e][None]
        h0 = leaves["initial_state"][n][None]
        if fn == "recurrent":
            o, h = naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=DK ** -0.5,
                                                    initial_state=h0, output_final_state=True)
        elif fn == "chunk":
            o, h = naive_chunk_gated_delta_rule(q, k, v, g, beta, scale=DK ** -0.5,
                                                initial_state=h0, output_final_state=True)
        else:  # transformers' chunked fallback, on the raw q and k (it normalises them)
            o, h = torch_chunk_gated_delta_rule(
                leaves["q"][s:e][None], leaves["k"][s:e][None], v, g, beta, initial_state=h0,
                output_final_state=True, use_qk_l2norm_in_kernel=True)
        outs.append(o[0])
        finals.append(h[0])
    out, final = torch.cat(outs), torch.stack(finals)
    ((out * inp["d_out"].to(dtype)).sum() + (final * inp["d_final_state"].to(dtype)).sum()).backward()
    result = {"out": out.detach(), "final_state": final.detach()}
    for name, leaf in leaves.items():
        result["d_" + name] = leaf.grad
    return result


GDN_INPUTS = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "d_out", "d_final_state")
GDN_OUTPUTS = ("out", "final_state", "d_q", "d_k", "d_v", "d_g", "d_beta", "d_initial_state")


@pytest.fixture(scope="module")
def inputs():
    return random_inputs()


@pytest.mark.parametrize("path", ["kernel", "aten"])
@pytest.mark.parametrize("reference", ["recurrent", "chunk", "transformers"])
def test_gdn_equals_references_per_document(inputs, tmp_path, path, reference):
    got = run_tool({k: inputs[k] for k in GDN_INPUTS}, tmp_path,
                   *(["--aten"] if path == "aten" else []))
    want = gdn_reference(inputs, reference)
    for name in GDN_OUTPUTS:
        assert rel(got[name], want[name]) < TOL, (name, rel(got[name], want[name]))


def conv_per_document(inp, x):
    """transformers' causal_conv1d_fn (depthwise, padding K - 1, SiLU) per document."""
    ys = [hf.causal_conv1d_fn(x[s:e].t()[None], inp["conv_weight"], None, activation="silu")[0].t()
          for _, s, e in documents(inp)]
    return torch.cat(ys)


def test_conv_equals_transformers_per_document(inputs, tmp_path):
    got = run_tool({k: inputs[k] for k in ("x", "conv_weight", "cu_seqlens", "d_y")}, tmp_path)
    x = inputs["x"].clone().requires_grad_(True)
    w = inputs["conv_weight"].clone().requires_grad_(True)
    inp = dict(inputs, conv_weight=w)
    y = conv_per_document(inp, x)
    (y * inputs["d_y"]).sum().backward()
    assert rel(got["y"], y.detach()) < TOL
    assert rel(got["d_x"], x.grad) < TOL
    assert rel(got["d_conv_weight"], w.grad) < TOL


def test_packed_row_leaks_in_transformers_and_not_here(inputs, tmp_path):
    """One packed row of five documents: transformers' fallback (conv then
    chunked rule, cu_seqlens passed and ignored) against the same documents
    one by one; ours against the same."""
    cu = inputs["cu_seqlens"]
    docs = documents(inputs)
    # The conv as the model calls it, with the packed row's offsets in
    # cu_seq_lens_q: the whole row at once.
    hf_row = hf.causal_conv1d_fn(inputs["x"].t()[None], inputs["conv_weight"], None,
                                 activation="silu", cu_seq_lens_q=cu)[0].t()
    alone = conv_per_document(inputs, inputs["x"])
    ours = run_tool({k: inputs[k] for k in ("x", "conv_weight", "cu_seqlens")}, tmp_path)["y"]
    assert rel(ours, alone) < TOL
    _, s, e = docs[1]
    assert rel(hf_row[s:e], alone[s:e]) > 1e-2, "transformers' conv no longer crosses documents"

    # The rule: transformers' chunked fallback on the row, without a state,
    # against the per-document result.
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    hf_out, _ = torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=None,
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    no_state = dict(inputs, initial_state=torch.zeros_like(inputs["initial_state"]))
    alone = gdn_reference(no_state, "transformers")["out"]
    ours = run_tool({n: inputs[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens")},
                    tmp_path)["out"]
    assert rel(ours, alone) < TOL
    s0, e0 = docs[0][1], docs[0][2]
    assert rel(hf_out[0][s0:e0], alone[s0:e0]) < TOL  # the first document sees nothing before it
    for n, s, e in docs[1:]:
        assert rel(hf_out[0][s:e], alone[s:e]) > 1e-3, (
            f"document {n}: transformers' fallback no longer carries the state across documents")
