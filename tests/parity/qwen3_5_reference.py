"""Qwen3.5's text decoder in float64, as plain as the math: the reference of
the gradient checks (test_qwen3_5.py). transformers casts to fp32 inside its
norms and its gated delta rule even in a float64 model, so it cannot be the
float64 reference itself; this is checked against it in fp32 instead.

Tensors are named as the text model's checkpoint names them
("model.layers.0.linear_attn.A_log"); LoRA adapters, when given, as
"<module>.lora_A.weight" / "<module>.lora_B.weight" beside the base weight.
One document at a time (the recurrence and the conv start fresh for each)."""
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


class Reference:
    def __init__(self, params, config, lora_scaling=None):
        """params: name -> float64 tensor; config: the text config (a dict)."""
        self.p, self.c, self.scaling = params, config, lora_scaling

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
        state = torch.zeros(hv, dk, dv, dtype=x.dtype)
        outs = []
        for i in range(t):
            # S = exp(g) S + beta k (v - exp(g) S^T k)^T;  o = S^T q
            state = state * torch.exp(g[i])[:, None, None]
            delta = (v[i] - torch.einsum("hkv,hk->hv", state, k[i])) * beta[i][:, None]
            state = state + torch.einsum("hk,hv->hkv", k[i], delta)
            outs.append(torch.einsum("hkv,hk->hv", state, q[i]))
        o = torch.stack(outs)                                              # (T, Hv, Dv)
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

    def logits(self, ids):
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
            mlp = prefix + "mlp."
            h = h + self.linear(F.silu(self.linear(x, mlp + "gate_proj")) *
                                self.linear(x, mlp + "up_proj"), mlp + "down_proj")
        h = zero_centred_norm(h, p["model.norm.weight"], eps)
        return h @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).T

    def loss(self, rows):
        """The summed next-token cross-entropy of the documents, each alone."""
        total = 0
        for r in rows:
            logits = self.logits(r["input_ids"])
            total = total + F.cross_entropy(logits[:-1], torch.tensor(r["input_ids"][1:]),
                                            reduction="sum")
        return total
