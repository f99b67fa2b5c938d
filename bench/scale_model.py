"""Model, not a measurement: step time against node count for ZeRO-3 (every
GPU of every node one shard group) and for hybrid sharding (HSDP: shard
within a node of G GPUs, replicate across M nodes), from the bytes Ballast's
sharded step sends and a stated FLOP rate. Every figure it prints is
modelled; no GPU has run Ballast. docs/scaling.md explains the formulas and
holds the output of --table.

Traffic per rank per micro-batch (Ballast's schedule, README "Multi-rank
jobs"; worker/train/collectives/process_group.cc counts the same bytes):
a decoder layer is all-gathered in forward and again in backward; the roots
(embeddings, final norm, lm_head) are gathered once and stay gathered for the
micro-batch; gathers are in the compute dtype (b_c bytes); the trainable
gradients are reduce-scattered in fp32 (4 bytes), in rho ring passes (rho = 1:
NCCL's reduce-scatter is native, and on CPU Ballast reduce-scatters with Gloo's
all-to-all and a local sum, which sends what a ring would). A ring
collective over n ranks sends (n - 1) / n of its tensor per pass:

  V = 2 b_c P_layers + b_c P_roots + 4 rho P_trainable
  ZeRO-3 over N = G M GPUs:   comm_mb = V (N - 1) / N / B, B = NVLink if M = 1 else IB
  HSDP:  comm_mb = V (G - 1) / G / B_nvlink, and once per optimizer step
         comm_step = 2 (M - 1) / M x 4 P_trainable / G / B_ib
         (each GPU all-reduces its fp32 gradient shard, accumulated over the
         step's micro-batches, with its peers of the same local rank)

Every expert of a mixture of experts is gathered, so P_layers counts them
all, while compute counts only the k active ones per token.

Compute per token (a sequence of T = the micro-batch's tokens, causal):
2 P_mm forward + 2 P_mm input gradients + 2 P_mm,trainable weight gradients,
plus 6 T d_attn per layer of attention; P_mm are the active matmul
parameters (lm_head included, the embedding lookup not). Full finetune:
6 P_mm; LoRA: 4 P_mm + 6 P_adapter. Seconds = FLOPs / (peak x MFU).

Step = A micro-batches per GPU, A = global tokens / (N x tokens per
micro-batch) (at least 1); perfect overlap: max(compute, comm); none:
compute + comm.

--measured-ratio R: what bench/sharded_trainer.py measured on CPU (Gloo,
fp32) as bytes per rank per micro-batch over 3 x params x (N - 1) / N. The
model computes the same ratio from the schedule above for that run's model
and scales the GPU traffic by R over it: the part of the measurement the
schedule does not explain (1.00 when they agree).
"""
import argparse
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Qwen3 (or Qwen3-MoE when experts > 0) decoder's dimensions."""
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int = 0
    experts: int = 0
    active_experts: int = 0
    expert_intermediate: int = 0
    tied: bool = False


# transformers' Qwen3Config / Qwen3MoeConfig of the published checkpoints
# count 8,190,735,360 and 30,532,122,624 parameters (on the meta device).
QWEN3_8B = Shape("qwen3-8b", vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8,
                 head_dim=128, intermediate=12288)
QWEN3_30B_A3B = Shape("qwen3-30b-a3b", vocab=151936, hidden=2048, layers=48, heads=32, kv_heads=4,
                      head_dim=128, experts=128, active_experts=8, expert_intermediate=768)
# bench/sharded_trainer.py's qwen3-8L, for the CPU measurement.
BENCH_QWEN3_8L = Shape("qwen3-8L", vocab=8192, hidden=1024, layers=8, heads=16, kv_heads=8,
                       head_dim=64, intermediate=2816, tied=True)
MODELS = {s.name: s for s in (QWEN3_8B, QWEN3_30B_A3B)}


@dataclasses.dataclass(frozen=True)
class Params:
    """Parameter counts of one model and method."""
    layers: int       # every decoder layer's, all experts (and LoRA adapters) included
    roots: int        # embeddings, final norm, lm_head
    trainable: int    # fp32 masters: all for full, the adapters for LoRA
    matmul_active: int  # base weights one token multiplies by (k experts, lm_head)
    adapter_active: int  # adapter weights one token multiplies by (0 for full)
    weight_grads_active: int  # weights whose gradient a token computes

    @property
    def total(self):
        return self.layers + self.roots


