"""Mixture-of-experts blocks: the experts' parameters as transformers lays them out, and the
kernels of routing, dispatch, the experts and the combine, as the frameworks run them.

Parameters, transformers 4.x (``models/<type>/modeling_<type>.py``; the counts are those of
transformers 5's fused 3-D expert tensors too, under other names):
- mixtral: ``block_sparse_moe.gate`` (Linear(hidden, experts), no bias), then
  ``block_sparse_moe.experts.N`` with ``w1`` (hidden -> ffn), ``w2`` (ffn -> hidden), ``w3``
  (hidden -> ffn) (MixtralBlockSparseTop2MLP registers w1, w2, w3);
- qwen (qwen2_moe, qwen3_moe): ``mlp.gate``, ``mlp.experts.N.gate_proj / up_proj / down_proj``,
  then Qwen2-MoE's ``mlp.shared_expert`` (an MLP of shared_expert_intermediate_size) and
  ``mlp.shared_expert_gate`` (Linear(hidden, 1));
- deepseek (deepseek_v2, deepseek_v3): ``mlp.experts.N.gate_proj / up_proj / down_proj``,
  ``mlp.gate`` (a weight of (experts, hidden); V3's e_score_correction_bias is a buffer), then
  ``mlp.shared_experts`` (one MLP of n_shared_experts x moe_intermediate_size);
- gpt_oss (modeling_gpt_oss.py GptOssMLP): ``mlp.router`` (a weight of (experts, hidden) and a
  bias), then ``mlp.experts``' four tensors, ``gate_up_proj`` (experts, hidden, 2 x ffn) and
  ``down_proj`` (experts, ffn, hidden) each with a bias per expert; here one gate_up_proj and
  one down_proj, with biases, per expert.

Ops of an MoE block's MLP half, forward order (each op's backward undoes it):
- ``router``: the gate GEMM, softmax over the experts in fp32, top-k (and its renormalisation);
- ``dispatch``: which tokens each expert gets. transformers: ``one_hot`` of the chosen experts
  (int64, tokens x k x experts) and the expert-hit sum (MixtralSparseMoeBlock.forward).
  Grouped (Megatron's moe_utils.permute, torchtitan): the tokens sorted by expert, k copies each;
- ``experts``: transformers loops over the experts: per expert ``torch.where`` on its mask,
  the rows it was given gathered, its MLP, the routing weight multiplied in, ``index_add_``
  into the output. GptOssExperts' MLP is ``x @ gate_up_proj[e] + gate_up_proj_bias[e]`` (the
  bias added by a kernel of its own), the clamped SwiGLU (``_apply_gate``), then ``@
  down_proj[e] + down_proj_bias[e]``; indexing a fused parameter (``select``) sends its
  gradient back as a zero-filled tensor of the whole parameter with the expert's slice copied
  in (ATen select_backward), which autograd adds into the gradient once per expert.
  Grouped runs every expert's GEMM as one grouped GEMM (Megatron TEGroupedMLP, torchtitan
  GroupedExperts) over the permuted tokens;
- ``combine``: transformers zero-fills the output before the loop; grouped un-permutes
  (each token's k rows summed back);
- ``shared_mlp``: the shared experts' MLP beside the routed ones (and Qwen2-MoE's sigmoid
  gate), added to their output.

Load: with ``expert_imbalance`` 1 (the default) every expert gets top-k x tokens / experts,
balanced routing. Greater: one expert gets that multiple of the mean and the others share the
rest; a rank holding it under expert parallelism (``ep``) has more rows than the others, and
the step waits for it. On one GPU the loop's total rows do not change, so neither does its
time (each expert's GEMM is timed at the mean's shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.job.kernels import (
    FP32,
    BlockShape,
    Kernel,
    MemoryBound,
    memory,
    pointwise,
    tiny,
)
from simulator.job.modules import Module

if TYPE_CHECKING:
    from simulator.inputs.schema import MoeConfig
    from simulator.job.transformer_ops import Builder

MOE_OPS = ("router", "dispatch", "experts", "combine", "shared_mlp")
INDEX = 8  # bytes of an int64 index (one_hot, topk indices)
EXPERT_LEAVES = {"mixtral": ("w1", "w2", "w3"), "qwen": ("gate_proj", "up_proj", "down_proj"),
                 "deepseek": ("gate_proj", "up_proj", "down_proj"),
                 "gpt_oss": ("gate_up_proj", "down_proj")}


@dataclass(frozen=True)
class MoeShape:
    """A mixture of experts' sizes (hashable: it keys the per-token caches)."""

    experts: int
    top_k: int
    ffn: int
    shared_ffn: int = 0
    shared_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    names: str = "qwen"

    @staticmethod
    def of(cfg: MoeConfig) -> MoeShape:
        return MoeShape(cfg.experts, cfg.experts_per_token, cfg.ffn_hidden,
                        cfg.shared_ffn_hidden, cfg.shared_expert_gate,
                        tuple(sorted(set(cfg.dense_layers))), cfg.names)

    def expert_params(self, hidden: int) -> int:
        """One expert's weights: gate, up and down projections (gpt-oss: and their biases)."""
        biases = 2 * self.ffn + hidden if self.names == "gpt_oss" else 0
        return 3 * hidden * self.ffn + biases

    def modules(self, p: str, hidden: int, bias: bool, block: int) -> list[Module]:
        """The MLP half of one MoE block, in registration order."""
        h, f, n = hidden, self.ffn, self.experts
        base = f"{p}.block_sparse_moe" if self.names == "mixtral" else f"{p}.mlp"
        gate = [Module(f"{base}.gate", "linear", h, n, False, block)]
        leaves = EXPERT_LEAVES[self.names]
        experts: list[Module] = []
        if self.names == "gpt_oss":  # GptOssMLP: router, experts
            for j in range(n):
                e = f"{base}.experts.{j}"
                experts += [Module(f"{e}.gate_up_proj", "linear", h, 2 * f, True, block),
                            Module(f"{e}.down_proj", "linear", f, h, True, block)]
            return [Module(f"{base}.router", "linear", h, n, True, block)] + experts
        for j in range(n):
            e = f"{base}.experts.{j}"
            if self.names == "mixtral":  # w1, w2, w3
                experts += [Module(f"{e}.w1", "linear", h, f, False, block),
                            Module(f"{e}.w2", "linear", f, h, False, block),
                            Module(f"{e}.w3", "linear", h, f, False, block)]
            else:
                experts += [Module(f"{e}.{leaves[0]}", "linear", h, f, False, block),
                            Module(f"{e}.{leaves[1]}", "linear", h, f, False, block),
                            Module(f"{e}.{leaves[2]}", "linear", f, h, False, block)]
        shared: list[Module] = []
        if self.shared_ffn:
            s = f"{base}.shared_experts" if self.names == "deepseek" else f"{base}.shared_expert"
            fs = self.shared_ffn
            shared = [Module(f"{s}.gate_proj", "linear", h, fs, bias, block),
                      Module(f"{s}.up_proj", "linear", h, fs, bias, block),
                      Module(f"{s}.down_proj", "linear", fs, h, bias, block)]
            if self.shared_gate:
                shared.append(Module(f"{base}.shared_expert_gate", "linear", h, 1, False, block))
        if self.names == "deepseek":  # DeepseekV2Moe: experts, gate, shared_experts
            return experts + gate + shared
        return gate + experts + shared


