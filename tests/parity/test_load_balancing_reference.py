"""The float64 load-balancing reference (load_balancing_reference.py) against
transformers 4.57.6's load_balancing_loss_func, and the identities the
trainer's global mode rests on, on fresh random router logits:

- micro_batch / all_layers is transformers' loss, padding masked;
- global over a step does not depend on how its tokens are split into
  micro-batches (GA 4x1 = 1x4), where micro_batch does;
- the global loss is a sum of per-micro-batch terms once the choice fractions
  f are known (counted in a routing pre-pass), and the sum's gradient is the
  global loss's: what makes accumulation exact.
"""
import random

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

import load_balancing_reference as ref

E, K, LAYERS = 8, 2, 3


def random_step(micro_batches, tokens, seed, pad=True):
    g = torch.Generator().manual_seed(seed)
    step = []
    for _ in range(micro_batches):
        layers = [torch.randn(tokens, E, generator=g, dtype=torch.float64) * 2
                  for _ in range(LAYERS)]
        mask = torch.ones(tokens, dtype=torch.long)
        if pad:
            mask[torch.randint(1, tokens // 2, (1,), generator=g).item():] = 0
        step.append((layers, mask))
    return step


@pytest.fixture
def seed():
    s = random.SystemRandom().randrange(2**31)
    print(f"seed {s}")
    return s


def test_micro_batch_all_layers_is_transformers_loss(seed):
    for layers, mask in random_step(3, 16, seed):
        # transformers takes [batch, seq] masks and the layers' logits as a
        # tuple; it counts f in float32 (expert_mask.float()), hence 1e-6.
        hf = load_balancing_loss_func(tuple(layers), E, K, mask[None, :])
        ours = ref.aux_loss([(layers, mask)], K, mode="micro_batch")
        assert torch.allclose(ours, hf.double(), rtol=1e-6, atol=0), (ours, hf)


def test_padding_counts_nowhere(seed):
    layers, mask = random_step(1, 16, seed)[0]
    kept = mask.bool()
    trimmed = [(([l[kept] for l in layers]), mask[kept])]
    for scope in ("all_layers", "per_layer"):
        assert torch.allclose(ref.aux_loss([(layers, mask)], K, scope=scope),
                              ref.aux_loss(trimmed, K, scope=scope), rtol=1e-12)


def test_per_layer_is_the_mean_of_single_layer_losses(seed):
    step = random_step(2, 16, seed)
    per_layer = ref.aux_loss(step, K, scope="per_layer")
    singles = [ref.aux_loss([([layers[i]], mask) for layers, mask in step], K)
               for i in range(LAYERS)]
    assert torch.allclose(per_layer, torch.stack(singles).mean(), rtol=1e-12)


def test_global_ignores_the_split_and_micro_batch_does_not(seed):
    # One step of 4 micro-batches of 8 tokens, and the same tokens as one
    # micro-batch of 32: GA 4x1 against 1x4.
    step = random_step(4, 8, seed, pad=False)
    whole = [([torch.cat([mb[0][i] for mb in step]) for i in range(LAYERS)],
              torch.cat([mb[1] for mb in step]))]
    for scope in ("all_layers", "per_layer"):
        assert torch.allclose(ref.aux_loss(step, K, "global", scope),
                              ref.aux_loss(whole, K, "global", scope), rtol=1e-12)
        split = ref.aux_loss(step, K, "micro_batch", scope)
        joined = ref.aux_loss(whole, K, "micro_batch", scope)
        assert abs(split - joined) > 1e-6 * abs(joined), (split, joined)


def test_global_loss_is_a_sum_of_micro_batch_terms_with_the_same_gradient(seed):
    step = random_step(4, 12, seed)
    leaves = [[l.clone().requires_grad_(True) for l in layers] for layers, _ in step]
    batches = [(ls, mask) for ls, (_, mask) in zip(leaves, step)]
    total = ref.aux_loss(batches, K, "global")
    grads = torch.autograd.grad(total, [l for ls in leaves for l in ls])

    # The pre-pass: f of every layer counted over the step (no gradient), and
    # the step's token count; then each micro-batch's own term, E · Σ_e
    # F_e · Σ_t p_t,e / (L · T) with F_e = Σ_k' f[k', e] over the layers
    # concatenated, summed.
    choices = sum(ref.counts(l.detach(), m, K)[0] for ls, m in batches for l in ls)
    tokens = sum(m.double().sum() for _, m in batches) * LAYERS
    f = choices.sum(0) / tokens
    terms = []
    for ls, m in batches:
        prob_sums = sum((torch.softmax(l, -1) * m.double()[:, None]).sum(0) for l in ls)
        terms.append(E * (f * prob_sums).sum() / tokens)
    summed = torch.stack(terms).sum()
    assert torch.allclose(summed, total, rtol=1e-12)
    summed_grads = torch.autograd.grad(summed, [l for ls in leaves for l in ls])
    for a, b in zip(summed_grads, grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-15)


def test_aux_free_bias_moves_load_towards_the_mean(seed):
    g = torch.Generator().manual_seed(seed)
    # A router that prefers expert 0 by a margin the bias has to undo.
    logits = torch.randn(512, E, generator=g, dtype=torch.float64)
    logits[:, 0] += 1.5
    mask = torch.ones(512)
    bias = torch.zeros(E, dtype=torch.float64)
    first = None
    for _ in range(200):
        load = ref.counts(logits, mask, K, bias)[0].sum(0)
        first = load if first is None else first
        bias = ref.aux_free_update(bias, load, rate=1e-3)
    assert load.max() / load.mean() < first.max() / first.mean()
    assert bias[0] < 0 < bias[1:].max()