def linears(shape):
    """(in, out, copies, active copies per token) of every linear of one layer."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    h = shape.hidden
    attention = [(h, q, 1, 1), (h, kv, 1, 1), (h, kv, 1, 1), (q, h, 1, 1)]
    if shape.experts:
        i, e, k = shape.expert_intermediate, shape.experts, shape.active_experts
        mlp = [(h, i, e, k), (h, i, e, k), (i, h, e, k)]
    else:
        i = shape.intermediate
        mlp = [(h, i, 1, 1), (h, i, 1, 1), (i, h, 1, 1)]
    return attention + mlp


def count(shape, method, lora_rank):
    """Params of `shape` trained by `method` ("full" or "lora", all-linear
    LoRA of rank `lora_rank`: every expert adapted, the router not)."""
    h = shape.hidden
    router = shape.experts * h
    norms = 2 * h + 2 * shape.head_dim  # input/post-attention norms, q_norm and k_norm
    per_layer = sum(i * o * c for i, o, c, _ in linears(shape)) + router + norms
    active = sum(i * o * a for i, o, _, a in linears(shape)) + router
    embedding = shape.vocab * h
    roots = embedding * (1 if shape.tied else 2) + h
    layers = per_layer * shape.layers
    matmul_active = active * shape.layers + embedding  # lm_head: the embedding's size
    if method == "full":
        return Params(layers=layers, roots=roots, trainable=layers + roots,
                      matmul_active=matmul_active, adapter_active=0,
                      weight_grads_active=matmul_active)
    # The adapters are gathered with their layer like its frozen weights.
    adapter = lora_rank * sum((i + o) * c for i, o, c, _ in linears(shape)) * shape.layers
    adapter_active = lora_rank * sum((i + o) * a for i, o, _, a in linears(shape)) * shape.layers
    return Params(layers=layers + adapter, roots=roots, trainable=adapter,
                  matmul_active=matmul_active, adapter_active=adapter_active,
                  weight_grads_active=adapter_active)


def bytes_per_micro_batch(p, compute_bytes, reduce_passes):
    """V: what one rank's collectives carry per micro-batch before the
    (n - 1) / n of a ring: layers gathered twice, roots once, fp32 gradients
    reduce-scattered in `reduce_passes` passes."""
    return compute_bytes * (2 * p.layers + p.roots) + 4 * reduce_passes * p.trainable


def textbook_ratio(p, compute_bytes, reduce_passes):
    """V over ZeRO's 3 x parameter bytes, as bench/sharded_trainer.py reports it."""
    return bytes_per_micro_batch(p, compute_bytes, reduce_passes) / (3 * compute_bytes * p.total)


def attention_flops_per_token_squared(shape):
    """Causal attention, forward (QK^T and PV over half the T^2 pairs) and
    backward (twice the forward), per token per token of the sequence."""
    return 6 * shape.heads * shape.head_dim * shape.layers


def flops_per_token(shape, p, tokens):
    """Forward and input gradients through every active weight, weight
    gradients for the trained ones, attention over a sequence of `tokens`."""
    matmul = 4 * (p.matmul_active + p.adapter_active) + 2 * p.weight_grads_active
    return matmul + attention_flops_per_token_squared(shape) * tokens


@dataclasses.dataclass(frozen=True)
class Hardware:
    peak_flops: float = 989e12  # H100 SXM bf16 dense
    mfu: float = 0.40
    nvlink: float = 450e9       # bytes/s one way: NVLink 4's 900 GB/s counts both directions
    ib: float = 50e9            # bytes/s per GPU: one 400 Gb/s NIC each
    gpus_per_node: int = 8
    compute_bytes: int = 2      # bf16 gathers
    reduce_passes: int = 1      # NCCL's native reduce-scatter
    traffic_scale: float = 1.0  # measured / modelled bytes, from --measured-ratio


@dataclasses.dataclass(frozen=True)
class Step:
    """Modelled seconds of one optimizer step on every GPU."""
    micro_batches: int
    compute: float
    zero3_comm: float
    hsdp_comm: float

    def overlapped(self, comm):
        return max(self.compute, comm)

    def serial(self, comm):
        return self.compute + comm


def traffic(p, hw):
    """V on this hardware, scaled by the measured over the modelled."""
    return bytes_per_micro_batch(p, hw.compute_bytes, hw.reduce_passes) * hw.traffic_scale


def compute_seconds(shape, p, hw, tokens):
    """One GPU's micro-batch of `tokens` tokens at the sustained FLOP/s."""
    return tokens * flops_per_token(shape, p, tokens) / (hw.peak_flops * hw.mfu)


def gradient_all_reduce_seconds(p, hw, nodes):
    """HSDP's once-per-step all-reduce of a GPU's fp32 gradient shard with
    the GPUs of its local rank on the other nodes (a ring: 2 (M - 1) / M)."""
    return 2 * (nodes - 1) / nodes * 4 * p.trainable / hw.gpus_per_node / hw.ib * hw.traffic_scale


