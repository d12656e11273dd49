"""The ops of one micro-batch of a Job: FLOPs, HBM bytes and the gradients each op completes.

An `Op` is a few kernels of one block (the attention projections, the attention core, the MLP,
a norm). Each `Kernel` is a GEMM (with its shape, for tile efficiency), a flash-attention kernel,
or a memory-bound elementwise kernel; simulator/job/compute.py times each kernel by a roofline.

Conventions (each with its source or reason):
- FLOPs per GEMM 2*m*n*k; forward per layer 24*b*s*h^2 + 4*b*s^2*h for a standard GPT
  (Narayanan et al. 2021, arXiv:2104.04473, appendix).
- Attention core with FlashAttention: the kernel *executes* half of the 4*b*s^2*h FLOPs under a
  causal mask (it skips masked tiles); FlashAttention-2's own benchmark counts causal FLOPs
  halved (flash-attention benchmarks/benchmark_flash_attention.py: ``// (2 if causal else 1)``)
  and its efficiency figures, used in compute.py, are on that count. Backward executes 2.5x the
  forward FLOPs (same file: 5 GEMMs instead of 2, because it recomputes the scores).
  Model FLOPs for MFU (`model_flops_per_micro_batch`) count the full 4*b*s^2*h, as Megatron-LM
  and the closed form 72*B*s*L*h^2*(1 + s/6h + V/12Lh) do.
- Backward of a linear layer = input-gradient GEMM + weight-gradient GEMM (2x forward); a frozen
  weight (LoRA, QLoRA) skips the weight-gradient GEMM; QLoRA dequantises the NF4 weight to 16 bit
  before every use, forward and backward (bitsandbytes MatMul4Bit), reading 0.5 and writing
  2 bytes per weight.
- Elementwise ops (norms, rotary, activation, residual adds, loss) are memory bound and modelled
  as fused kernels that read their inputs and write their outputs once (Megatron-LM's fused
  kernels, torch.compile); their backward moves twice the bytes (reads the output gradient and the
  saved input, writes the input gradient).
- Gradients are accumulated in fp32 (AMP keeps fp32 weights, so their .grad is fp32).
- Gradient order (`Op.grads`): backward ops run in reverse forward order; an op's gradients are
  complete when it ends, listed in reverse registration order (autograd runs later-created nodes
  first). Llama block: down_proj; up_proj, gate_proj; post_attention_layernorm; o_proj; v, k, q;
  input_layernorm. A tied embedding's gradient completes at the embedding's backward (last).
- Activation checkpointing (per block, as HF gradient_checkpointing and FSDP wrap it): `full`
  recomputes the block's forward just before its backward; `selective` recomputes only the
  attention core (Korthikanti et al. 2022, arXiv:2205.05198).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from simulator.job.workload import QA_LABELS

if TYPE_CHECKING:
    from simulator.inputs.schema import GenericLayer
    from simulator.job.workload import Job, Module

Phase = Literal["forward", "backward", "recompute", "optimizer"]
KernelKind = Literal["gemm", "attention_fwd", "attention_bwd", "memory", "dense"]

GRAD_BYTES = 4  # fp32 gradients under AMP (weights are fp32; .grad has the weight's dtype)
NF4_BYTES = 0.5  # QLoRA base weight: 4 bits per weight (Dettmers et al. 2023)


@dataclass(frozen=True)
class Kernel:
    kind: KernelKind
    flops: float
    bytes: float
    shape: tuple[int, int, int] | None = None  # GEMM (m, n, k)
    element_bytes: int = 2  # operand size: 4 under fp32 training (compute.py picks the rate)
    weight_grad: bool = False  # dW = dY^T X: needs the layer input, not the input gradient


@dataclass(frozen=True)
class Op:
    name: str
    block: int
    phase: Phase
    flops: float
    bytes: float
    grads: tuple[int, ...] = ()  # indices into job.params complete when this op ends
    kernels: tuple[Kernel, ...] = ()

    @staticmethod
    def of(name: str, block: int, phase: Phase, kernels: list[Kernel],
           grads: tuple[int, ...] = ()) -> Op:
        return Op(name, block, phase, sum(k.flops for k in kernels),
                  sum(k.bytes for k in kernels), grads, tuple(kernels))


def gemm(m: int, n: int, k: int, a: int, *, extra_bytes: float = 0.0) -> Kernel:
    """C[m,n] = A[m,k] @ B[k,n] with a-byte elements."""
    return Kernel("gemm", 2.0 * m * n * k, (m * k + k * n + m * n) * a + extra_bytes, (m, n, k),
                  a)


def memory(nbytes: float, flops: float = 0.0) -> Kernel:
    return Kernel("memory", flops, nbytes)


# Which op of a block each module's weights belong to (leaf name; GPT-2's c_proj by parent).
_ROLE = {
    "input_layernorm": "attn_norm", "ln_1": "attn_norm", "norm_1": "attn_norm",
    "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "c_attn": "qkv", "Wqkv": "qkv",
    "o_proj": "attn_out", "out_proj": "attn_out",
    "post_attention_layernorm": "mlp_norm", "ln_2": "mlp_norm", "norm_2": "mlp_norm",
    "gate_proj": "mlp_in", "up_proj": "mlp_in", "c_fc": "mlp_in",
    "down_proj": "mlp_out",
}
_BLOCK_OPS = ("attn_norm", "qkv", "attention", "attn_out", "mlp_norm", "mlp_in", "mlp_act",
              "mlp_out")
# BERT is post-LN: each sub-layer's LayerNorm follows its residual add (modeling_bert.py
# BertSelfOutput / BertOutput: LayerNorm(dropout(dense(x)) + input)).
_POST_LN_BLOCK_OPS = ("qkv", "attention", "attn_out", "attn_norm", "mlp_in", "mlp_act",
                      "mlp_out", "mlp_norm")
# BERT module paths inside a layer -> op (checked in order: "attention.output.dense" before
# "output.dense").
_BERT_ROLE = (("attention.self.", "qkv"), ("attention.output.dense", "attn_out"),
              ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "mlp_in"),
              ("output.dense", "mlp_out"), ("output.LayerNorm", "mlp_norm"))


def _role(mod: Module, n_layers: int) -> str:
    if mod.kind == "embedding":
        return "embedding"
    if mod.path == "lm_head":
        return "lm_head"
    if mod.path == "qa_outputs":
        return "qa_head"
    if mod.kind == "norm" and mod.block == -1:  # BERT's embedding LayerNorm
        return "embedding_norm"
    if mod.block == n_layers:
        return "final_norm"
    if ".encoder.layer." in mod.path:
        return next(role for part, role in _BERT_ROLE if part in mod.path)
    if mod.leaf == "c_proj":
        return "attn_out" if ".attn." in mod.path else "mlp_out"
    return _ROLE[mod.leaf]


class _Builder:
    """Builds the ops of one micro-batch of a transformer Job."""

    def __init__(self, job: Job) -> None:
        assert job.arch is not None
        self.job, self.arch = job, job.arch
        self.a = job.activation_bytes
        self.T = job.tokens_per_micro_batch
        # module -> indices of its params (params follow modules in order)
        self.mod_params: dict[str, list[int]] = {}
        i = 0
        prefix = "base_model.model." if job.finetune != "full" else ""
        for mod in job.modules:
            head = f"{prefix}{mod.path}."
            idx = []
            while i < len(job.params) and job.params[i].name.startswith(head):
                idx.append(i)
                i += 1
            self.mod_params[mod.path] = idx
        self.by_op: dict[tuple[int, str], list[Module]] = {}
        for mod in job.modules:
            key = (mod.block, _role(mod, self.arch.layers))
            self.by_op.setdefault(key, []).append(mod)
        if self.arch.tied and not self.arch.encoder:  # the head GEMM uses the embedding's weight
            self.by_op.setdefault((self.arch.layers, "lm_head"), [])
        self.block_ops = _POST_LN_BLOCK_OPS if self.arch.encoder else _BLOCK_OPS
        # BERT drops the hidden states too (embeddings, after each sub-layer's dense), at the
        # attention-dropout rate: BertConfig hidden_dropout_prob = attention_probs_dropout_prob
        self.hidden_dropout = self.arch.encoder and job.training.dropout > 0

    # --- linear layers ----------------------------------------------------------------------
    def _linear_fwd(self, mod: Module) -> list[Kernel]:
        T, a, i, o = self.T, self.a, mod.in_features, mod.out_features
        out: list[Kernel] = []
        if self._quantized(mod):
            out.append(memory(i * o * (NF4_BYTES + 2)))
        out.append(gemm(T, o, i, a))
        if mod.lora:
            r = self.job.lora_rank
            out += [gemm(T, r, i, a), gemm(T, o, r, a), memory(5 * T * o * a)]
        return out

    def _linear_bwd(self, mod: Module) -> list[Kernel]:
        T, a, i, o = self.T, self.a, mod.in_features, mod.out_features
        out: list[Kernel] = []
        if self._quantized(mod):
            out.append(memory(i * o * (NF4_BYTES + 2)))
        out.append(gemm(T, i, o, a))  # dX = dY @ W
        trainable_w = self.job.finetune == "full"
        if trainable_w:  # dW = dY^T @ X, written as fp32 grad; bias grad is a column sum of dY
            extra = (o * i * (GRAD_BYTES - a)) + (T * o * a if mod.bias else 0)
            out.append(replace(gemm(o, i, T, a, extra_bytes=extra), weight_grad=True))
        if mod.lora:
            r = self.job.lora_rank
            out += [memory(2 * T * o * a),  # grad of the scaling
                    gemm(o, r, T, a), gemm(T, r, o, a),  # dB, dH
                    gemm(r, i, T, a), gemm(T, i, r, a),  # dA, dX (LoRA branch)
                    memory(3 * T * i * a)]  # add into dX
        return out

    def _quantized(self, mod: Module) -> bool:
        return self.job.finetune == "qlora" and mod.kind in ("linear", "conv1d") \
            and mod.path != "lm_head"

    # --- forward and backward kernels of each op ----------------------------------------------
    def forward(self, block: int, op: str) -> list[Kernel]:
        A, T, a = self.arch, self.T, self.a
        h, kvd, f = A.hidden, A.kv_dim, A.ffn_hidden
        mods = self.by_op.get((block, op), [])
        if op in ("attn_norm", "mlp_norm", "final_norm"):
            return [memory(2 * T * h * a, 5.0 * T * h)]
        if op == "embedding_norm":  # BertEmbeddings: LayerNorm, then dropout
            return [memory(2 * T * h * a, 5.0 * T * h)] + self._dropout(T * h)
        if op == "attention":
            if self.job.training.attention == "eager":
                return self._eager_attention(backward=False)
            b, s = self.job.micro_batch, self.job.seq_len
            # causal: flash-attention skips masked tiles; an encoder attends to all s keys
            flops = 4.0 * b * s * s * h / (1 if A.encoder else 2)
            return [Kernel("attention_fwd", flops, (2 * T * h + 2 * T * kvd) * a)]
        if op == "mlp_act":  # SwiGLU reads gate and up, GELU reads one input
            reads = 2 if A.mlp == "swiglu" else 1
            return [memory((reads + 1) * T * f * a, 8.0 * T * f)]
        if op == "embedding":  # gather rows of each table (read + write), add position rows
            n_tables = len(mods)
            return [memory((2 * n_tables + 3 * (n_tables - 1)) * T * h * a)]
        if op == "loss":  # logits upcast to fp32, log-softmax, NLL (HF: logits.float())
            width = QA_LABELS if A.encoder else A.vocab  # QA: start and end logit per token
            return [memory(T * width * (a + 4 + 8), 5.0 * T * width)]
        if op == "lm_head" and A.tied:
            return [gemm(T, A.vocab, h, a)]
        kernels = [k for mod in mods for k in self._linear_fwd(mod)]
        if op == "qkv" and A.positions == "rotary":
            kernels.append(memory(2 * T * (h + kvd) * a))
        if op in ("attn_out", "mlp_out"):  # (BERT: dropout, then) the residual add
            kernels += self._dropout(T * h) + [memory(3 * T * h * a)]
        return kernels

    def _dropout(self, elements: int) -> list[Kernel]:
        """Hidden-state dropout: read x, write the output and a 1-byte mask (none if off).
        Its backward reads the gradient and the mask and writes the gradient: the same bytes."""
        return [memory(elements * (2 * self.a + 1))] if self.hidden_dropout else []

    def backward(self, block: int, op: str) -> list[Kernel]:
        A, T, a = self.arch, self.T, self.a
        h, kvd = A.hidden, A.kv_dim
        mods = self.by_op.get((block, op), [])
        if op == "attention":
            if self.job.training.attention == "eager":
                return self._eager_attention(backward=True)
            (fwd,) = self.forward(block, op)
            return [Kernel("attention_bwd", 2.5 * fwd.flops, (4 * T * h + 4 * T * kvd) * a)]
        full = self.job.finetune == "full"
        if op == "lm_head" and A.tied:
            dx = [gemm(T, h, A.vocab, a)]
            dw = gemm(A.vocab, h, T, a, extra_bytes=A.vocab * h * (GRAD_BYTES - a))
            return dx + ([replace(dw, weight_grad=True)]
                         if full else [])
        if op == "embedding":  # dense fp32 grad of the table(s), scatter-add of dY
            if not full:  # frozen embeddings: nothing to compute
                return []
            tables = sum(m.in_features * m.out_features for m in mods)
            return [memory(tables * GRAD_BYTES + len(mods) * T * h * (a + GRAD_BYTES))]
        if mods and all(m.kind in ("linear", "conv1d") for m in mods):
            kernels = [k for mod in reversed(mods) for k in self._linear_bwd(mod)]
            if op == "qkv" and A.positions == "rotary":
                kernels.append(memory(2 * T * (h + kvd) * a))
            if op in ("attn_out", "mlp_out"):
                kernels = self._dropout(T * h) + kernels
            return kernels
        return [Kernel(k.kind, 2 * k.flops, 2 * k.bytes, k.shape, k.element_bytes)
                for k in self.forward(block, op)]

    def _eager_attention(self, *, backward: bool) -> list[Kernel]:
        """Attention with the b*heads*s*s scores in HBM (Megatron-LM CoreAttention: batched
        GEMM, fused scale-mask-softmax, dropout, batched GEMM); the full s*s is computed.
        BERT's eager attention scales and masks the scores in two kernels of their own before
        the softmax (HF modeling_bert.py and NVIDIA DeepLearningExamples modeling.py
        BertSelfAttention: ``scores / sqrt(d)``, ``+ attention_mask``, ``softmax``)."""
        A, a = self.arch, self.a
        b, s, d, heads = self.job.micro_batch, self.job.seq_len, A.head_dim, A.heads
        scores = b * heads * s * s  # elements
        p = self.job.training.dropout
        # unfused scale and mask add: each reads and writes the scores (the b*s mask is small);
        # backward: the scale's gradient is one more pass, the mask add's is the identity
        unfused = 2 * scores * a if A.encoder else 0.0
        if not backward:
            out = [gemm(b * heads * s, s, d, a)]  # Q K^T
            if unfused:
                out += [memory(unfused), memory(unfused)]
            out.append(memory(2 * scores * a))  # softmax: read scores, write probabilities
            if p > 0:  # read probabilities, write dropped ones and a 1-byte mask
                out.append(memory(scores * (2 * a + 1)))
            out.append(gemm(b * heads * s, d, s, a))  # P V
            return out
        out = [gemm(b * heads * s, s, d, a), gemm(b * heads * s, d, s, a)]  # dP, dV
        if p > 0:
            out.append(memory(scores * (2 * a + 1)))
        out.append(memory(3 * scores * a))  # softmax backward: read P and dP, write dS
        if unfused:
            out.append(memory(unfused))
        out += [gemm(b * heads * s, d, s, a), gemm(b * heads * s, d, s, a)]  # dQ, dK
        return out

    def grads(self, block: int, op: str) -> tuple[int, ...]:
        idx = [i for mod in self.by_op.get((block, op), []) for i in self.mod_params[mod.path]]
        return tuple(i for i in reversed(idx) if self.job.params[i].trainable)

    def sequence(self) -> list[tuple[int, str]]:
        L = self.arch.layers
        if self.arch.encoder:  # post-LN: no final norm; the QA head replaces the LM head
            head = [(-1, "embedding"), (-1, "embedding_norm")]
            tail = [(L, "qa_head"), (L, "loss")]
        else:
            head, tail = [(-1, "embedding")], [(L, "final_norm"), (L, "lm_head"), (L, "loss")]
        return head + [(b, op) for b in range(L) for op in self.block_ops] + tail


def _label(block: int, op: str) -> str:
    return f"layers.{block}.{op}" if op in _BLOCK_OPS else op


def build(job: Job, phase: Phase) -> list[Op]:
    if job.arch is None:
        return _build_generic(job, phase)
    if phase == "optimizer":
        return optimizer_ops(job)
    bld = _Builder(job)
    seq = bld.sequence()
    if phase == "forward":
        return [Op.of(_label(b, op), b, "forward", bld.forward(b, op)) for b, op in seq]
    recompute = {"none": (), "selective": ("attention",),
                 "full": bld.block_ops}[job.checkpointing]
    out: list[Op] = []
    current: int | None = None
    for b, op in reversed(seq):
        if b != current and 0 <= b < job.n_blocks:  # entering a block's backward
            current = b
            for rop in (x for x in bld.block_ops if x in recompute):
                out.append(Op.of(_label(b, rop), b, "recompute", bld.forward(b, rop)))
        if phase == "backward":
            out.append(Op.of(_label(b, op), b, "backward", bld.backward(b, op), bld.grads(b, op)))
    return out


def optimizer_ops(job: Job) -> list[Op]:
    """One memory-bound op per block over its trainable parameters (fused multi-tensor step).

    AdamW, mixed precision: reads fp32 grad, master weight, m, v (16 B); writes master, m, v
    and the 16-bit working copy (14 B) = 30 B per parameter. SGD with momentum: 22 B. Under
    fp32 there is no 16-bit copy (28 / 20 B).
    """
    per_param = {"adamw": 30, "sgd": 22}[job.optimizer] - (2 if job.precision == "fp32" else 0)
    flops_per_param = {"adamw": 12, "sgd": 4}[job.optimizer]
    out = []
    for b in job.blocks:
        n = sum(job.params[i].numel for i in job.block_params(b) if job.params[i].trainable)
        if n:
            out.append(Op.of(f"optimizer.{b}", b, "optimizer",
                             [memory(n * per_param, n * flops_per_param)]))
    return out


def model_flops_per_micro_batch(job: Job) -> float:
    """Model FLOPs (no recompute, full attention count) of one micro-batch: MFU's numerator.

    6 FLOPs per token per trainable GEMM weight, 4 per frozen one (no weight gradient), plus
    attention 12*b*s^2*h per layer (3 x 4bs^2h); the LM head counts even when tied. For a
    standard GPT this is exactly 72*B*s*L*h^2*(1 + s/6h + V/12Lh) (Narayanan et al. 2021).
    An encoder (BERT) counts the same full attention and its task head, and has no LM head.
    """
    T = job.tokens_per_micro_batch
    if job.arch is None:
        return 3.0 * job.micro_batch * sum(x.forward_flops_per_sample for x in job.generic_layers)
    A = job.arch
    weight_factor = 6.0 if job.finetune == "full" else 4.0
    total = 0.0
    for mod in job.modules:
        if mod.kind in ("linear", "conv1d"):
            total += weight_factor * T * mod.in_features * mod.out_features
            if mod.lora:
                total += 6.0 * T * job.lora_rank * (mod.in_features + mod.out_features)
    if A.tied and not A.encoder:
        total += weight_factor * T * A.hidden * A.vocab
    total += 12.0 * job.micro_batch * job.seq_len ** 2 * A.hidden * A.layers
    return total


def _build_generic(job: Job, phase: Phase) -> list[Op]:
    """One op per layer, from the layer list's own numbers."""
    a, mb = job.activation_bytes, job.micro_batch
    if phase == "optimizer":
        return optimizer_ops(job)
    layers = list(enumerate(job.generic_layers))
    if phase == "forward":
        return [Op.of(x.name, i, "forward", _generic_fwd(x, a, mb)) for i, x in layers]
    recompute = job.checkpointing != "none"  # a layer is the unit: selective acts as full
    ops: list[Op] = []
    for i, x in reversed(layers):
        fwd = _generic_fwd(x, a, mb)
        if recompute:
            ops.append(Op.of(x.name, i, "recompute", fwd))
        if phase == "recompute":
            continue
        grads = tuple(reversed(job.block_params(i)))
        # 2x the forward: the dense part has an input- and a weight-gradient pass; the
        # memory-bound part reads the output gradient and the saved input and writes the input
        # gradient (BatchNorm backward also re-reads its input for the statistics' gradients),
        # the elementwise convention of the module docstring
        ops.append(Op.of(x.name, i, "backward",
                         [replace(k, flops=2 * k.flops, bytes=2 * k.bytes) for k in fwd], grads))
    return ops


def _generic_fwd(layer: GenericLayer, a: int, mb: int) -> list[Kernel]:
    # the dense part reads its weights and writes the activations it keeps for backward; the
    # memory-bound part (norms, activations, residual adds) streams its given bytes
    dense = Kernel("dense", layer.forward_flops_per_sample * mb,
                   layer.params * a + layer.activation_bytes_per_sample * mb, None, a)
    if not layer.memory_bytes_per_sample:
        return [dense]
    return [dense, memory(layer.memory_bytes_per_sample * mb)]
