"""Qwen3.5's text decoder in float64, as plain as the math: the reference of
the gradient checks (test_qwen3_5.py, and test_qwen3_5_moe.py for its
mixture of experts with a gated shared expert and the load-balancing loss). transformers casts to fp32 inside its
norms and its gated delta rule even in a float64 model, so it cannot be the
float64 reference itself; this is checked against it in fp32 instead.

Tensors are named as the text model's checkpoint names them
("model.layers.0.linear_attn.A_log"); LoRA adapters, when given, as
"<module>.lora_A.weight" / "<module>.lora_B.weight" beside the base weight.
One document at a time (the recurrence and the conv start fresh for each)."""
import json
import os

import torch
import torch.nn.functional as F


def zero_centred_norm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def rope(x, cos, sin):
    """Rotate-half RoPE on the first cos.shape[-1] channels of each head."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    rotated = torch.cat([-rot[..., r // 2:], rot[..., :r // 2]], -1)
    return torch.cat([rot * cos[:, None] + rotated * sin[:, None], rest], -1)


def chunked_delta_rule(q, k, v, g, beta, chunk=64):
    """The recurrence of Reference.gated_delta_net in chunks, in q's dtype
    (transformers' torch_chunk_gated_delta_rule without its casts to fp32):
    the same sums re-associated, for documents whose token-by-token autograd
    graph would not fit in memory. q, k, v (T, H, D) with q scaled and q, k
    normalised; g, beta (T, H). Returns (T, H, Dv)."""
    t, h, dk = k.shape
    pad = (chunk - t % chunk) % chunk
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))   # (H, T', D)
    g, beta = (F.pad(x.transpose(0, 1), (0, pad)) for x in (g, beta))       # (H, T')
    n = q.shape[1] // chunk
    q, k, v = (x.reshape(h, n, chunk, -1) for x in (q, k, v))
    beta, g = beta.reshape(h, n, chunk), g.reshape(h, n, chunk).cumsum(-1)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    # (I + strict_lower(diag(beta) K K^T * decay)) [u | w] = [V beta | K beta exp(g)]
    system = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1) + torch.eye(chunk, dtype=q.dtype)
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False,
                                      unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay  # decay is 0 above the diagonal
    # Per-chunk pieces by unbind, whose backward is one stack: indexing the
    # whole tensor in the loop would make a full-size gradient per chunk,
    # quadratic in T.
    u, w, intra = u.unbind(1), w.unbind(1), intra.unbind(1)
    q_decayed = (q * g.exp()[..., None]).unbind(1)
    k_decayed = (k * (g[..., -1:] - g).exp()[..., None]).transpose(-1, -2).unbind(1)
    chunk_decay = g[..., -1].exp()[..., None, None].unbind(1)
    state = torch.zeros(h, dk, v.shape[-1], dtype=q.dtype)
    outs = []
    for i in range(n):
        v_new = u[i] - w[i] @ state
        outs.append(q_decayed[i] @ state + intra[i] @ v_new)
        state = state * chunk_decay[i] + k_decayed[i] @ v_new
    return torch.cat(outs, 1)[:, :t].transpose(0, 1)


class Reference:
    def __init__(self, params, config, lora_scaling=None, chunked=False):
        """params: name -> float64 tensor; config: the text config (a dict).
        chunked: the delta rule by chunked_delta_rule rather than token by
        token."""
        self.p, self.c, self.scaling, self.chunked = params, config, lora_scaling, chunked

    def linear(self, x, module):
        y = x @ self.p[module + ".weight"].T
        if module + ".lora_A.weight" in self.p:
            y = y + self.scaling * (x @ self.p[module + ".lora_A.weight"].T) @ \
                self.p[module + ".lora_B.weight"].T
        return y

    def gated_delta_net(self, x, prefix):
        c, p, t = self.c, self.p, x.shape[0]
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        qkv = self.linear(x, prefix + "in_proj_qkv")                      # (T, C)
        z = self.linear(x, prefix + "in_proj_z").view(t, hv, dv)
        b = self.linear(x, prefix + "in_proj_b")                          # (T, Hv)
        a = self.linear(x, prefix + "in_proj_a")
        w = p[prefix + "conv1d.weight"][:, 0, :]                          # (C, K)
        k_width = w.shape[1]
        padded = F.pad(qkv.T, (k_width - 1, 0))                           # (C, K - 1 + T)
        conv = sum(w[:, j:j + 1] * padded[:, j:j + t] for j in range(k_width))
        qkv = F.silu(conv.T)
        q, k, v = torch.split(qkv, [hk * dk, hk * dk, hv * dv], -1)
        q = q.reshape(t, hk, dk).repeat_interleave(hv // hk, 1)
        k = k.reshape(t, hk, dk).repeat_interleave(hv // hk, 1)
        v = v.reshape(t, hv, dv)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(b)
        g = -torch.exp(p[prefix + "A_log"]) * F.softplus(a + p[prefix + "dt_bias"])
        if self.chunked:
            o = chunked_delta_rule(q, k, v, g, beta)
        else:
            state = torch.zeros(hv, dk, dv, dtype=x.dtype)
            outs = []
            for i in range(t):
                # S = exp(g) S + beta k (v - exp(g) S^T k)^T;  o = S^T q
                state = state * torch.exp(g[i])[:, None, None]
                delta = (v[i] - torch.einsum("hkv,hk->hv", state, k[i])) * beta[i][:, None]
                state = state + torch.einsum("hk,hv->hkv", k[i], delta)
                outs.append(torch.einsum("hkv,hk->hv", state, q[i]))
            o = torch.stack(outs)                                          # (T, Hv, Dv)
        o = p[prefix + "norm.weight"] * o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) +
                                                       c["rms_norm_eps"]) * F.silu(z)
        return self.linear(o.reshape(t, hv * dv), prefix + "out_proj")

    def attention(self, x, prefix, cos, sin):
        c, p, t = self.c, self.p, x.shape[0]
        h, hkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        query_gate = self.linear(x, prefix + "q_proj").view(t, h, 2 * d)
        q, gate = query_gate[..., :d], query_gate[..., d:].reshape(t, h * d)
        k = self.linear(x, prefix + "k_proj").view(t, hkv, d)
        v = self.linear(x, prefix + "v_proj").view(t, hkv, d)
        q = rope(zero_centred_norm(q, p[prefix + "q_norm.weight"], c["rms_norm_eps"]), cos, sin)
        k = rope(zero_centred_norm(k, p[prefix + "k_norm.weight"], c["rms_norm_eps"]), cos, sin)
        k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
        scores = torch.einsum("thd,shd->hts", q, k) * d ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        o = torch.einsum("hts,shd->thd", weights, v).reshape(t, h * d)
        return self.linear(o * torch.sigmoid(gate), prefix + "o_proj")

    def mlp(self, x, prefix):
        return self.linear(F.silu(self.linear(x, prefix + "gate_proj")) *
                           self.linear(x, prefix + "up_proj"), prefix + "down_proj")

    def sparse_moe(self, x, prefix):
        """Qwen3.5-MoE's MLP: the top-k experts by softmax, their weights
        renormalised, plus the shared expert scaled by its sigmoid gate.
        Returns the output and the router logits."""
        c = self.c
        router_logits = self.linear(x, prefix + "gate")
        weights, chosen = torch.topk(torch.softmax(router_logits, -1), c["num_experts_per_tok"])
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c["num_experts"]):
            token, slot = torch.where(chosen == e)
            y = self.mlp(x[token], f"{prefix}experts.{e}.")
            out = out.index_add(0, token, y * weights[token, slot, None])
        shared = self.mlp(x, prefix + "shared_expert.")
        return out + torch.sigmoid(self.linear(x, prefix + "shared_expert_gate")) * shared, \
            router_logits

    def logits(self, ids, router_logits=None):
        """The document's logits; a mixture of experts appends each layer's
        router logits to `router_logits`."""
        c, p, eps = self.c, self.p, self.c["rms_norm_eps"]
        t = len(ids)
        rope_parameters = c["rope_parameters"]
        rot = int(c["head_dim"] * rope_parameters["partial_rotary_factor"])
        inv_freq = 1.0 / rope_parameters["rope_theta"] ** (
            torch.arange(0, rot, 2, dtype=torch.float64) / rot)
        freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        h = p["model.embed_tokens.weight"][torch.tensor(ids)]
        for i, kind in enumerate(c["layer_types"]):
            prefix = f"model.layers.{i}."
            x = zero_centred_norm(h, p[prefix + "input_layernorm.weight"], eps)
            if kind == "linear_attention":
                h = h + self.gated_delta_net(x, prefix + "linear_attn.")
            else:
                h = h + self.attention(x, prefix + "self_attn.", cos, sin)
            x = zero_centred_norm(h, p[prefix + "post_attention_layernorm.weight"], eps)
            if "num_experts" in c:
                out, z = self.sparse_moe(x, prefix + "mlp.")
                h = h + out
                if router_logits is not None:
                    router_logits.append(z)
            else:
                h = h + self.mlp(x, prefix + "mlp.")
        h = zero_centred_norm(h, p["model.norm.weight"], eps)
        return h @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).T

    def loss(self, rows):
        """The summed next-token cross-entropy of the documents, each alone;
        a mixture of experts adds router_aux_loss_coef times the
        load-balancing loss of the documents as one forward (transformers'
        load_balancing_loss_func: every layer's router logits concatenated)."""
        from load_balancing_reference import loss_of

        total, per_doc = 0, []
        for r in rows:
            router_logits = []
            logits = self.logits(r["input_ids"], router_logits)
            per_doc.append(router_logits)
            total = total + F.cross_entropy(logits[:-1], torch.tensor(r["input_ids"][1:]),
                                            reduction="sum")
        if "num_experts" not in self.c:
            return total
        layers = [torch.cat([d[i] for d in per_doc]) for i in range(len(per_doc[0]))]
        mask = torch.ones(layers[0].shape[0])
        aux = loss_of([(layers, mask)], self.c["num_experts_per_tok"], "all_layers")
        return total + self.c["router_aux_loss_coef"] * aux


def load(model_dir, adapter=None, chunked=False):
    """A Reference over the checkpoint's text tensors in float64 (leaves that
    require grad), and the map from its names to the checkpoint's. With
    `adapter`, the PEFT adapter's tensors are the leaves."""
    from safetensors.torch import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    text = config.get("text_config", config)
    prefix = "model.language_model." if "text_config" in config else "model."
    stored = {}
    for name in os.listdir(model_dir):
        if name.endswith(".safetensors"):
            stored.update(load_file(os.path.join(model_dir, name)))
    params, names = {}, {}
    for name, t in stored.items():
        if name.startswith(prefix) or name == "lm_head.weight":
            ours = "model." + name[len(prefix):] if name.startswith(prefix) else name
            params[ours], names[ours] = t.double().requires_grad_(adapter is None), name
    scaling = None
    if adapter:
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            adapter_config = json.load(f)
        scaling = adapter_config["lora_alpha"] / adapter_config["r"]
        for name, t in load_file(os.path.join(adapter, "adapter_model.safetensors")).items():
            stored_name = name[len("base_model.model."):]
            ours = "model." + stored_name[len(prefix):]
            params[ours], names[ours] = t.double().requires_grad_(), stored_name
    return Reference(params, text, scaling, chunked), names