def step(shape, p, hw, tokens, nodes, global_tokens):
    g = hw.gpus_per_node
    n = g * nodes
    a = max(1, global_tokens // (n * tokens))
    zero3 = traffic(p, hw) * (n - 1) / n / (hw.nvlink if nodes == 1 else hw.ib)
    intra = traffic(p, hw) * (g - 1) / g / hw.nvlink
    return Step(micro_batches=a, compute=a * compute_seconds(shape, p, hw, tokens),
                zero3_comm=a * zero3,
                hsdp_comm=a * intra + gradient_all_reduce_seconds(p, hw, nodes))


def zero3_tokens_crossover(shape, p, hw):
    """Tokens per GPU per micro-batch below which ZeRO-3 across nodes sends
    longer than it computes, in the limit of many nodes ((N - 1) / N = 1):
    the root of a t^2 + f0 t = K, f0 the matmul FLOPs per token, a t the
    attention's, K = V / B_ib x the sustained FLOP/s."""
    k = traffic(p, hw) / hw.ib * hw.peak_flops * hw.mfu
    f0 = flops_per_token(shape, p, 0)
    a = attention_flops_per_token_squared(shape)
    return (-f0 + math.sqrt(f0 * f0 + 4 * a * k)) / (2 * a)


def hsdp_nodes_crossover(shape, p, hw, tokens, global_tokens):
    """Node count M* above which HSDP sends longer than it computes at a fixed
    global batch (M real, A = global / (G M t) real, at least 1). With
    s = a micro-batch's compute minus its intra-node comm and
    X = 4 P_trainable / (G B_ib), comm > compute when A s < 2 (M - 1) / M X:
    while A > 1 that is M > 1 + global s B_ib / (8 t P_trainable); past
    M_1 = global / (G t), where A = 1 and the batch grows with M, it is
    M > 2X / (2X - s), never when 2X <= s. 1 when s <= 0: the intra-node
    comm alone outlasts compute."""
    g = hw.gpus_per_node
    slack = compute_seconds(shape, p, hw, tokens) - traffic(p, hw) * (g - 1) / g / hw.nvlink
    if slack <= 0:
        return 1.0
    inter = gradient_all_reduce_seconds(p, hw, 2)  # X: 2 (M - 1) / M = 1 at M = 2
    batch_reach = global_tokens / (g * tokens)
    while_accumulating = 1 + global_tokens * slack / (2 * inter * g * tokens)
    if while_accumulating <= batch_reach:
        return while_accumulating
    return 2 * inter / (2 * inter - slack) if 2 * inter > slack else math.inf


def state_gib(p, hw, shard_gpus):
    """Sharded state per GPU: 16 bytes per trainable parameter (fp32 master,
    gradient, two AdamW moments), the compute dtype per frozen one. Without
    activations and gathered layers."""
    return (16 * p.trainable + hw.compute_bytes * (p.total - p.trainable)) / shard_gpus / 2**30


def cpu_check(measured):
    """The schedule's Gloo ratio for bench/sharded_trainer.py's run (fp32,
    full), and the measured over it."""
    modelled = textbook_ratio(count(BENCH_QWEN3_8L, "full", 0), compute_bytes=4, reduce_passes=1)
    return modelled, (measured / modelled if measured else 1.0)


NODES = (1, 2, 4, 8, 16, 32)
TOKENS = (8192, 32768)
METHODS = ("full", "lora")


def cases(lora_rank):
    """(shape, method, params) of every model and method the tables cover."""
    for shape in MODELS.values():
        for method in METHODS:
            yield shape, method, count(shape, method, lora_rank)


def kib(tokens):
    return f"{tokens // 1024}k"


def table(hw, global_tokens, lora_rank):
    out = [f"Modelled, not measured: {hw.peak_flops / 1e12:.0f} TFLOP/s peak x "
           f"{hw.mfu:.0%} MFU per GPU, NVLink {hw.nvlink / 1e9:.0f} GB/s and IB "
           f"{hw.ib / 1e9:.0f} GB/s per GPU one way, {hw.gpus_per_node} GPUs a node, "
           f"gathers {8 * hw.compute_bytes}-bit, fp32 gradients, reduce-scatter "
           f"{hw.reduce_passes} pass(es), traffic x {hw.traffic_scale:.3f}, global batch "
           f"{global_tokens:,} tokens (more when one micro-batch per GPU exceeds it), "
           f"LoRA all-linear r={lora_rank}.", ""]
    out += ["| model | method | params (active) | traffic / 3Ψ(N-1)/N | state GiB/GPU ZeRO-3 at 32 "
            "nodes, HSDP | ZeRO-3 comm > compute below tokens/GPU/micro-batch | HSDP comm > "
            "compute above nodes (8k, 32k) |",
            "|---|---|---|---|---|---|---|"]
    for shape, method, p in cases(lora_rank):
        crossings = []
        for t in TOKENS:
            m = hsdp_nodes_crossover(shape, p, hw, t, global_tokens)
            crossings.append("never" if math.isinf(m) else f"{m:,.1f}")
        out.append(
            f"| {shape.name} | {method} | {p.total / 1e9:.2f}B ({p.matmul_active / 1e9:.2f}B) | "
            f"{traffic(p, hw) / (3 * hw.compute_bytes * p.total):.3f} | "
            f"{state_gib(p, hw, hw.gpus_per_node * NODES[-1]):.1f}, "
            f"{state_gib(p, hw, hw.gpus_per_node):.1f} | "
            f"{zero3_tokens_crossover(shape, p, hw):,.0f} | {'; '.join(crossings)} |")
    out += ["", "Seconds per optimizer step, perfect overlap / none (A: micro-batches per GPU "
            "per step):", "",
            "| model | method | tokens/GPU/micro-batch | nodes | A | compute | ZeRO-3 comm | "
            "ZeRO-3 step | HSDP comm | HSDP step |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for shape, method, p in cases(lora_rank):
        for t in TOKENS:
            for nodes in NODES:
                s = step(shape, p, hw, t, nodes, global_tokens)
                out.append(
                    f"| {shape.name} | {method} | {kib(t)} | {nodes} | {s.micro_batches} | "
                    f"{s.compute:.2f} | {s.zero3_comm:.2f} | {s.overlapped(s.zero3_comm):.2f} / "
                    f"{s.serial(s.zero3_comm):.2f} | {s.hsdp_comm:.2f} | "
                    f"{s.overlapped(s.hsdp_comm):.2f} / {s.serial(s.hsdp_comm):.2f} |")
    return "\n".join(out)


def bench_rows(hw, global_tokens, lora_rank, measured):
    modelled, scale = cpu_check(measured)
    rows = [f"scale_model/bytes of bench/sharded_trainer.py's Gloo run (qwen3-8L full fp32) over "
            f"3x params x (N-1)/N: modelled {modelled:.3f}x"
            + (f", measured {measured:.3f}x: {scale:.3f}x of the model (GPU rows scaled by it)"
               if measured else " (no measurement given)")]
    for shape in MODELS.values():
        p = count(shape, "full", lora_rank)
        for t in TOKENS:
            one, many = (step(shape, p, hw, t, m, global_tokens) for m in (1, NODES[-1]))
            rows.append(
                f"scale_model/{shape.name} full {kib(t)} tokens/GPU/micro-batch, modelled "
                f"({hw.peak_flops / 1e12:.0f} TFLOP/s x {hw.mfu:.0%} MFU, IB {hw.ib / 1e9:.0f} GB/s): "
                f"comm/compute "
                f"1 node {one.zero3_comm / one.compute:.2f}x, {NODES[-1]} nodes ZeRO-3 "
                f"{many.zero3_comm / many.compute:.2f}x vs HSDP {many.hsdp_comm / many.compute:.2f}x; "
                f"ZeRO-3 comm-bound across nodes below "
                f"{zero3_tokens_crossover(shape, p, hw):,.0f} tokens")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="the full markdown table")
    parser.add_argument("--measured-ratio", type=float,
                        help="bench/sharded_trainer.py's bytes ratio (Gloo, CPU)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="dense peak per GPU (H100 SXM bf16: 989)")
    parser.add_argument("--mfu", type=float, default=0.40, help="sustained share of the peak")
    parser.add_argument("--nvlink-gbs", type=float, default=450.0, help="per GPU, one way")
    parser.add_argument("--ib-gbs", type=float, default=50.0, help="per GPU, one way")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--global-tokens", type=int, default=4 * 2**20,
                        help="tokens per optimizer step, fixed as nodes are added")
    parser.add_argument("--lora-rank", type=int, default=16, help="all-linear LoRA's r")
    args = parser.parse_args()
    for name in ("measured_ratio", "peak_tflops", "mfu", "nvlink_gbs", "ib_gbs"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    for name in ("gpus_per_node", "global_tokens", "lora_rank"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.mfu > 1:
        parser.error(f"--mfu must be <= 1, got {args.mfu}")
    hw = Hardware(peak_flops=args.peak_tflops * 1e12, mfu=args.mfu, nvlink=args.nvlink_gbs * 1e9,
                  ib=args.ib_gbs * 1e9, gpus_per_node=args.gpus_per_node,
                  traffic_scale=cpu_check(args.measured_ratio)[1])
    if args.table:
        print(table(hw, args.global_tokens, args.lora_rank))
    else:
        print("\n".join(bench_rows(hw, args.global_tokens, args.lora_rank, args.measured_ratio)))


if __name__ == "__main__":
    main()