def role(mod: Module) -> str | None:
    """The MoE op a module's weights belong to (None: not an MoE module)."""
    if ".experts." in mod.path:
        return "experts"
    if ".shared_expert." in mod.path or ".shared_experts." in mod.path or \
            mod.leaf == "shared_expert_gate":
        return "shared_mlp"
    if mod.leaf in ("gate", "router"):
        return "router"
    return None


def rank_load(moe: MoeShape, ep: int, imbalance: float) -> float:
    """The busiest rank's rows over the mean under expert parallelism: one expert gets
    ``imbalance`` x the mean, the others of its rank the mean (1 on one GPU, see above)."""
    if ep <= 1 or imbalance <= 1:
        return 1.0
    local = moe.experts // ep
    return (local - 1 + min(imbalance, moe.experts)) / local


@dataclass(frozen=True)
class Routing:
    """What one rank's experts work on in one micro-batch."""

    local_experts: int  # experts this rank holds (experts / ep)
    rows_per_expert: int  # token rows each gets (the busiest rank's)
    grouped: bool  # one grouped GEMM (else a loop over experts)

    @property
    def rows(self) -> int:
        return self.local_experts * self.rows_per_expert


def routing(bld: Builder) -> Routing:
    job, moe = bld.job, bld.arch.moe
    assert moe is not None
    ep = job.ep
    load = rank_load(moe, ep, job.training.expert_imbalance)
    local = moe.experts // ep
    rows = max(1, math.ceil(bld.T * moe.top_k * ep / moe.experts * load))
    return Routing(local, rows, job.recipe.expert_gemms == "grouped")


