"""The load-balancing loss of a Mixture-of-Experts step in float64, as plain
as the math, for the tests that check ballast-train's against it.

A step is a list of micro-batches (over all ranks); a micro-batch is a list of
router-logit tensors, one per MoE layer, each [T, E] over the micro-batch's
tokens, and a mask [T] (1: a token that counts, 0: padding, or what block
diffusion leaves out). With k experts per token and p = softmax(logits):

  f[k', e]  fraction of counted tokens whose k'-th choice is e   ([k, E])
  P[e]      mean router probability of e over counted tokens     ([E])
  loss      E · Σ_{k', e} f[k', e] · P[e]

  scope all_layers: f and P over the layers' tokens concatenated (transformers)
  scope per_layer:  the mean over layers of each layer's loss (Megatron)
  mode micro_batch: f and P over one micro-batch; the step's loss is the mean
                    of its micro-batches' (what gradient accumulation of
                    transformers' per-forward loss gives)
  mode global:      f and P over every token of the step (arXiv 2501.11873)

The coefficient (router_aux_loss_coef) is not applied here.
"""
import torch


def route(logits, k, bias=None):
    """p = softmax(logits) in float64, and the top-k choices [T, k]: of p, or
    of p + bias (aux_free: the bias picks the experts, never weighs them)."""
    p = torch.softmax(logits.double(), dim=-1)
    scores = p if bias is None else p + bias.double()
    return p, torch.topk(scores, k, dim=-1).indices


def counts(logits, mask, k, bias=None):
    """A layer's sums over counted tokens: choice counts [k, E], probability
    sums [E], and the number of tokens."""
    p, idx = route(logits, k, bias)
    m = mask.double()
    one_hot = torch.nn.functional.one_hot(idx, logits.shape[-1]).double()  # [T, k, E]
    return (one_hot * m[:, None, None]).sum(0), (p * m[:, None]).sum(0), m.sum()


def switch_loss(choice_counts, prob_sums, tokens):
    """E · Σ f · P from summed counts."""
    experts = prob_sums.shape[-1]
    return experts * ((choice_counts / tokens) * (prob_sums / tokens)[None, :]).sum()


def loss_of(batches, k, scope):
    """The loss of f and P counted over all of `batches` (each a (layers,
    mask) pair)."""
    layers = len(batches[0][0])
    per_layer = []
    for layer in range(layers):
        sums = [counts(logits[layer], mask, k) for logits, mask in batches]
        per_layer.append(tuple(sum(s[i] for s in sums) for i in range(3)))
    if scope == "per_layer":
        return torch.stack([switch_loss(*c) for c in per_layer]).mean()
    # Concatenated over layers: every layer's tokens counted once more.
    return switch_loss(*(sum(c[i] for c in per_layer) for i in range(3)))


def aux_loss(step, k, mode="global", scope="all_layers"):
    """The step's load-balancing loss, float64. `step` is a list of
    (layers, mask) micro-batches over every rank."""
    if mode == "global":
        return loss_of(step, k, scope)
    return torch.stack([loss_of([mb], k, scope) for mb in step]).mean()


def aux_free_update(bias, load, rate):
    """DeepSeek-V3's bias step after an optimizer step: each expert's bias
    moves by rate towards the mean load, bias_e += rate · sign(mean − load_e)."""
    load = load.double()
    return bias.double() + rate * torch.sign(load.mean() - load)


def layer_stats(logits, mask, k):
    """What the metrics report of one layer: max load / mean load, the
    fraction of idle experts, mean router entropy (nats), and the share of
    pairs on the k busiest experts."""
    choice_counts, _, tokens = counts(logits, mask, k)
    load = choice_counts.sum(0)
    p = torch.softmax(logits.double(), dim=-1)
    entropy = -(p * torch.log(p)).sum(-1)
    return {
        "expert_load_max_ratio": (load.max() / load.mean()).item(),
        "idle_expert_fraction": (load == 0).double().mean().item(),
        "router_entropy": ((entropy * mask.double()).sum() / tokens).item(),
        "top_k_share": (torch.topk(load, k).values.sum() / load.sum()).item(),
    }