def forward(bld: Builder, block: int, op: str) -> list[Kernel]:
    """One MoE op's forward kernels."""
    A, T, a = bld.arch, bld.T, bld.a
    moe = A.moe
    assert moe is not None
    h, E, k = A.hidden, moe.experts, moe.top_k
    mods = bld.by_op.get((block, op), [])
    if op == "router" and moe.names == "gpt_oss":  # GptOssTopKRouter: top-k of the logits,
        # then a softmax over those k in the logits' dtype
        return bld.linears_fwd(mods) + [
            pointwise("topk", T * E, reads=a, writes=0), tiny("topk.indices"),
            pointwise("softmax_topk", T * k, reads=a, writes=a)]
    if op == "router":
        return bld.linears_fwd(mods) + [
            pointwise("softmax_fp32", T * E, reads=a, writes=FP32),
            pointwise("topk", T * E, reads=FP32, writes=0), tiny("topk.indices"),
            pointwise("normalise_topk", T * k, reads=FP32, writes=FP32),
            pointwise("routing_weights_to_dtype", T * k, reads=FP32, writes=a)]
    r = routing(bld)
    if op == "dispatch":
        if r.grouped:  # sort the token copies by expert, gather them (moe_utils.permute)
            return [tiny("argsort_experts"), tiny("bincount_tokens"),
                    pointwise("permute_tokens", T * k * h, reads=a, writes=a)]
        return [pointwise("one_hot_experts", T * k * E, reads=0, writes=INDEX),
                pointwise("expert_hit_sum", T * k * E, reads=INDEX, writes=0), tiny("nonzero")]
    if op == "experts":
        return _experts_fwd(bld, mods, r)
    if op == "combine":
        if r.grouped:  # each token's k rows, weighted, summed back (moe_utils.unpermute)
            return [pointwise("unpermute_sum", T * k * h, reads=a, writes=0),
                    pointwise("unpermute_write", T * h, reads=0, writes=a)]
        return [pointwise("zeros_output", T * h, reads=0, writes=a)]
    if op == "shared_mlp":
        return _shared_fwd(bld, mods)
    raise KeyError(op)


def backward(bld: Builder, block: int, op: str) -> list[Kernel]:
    """One MoE op's backward kernels (autograd's, in reverse)."""
    A, T, a = bld.arch, bld.T, bld.a
    moe = A.moe
    assert moe is not None
    h, E, k = A.hidden, moe.experts, moe.top_k
    mods = bld.by_op.get((block, op), [])
    if op == "router" and moe.names == "gpt_oss":
        return [pointwise("softmax_topk_backward", T * k, reads=2 * a, writes=a),
                pointwise("topk_backward_scatter", T * E, reads=0, writes=a)] + \
            bld.linears_bwd(mods, T)
    if op == "router":
        return [pointwise("routing_weights_backward", T * k, reads=a, writes=FP32),
                pointwise("normalise_topk_backward", T * k, reads=2 * FP32, writes=FP32),
                pointwise("topk_backward_scatter", T * E, reads=0, writes=FP32),
                pointwise("softmax_backward", T * E, reads=2 * FP32, writes=a)] + \
            bld.linears_bwd(mods, T)
    r = routing(bld)
    if op == "dispatch":
        if r.grouped:  # the permuted rows' gradients summed back per token
            return [pointwise("permute_backward", T * k * h, reads=a, writes=0),
                    pointwise("permute_backward_write", T * h, reads=0, writes=a)]
        return []  # indices carry no gradient
    if op == "experts":
        return _experts_bwd(bld, mods, r)
    if op == "combine":
        if r.grouped:
            return [pointwise("unpermute_backward", T * k * h, reads=a, writes=a)]
        return []
    if op == "shared_mlp":
        return _shared_bwd(bld, mods)
    raise KeyError(op)


def _one_expert(mods: list[Module]) -> tuple[list[Module], Module]:
    """(the input projections, the down projection) of one expert: every expert this rank
    runs is alike, so the first one's modules stand for each."""
    first = mods[:2] if mods and mods[0].leaf == "gate_up_proj" else mods[:3]
    down = next(m for m in first if m.leaf in ("w2", "down_proj"))
    return [m for m in first if m is not down], down


def _act(bld: Builder, rows: int, ffn: int) -> MemoryBound:
    A = bld.arch
    shape = BlockShape(rows, A.hidden, A.kv_dim, ffn, A.heads, bld.a)
    if A.moe is not None and A.moe.names == "gpt_oss" and bld.kernels != "compiled":
        return clamped_swiglu(rows * ffn, bld.a, ffn)
    return bld.regime.activation(shape, A.mlp, gelu=A.gelu)  # type: ignore[no-any-return]


def clamped_swiglu(n: float, e: int, ffn: int) -> MemoryBound:
    """GptOssExperts._apply_gate op by op over ``n`` = rows x ffn elements: ``gate, up =
    gate_up[..., ::2], gate_up[..., 1::2]`` (strided views: each read moves the interleaved
    pair), ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``, ``gate * alpha``,
    ``sigmoid``, ``gate * sigmoid`` (glu), ``up + 1``, ``(up + 1) * glu``. Backward, autograd's
    formulas (derivatives.yaml): the two products' four gradients, sigmoid_backward, the
    scalar product's, the gate's two gradients added, each clamp's masked gradient (reading
    its saved input), and each strided view's slice_backward (a zero-filled 2 x ffn tensor and
    the gradient copied into every other element), the two added. Saved: gate_up (both clamps'
    input), the clamped gate, sigmoid's output, up + 1 and glu. torch.compile fuses it into
    one kernel each way, as the regime's SwiGLU."""
    fwd = [("clamp_gate", 2 * e), ("clamp_up", 2 * e), ("mul_alpha", e), ("sigmoid", e),
           ("mul_glu", 2 * e), ("add_one", e), ("mul_out", 2 * e)]
    bwd = [("mul_out_backward.a", 2 * e, e), ("mul_out_backward.b", 2 * e, e),
           ("mul_glu_backward.a", 2 * e, e), ("mul_glu_backward.b", 2 * e, e),
           ("sigmoid_backward", 2 * e, e), ("mul_alpha_backward", e, e),
           ("accumulate_gate", 2 * e, e), ("clamp_gate_backward", 3 * e, e),
           ("clamp_up_backward", 3 * e, e), ("slice_backward.zeros_gate", 0, 2 * e),
           ("slice_backward.copy_gate", e, 2 * e), ("slice_backward.zeros_up", 0, 2 * e),
           ("slice_backward.copy_up", e, 2 * e), ("accumulate_gate_up", 4 * e, 2 * e)]
    return MemoryBound.of(
        [pointwise(f"clamped_swiglu.{name}", n, reads=r, writes=e) for name, r in fwd],
        [pointwise(f"clamped_swiglu.{name}", n, reads=r, writes=w) for name, r, w in bwd],
        saved_per_token=6 * e * ffn)


def _experts_fwd(bld: Builder, mods: list[Module], r: Routing) -> list[Kernel]:
    a, h, m = bld.a, bld.arch.hidden, r.rows_per_expert
    moe = bld.arch.moe
    assert moe is not None
    ins, down = _one_expert(mods)

    def mlp(rows: int) -> list[Kernel]:
        return (bld.linears_fwd(ins, rows) + _bias_adds(ins, rows, a)
                + list(_act(bld, rows, moe.ffn).forward)
                + bld.linears_fwd([down], rows) + _bias_adds([down], rows, a))

    if r.grouped:  # every expert at once: one GEMM per projection over all rows
        rows = r.rows
        return mlp(rows) + [pointwise("mul_routing_weights", rows * h, reads=a, writes=a)]
    one = ([tiny("where_expert"), pointwise("gather_rows", m * h, reads=a, writes=a)]
           + mlp(m)
           + [pointwise("mul_routing_weight", m * h, reads=a, writes=a),
              pointwise("index_add", m * h, reads=2 * a, writes=a)])
    return one * r.local_experts


def _bias_adds(mods: list[Module], rows: int, a: int) -> list[Kernel]:
    """GptOssExperts adds each projection's bias by a kernel of its own (``x @ w + b``; an
    nn.Linear's addmm adds it inside the GEMM)."""
    return [pointwise("expert_bias_add", rows * m.out_features, reads=a, writes=a)
            for m in mods if m.bias and m.leaf in EXPERT_LEAVES["gpt_oss"]]


def _select_backward(bld: Builder, mods: list[Module], r: Routing) -> list[Kernel]:
    """Trained fused expert tensors (gpt-oss) indexed per expert in transformers' loop: each
    expert's weight gradients come back as a zero-filled tensor of all the rank's experts with
    its slice copied in (ATen TensorShape.cpp select_backward), added into the sum of the
    others (autograd's InputBuffer): per expert a fill and, after the first, an add, in the
    dtype of the parameter the forward indexed (the 16-bit compute copy under FSDP)."""
    moe = bld.arch.moe
    assert moe is not None
    if r.grouped or moe.names != "gpt_oss" or bld.job.finetune != "full":
        return []
    g = FP32 if bld.autocast else bld.a  # the indexed parameter's dtype: fp32 under autocast
    local = r.local_experts
    whole = local * moe.expert_params(bld.arch.hidden) * g  # bytes of the rank's tensors
    one = whole / local
    return ([memory(whole + one, name="select_backward.zeros_and_copy")] * local
            + [memory(3 * whole, name="select_backward.accumulate")] * (local - 1))


def _experts_bwd(bld: Builder, mods: list[Module], r: Routing) -> list[Kernel]:
    a, h, m = bld.a, bld.arch.hidden, r.rows_per_expert
    moe = bld.arch.moe
    assert moe is not None
    ins, down = _one_expert(mods)
    rows = r.rows if r.grouped else m
    body = (bld.linears_bwd([down], rows) + list(_act(bld, rows, moe.ffn).backward)
            + bld.linears_bwd(ins, rows) + bld.accumulate(rows * h, len(ins)))
    weight = [pointwise("mul_routing_weight_backward.grad_input", rows * h, reads=2 * a,
                        writes=a),
              pointwise("mul_routing_weight_backward.grad_weight", rows * h, reads=2 * a,
                        writes=0)]
    if r.grouped:
        return weight + body
    # index_add's backward gathers the rows' gradient; the gather's scatters them back
    one = ([pointwise("index_add_backward", m * h, reads=a, writes=a)] + weight + body
           + [pointwise("gather_rows_backward", m * h, reads=2 * a, writes=a)])
    return one * r.local_experts + _select_backward(bld, mods, r)


def _shared_fwd(bld: Builder, mods: list[Module]) -> list[Kernel]:
    moe, T, a, h = bld.arch.moe, bld.T, bld.a, bld.arch.hidden
    assert moe is not None
    mlp = [m for m in mods if m.leaf != "shared_expert_gate"]
    gate = [m for m in mods if m.leaf == "shared_expert_gate"]
    out = (bld.linears_fwd(mlp[:2], T) + list(_act(bld, T, moe.shared_ffn).forward)
           + bld.linears_fwd(mlp[2:], T))
    if gate:  # F.sigmoid(shared_expert_gate(x)) * shared_expert_output
        out += bld.linears_fwd(gate, T) + [pointwise("sigmoid", T, reads=a, writes=a),
                                           pointwise("mul_gate", T * h, reads=a, writes=a)]
    return out + [pointwise("add_shared", T * h, reads=2 * a, writes=a)]


def _shared_bwd(bld: Builder, mods: list[Module]) -> list[Kernel]:
    moe, T, a, h = bld.arch.moe, bld.T, bld.a, bld.arch.hidden
    assert moe is not None
    mlp = [m for m in mods if m.leaf != "shared_expert_gate"]
    gate = [m for m in mods if m.leaf == "shared_expert_gate"]
    out: list[Kernel] = []
    if gate:
        out += [pointwise("mul_gate_backward", T * h, reads=2 * a, writes=a),
                pointwise("sigmoid_backward", T * h, reads=2 * a, writes=a)] + \
            bld.linears_bwd(gate, T)
    return out + (bld.linears_bwd(mlp[2:], T) + list(_act(bld, T, moe.shared_ffn).backward)
                  + bld.linears_bwd(mlp[:2], T) + bld.accumulate(T * h, 2))


def saved_per_token(bld: Builder) -> dict[str, tuple[float, bool]]:
    """What an MoE block's MLP half keeps for backward, bytes per token (no checkpointing);
    the routed part per token is top-k rows (the busiest rank's under expert parallelism)."""
    A, e, job = bld.arch, bld.a, bld.job
    moe = A.moe
    assert moe is not None
    r = routing(bld)
    k = r.rows / bld.T  # rows per token on this rank
    out: dict[str, tuple[float, bool]] = {"MoE input (norm output)": (A.hidden * e, False),
           "router probabilities (fp32)": (moe.experts * FP32, False)}
    act = _act(bld, 1, moe.ffn).saved_per_token
    grads = job.finetune == "full" or any(m.lora for m in job.modules if m.block >= 0)
    out["experts' rows: input, activation, down input, output"] = (
        k * ((A.hidden * e if grads else 0) + act + moe.ffn * e + A.hidden * e), False)
    if moe.shared_ffn:
        out["shared experts: activation, down input"] = (
            _act(bld, 1, moe.shared_ffn).saved_per_token + moe.shared_ffn * e, False)
    return out
