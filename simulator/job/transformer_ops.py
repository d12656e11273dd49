"""The kernels of each op of a transformer block, for one micro-batch of a Job.

``Builder`` groups a transformer's modules into the ops of a block (attention norm, q/k/v, the
attention core, output projection, MLP norm, MLP in, activation, MLP out; embeddings, final
norm, head and loss around them) and gives each op's forward and backward kernels and the
gradients it completes. The GEMMs are built here; the memory-bound work comes from the job's
kernel regime (``training.kernels``: simulator/job/eager.py, compiled.py, fused.py), the
attention core from attention.py, the loss from loss.py. ops.py puts these kernels in order.

Conventions (each with its source or reason):
- FLOPs per GEMM 2*m*n*k.
- Backward of a linear layer = input-gradient GEMM + weight-gradient GEMM (2x forward); a frozen
  weight (LoRA, QLoRA) skips the weight-gradient GEMM; QLoRA dequantises the NF4 weight to 16 bit
  before every use, forward and backward (bitsandbytes MatMul4Bit), reading 0.5 and writing
  2 bytes per weight. PEFT's LoRA branch scales and adds its output (forward) and adds its input
  gradient into the base layer's (backward); with lora_dropout > 0 it first drops its own copy
  of the input (peft tuners/lora/layer.py: ``lora_B(lora_A(dropout(x))) * scaling``, the
  dropout an ``nn.Dropout``, an ``nn.Identity`` at 0), one more pass each way. Over a 4-bit
  base layer PEFT first clones the base output ("for 4bit, we need to defensively clone
  here", peft tuners/lora/bnb.py Linear4bit.forward; its backward passes the gradient through);
  torchtune's own LoRALinear does not.
- A tensor read by several linear layers (the norm output before q, k and v; before gate and
  up) gets one input gradient from each: eager autograd adds them pairwise, Inductor folds the
  sum into the next kernel, fused stacks run one wide GEMM (Megatron's linear_qkv, linear_fc1).
- Weight gradients are written in the gradient dtype (fp32 under AMP, whose weights are fp32;
  bf16 under pure-bf16 training).
- An op's gradients are listed in reverse registration order (autograd runs later-created nodes
  first). Llama block: down_proj; up_proj, gate_proj; post_attention_layernorm; o_proj; v, k, q;
  input_layernorm.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from simulator.job import attention, block_memory, loss, moe, vision
from simulator.job.kernels import (
    BlockShape,
    Kernel,
    MemoryBound,
    gemm,
    memory,
    pointwise,
)
from simulator.job.modules import NF4_BITS_PER_PARAM
from simulator.job.parameters import QA_LABELS
from simulator.job.roles import BLOCK_OPS, MOE_BLOCK_OPS, POST_LN_BLOCK_OPS, role
from simulator.memo import IdentityMemo

if TYPE_CHECKING:
    from simulator.job.modules import Module
    from simulator.job.workload import Job

REGIMES = ("eager", "compiled", "fused")  # kernel regime -> its module simulator/job/<regime>.py
NF4_BYTES = NF4_BITS_PER_PARAM / 8  # what dequantize_4bit reads per weight, its absmaxes too


def regime(kernels: str) -> ModuleType:
    """The module of a kernel regime, imported when a job first asks for it (a job runs one)."""
    if kernels not in REGIMES:
        raise KeyError(kernels)
    return importlib.import_module(f"simulator.job.{kernels}")


# which parameters each module owns and the modules of each op: one model's, read by every job
# of it (an advice's candidates)
_LAYOUT: IdentityMemo[tuple[dict[str, list[int]], dict[tuple[int, str], list[Module]]]] = \
    IdentityMemo(limit=16)


def _layout(job: Job) -> tuple[dict[str, list[int]], dict[tuple[int, str], list[Module]]]:
    """module path -> indices of its params (params follow modules in order), and
    (block, op) -> the modules whose weights that op uses."""
    A = job.arch
    assert A is not None
    mod_params: dict[str, list[int]] = {}
    i = 0
    prefix = "base_model.model." if job.finetune != "full" else ""
    for mod in job.modules:
        head = f"{prefix}{mod.path}."
        idx = []
        while i < len(job.params) and job.params[i].name.startswith(head):
            idx.append(i)
            i += 1
        mod_params[mod.path] = idx
    by_op: dict[tuple[int, str], list[Module]] = {}
    for mod in job.modules:
        by_op.setdefault((mod.block, role(mod, A.layers, A.sandwich_norm)), []).append(mod)
    if A.tied and not A.encoder:  # the head GEMM uses the embedding's weight
        by_op.setdefault((A.layers, "lm_head"), [])
    return mod_params, by_op


class Builder:
    """The kernels of each op of one micro-batch of a transformer Job, built once per op (every
    block but the first is alike)."""

    def __init__(self, job: Job, *, autocast: bool = False) -> None:
        assert job.arch is not None
        self.job, self.arch = job, job.arch
        self.autocast = autocast
        self.a = job.activation_bytes
        self.T = job.tokens_per_micro_batch
        A = self.arch
        self.shape = BlockShape(self.T, A.hidden, A.kv_dim, A.ffn_hidden, A.heads, self.a,
                                A.q_dim)
        self.kernels = job.recipe.kernels
        self.regime = regime(self.kernels)
        self.mod_params, self.by_op = _LAYOUT.get((job.modules, job.params), job.finetune,
                                                  lambda: _layout(job))
        self.block_ops = POST_LN_BLOCK_OPS if A.encoder else BLOCK_OPS
        self.loss = loss.cross_entropy(job.recipe.cross_entropy,
                                       self.T * (QA_LABELS if A.encoder else A.vocab), self.a,
                                       compiled=job.recipe.loss_compiled)
        self._memory_bound: dict[tuple[int, tuple[bool, bool], str], MemoryBound] = {}
        self._kernels: dict[tuple[str, int, tuple[bool, bool], str], list[Kernel]] = {}

    # --- the regime's memory-bound work -----------------------------------------------------
    def _key(self, block: int, op: str) -> tuple[int, tuple[bool, bool], str]:
        """Blocks are alike but for the first one (no residual stream before it) and, in a
        mixture of experts, the dense ones: cache key."""
        inside = 0 <= block < self.arch.layers
        kind = (self.arch.is_moe(block), self.arch.window(block) is not None)
        return (min(block, 1) if inside else block, kind, op)

    def ops_of(self, block: int) -> tuple[str, ...]:
        """A block's ops in forward order."""
        return MOE_BLOCK_OPS if self.arch.is_moe(block) else self.block_ops

    @property
    def representative(self) -> int:
        """The block whose per-token figures stand for every block: the first MoE block in a
        mixture of experts (its dense blocks, if any, are few), else block 0."""
        return next((b for b in range(self.arch.layers) if self.arch.is_moe(b)), 0)

    def memory_bound(self, block: int, op: str) -> MemoryBound:
        """The memory-bound work of one block op under the job's kernel regime."""
        key = self._key(block, op)
        if key not in self._memory_bound:
            self._memory_bound[key] = block_memory.of(self, block, op)
        return self._memory_bound[key]

    def _accumulate(self, n: float, consumers: int) -> list[Kernel]:
        """Input gradients of one tensor from ``consumers`` linear layers, summed."""
        if consumers < 2 or self.kernels == "fused":
            return []
        if self.kernels == "compiled":  # folded into the next kernel: one more read each
            return [pointwise("sum_input_grads", n, reads=(consumers - 1) * self.a, writes=0)]
        x = block_memory.stream_bytes(self)  # under autocast: cast back to the fp32 stream
        return [pointwise("accumulate_input_grad", n, reads=2 * x, writes=x)
                for _ in range(consumers - 1)]

    def accumulate(self, n: float, consumers: int) -> list[Kernel]:
        return self._accumulate(n, consumers)

    # --- linear layers ----------------------------------------------------------------------
    def linears_fwd(self, mods: list[Module], rows: int | None = None) -> list[Kernel]:
        """The forward kernels of linear layers over ``rows`` tokens (default the micro-batch)."""
        return [k for mod in mods if mod.kind in ("linear", "conv1d")
                for k in self._linear_fwd(mod, rows)]

    def linears_bwd(self, mods: list[Module], rows: int | None = None) -> list[Kernel]:
        """Their backward, last layer first."""
        return [k for mod in reversed(mods) if mod.kind in ("linear", "conv1d")
                for k in self._linear_bwd(mod, rows)]

    def _linear_fwd(self, mod: Module, rows: int | None = None) -> list[Kernel]:
        T, a, i, o = rows or self.T, self.a, mod.in_features, mod.out_features
        out: list[Kernel] = []
        if self._quantized(mod):
            out.append(memory(i * o * (NF4_BYTES + 2), name="dequantize_nf4"))
        if self.autocast and self.job.finetune == "full":  # the autocast cache: once a forward
            out.append(memory(i * o * (4 + a), name="autocast_to_16bit"))
        out.append(gemm(T, o, i, a))
        if mod.lora:
            r = self.job.lora_rank
            if self.job.lora_dropout > 0:  # nn.Dropout on the adapter's own copy of x
                out.append(pointwise("lora_dropout", T * i, reads=a, writes=a + 1))
            if self._quantized(mod) and self.job.recipe.framework != "torchtune":
                out.append(memory(2 * T * o * a, name="peft_4bit_clone"))
            out += [gemm(T, r, i, a), gemm(T, o, r, a), memory(5 * T * o * a, name="lora_add")]
        return out

    def _linear_bwd(self, mod: Module, rows: int | None = None) -> list[Kernel]:
        T, a, i, o = rows or self.T, self.a, mod.in_features, mod.out_features
        out: list[Kernel] = []
        if self._quantized(mod):
            out.append(memory(i * o * (NF4_BYTES + 2), name="dequantize_nf4"))
        out.append(gemm(T, i, o, a))  # dX = dY @ W
        if self.job.finetune == "full":  # dW = dY^T @ X; a bias grad is a column sum of dY
            extra = o * i * self._grad_write_extra() + (T * o * a if mod.bias else 0)
            out.append(replace(gemm(o, i, T, a, extra_bytes=extra), weight_grad=True))
            if self.autocast:  # ToCopyBackward: the 16-bit gradient to the fp32 weight's dtype
                out.append(memory(i * o * (a + 4), name="autocast_grad_to_fp32"))
        if mod.lora:
            r = self.job.lora_rank
            out += [memory(2 * T * o * a, name="lora_scale_backward"),
                    gemm(o, r, T, a), gemm(T, r, o, a),  # dB, dH
                    gemm(r, i, T, a), gemm(T, i, r, a)]  # dA, dX (LoRA branch)
            if self.job.lora_dropout > 0:
                out.append(pointwise("lora_dropout_backward", T * i, reads=a + 1, writes=a))
            out.append(memory(3 * T * i * a, name="lora_add_input_grad"))
        return out

    def _grad_write_extra(self) -> float:
        """Bytes per weight the gradient GEMM writes beyond its 16-bit output: Megatron fuses
        the fp32 accumulation into it (gradient_accumulation_fusion: reads and writes
        main_grad); elsewhere the GEMM writes the compute dtype and a cast follows (autocast's
        backward, FSDP's reduce-scatter copy-in)."""
        if self.job.recipe.framework == "megatron":
            return 2 * self.job.grad_bytes - self.a
        return 0.0

    def _quantized(self, mod: Module) -> bool:
        return self.job.finetune == "qlora" and mod.kind in ("linear", "conv1d") \
            and mod.path != "lm_head"

    def _linears_fwd(self, mods: list[Module]) -> list[Kernel]:
        return [k for mod in mods if mod.kind in ("linear", "conv1d")
                for k in self._linear_fwd(mod)]

    def _head_fwd(self, mods: list[Module]) -> list[Kernel]:
        """The LM head, in as many GEMMs as the loss has chunks."""
        A, c = self.arch, self.loss.chunks
        if not mods:  # tied: the embedding's weight
            cast = [memory(A.vocab * A.hidden * (4 + self.a), name="autocast_to_16bit")] \
                if self.autocast and self.job.finetune == "full" else []
            return cast + [gemm(self.T // c, A.vocab, A.hidden, self.a) for _ in range(c)]
        if c == 1:
            return self._linears_fwd(mods)
        return [replace(k, flops=k.flops / c, bytes=k.bytes / c,
                        shape=(k.shape[0] // c, *k.shape[1:]) if k.shape else None)
                for k in self._linears_fwd(mods) for _ in range(c)]

    # --- forward and backward kernels of each op ----------------------------------------------
    def forward(self, block: int, op: str) -> list[Kernel]:
        key = ("forward", *self._key(block, op))
        if key not in self._kernels:
            self._kernels[key] = self._forward(block, op)
        return self._kernels[key]

    def backward(self, block: int, op: str) -> list[Kernel]:
        key = ("backward", *self._key(block, op))
        if key not in self._kernels:
            self._kernels[key] = self._backward(block, op)
        return self._kernels[key]

    def _forward(self, block: int, op: str) -> list[Kernel]:
        A, T, j = self.arch, self.T, self.job
        if op in moe.MOE_OPS:
            return moe.forward(self, block, op)
        mods = self.by_op.get((block, op), [])
        if op == "vision":
            return vision.forward(self, mods)
        glue = self.memory_bound(block, op).forward
        if op == "attention":
            return self._attention(block, backward=False)
        if op == "embedding":  # gather rows of each table (read + write), add position rows
            n_tables, x = len(mods), block_memory.stream_bytes(self)
            gather = memory((2 * n_tables + 3 * (n_tables - 1)) * T * A.hidden * x,
                            name="embedding")
            return [gather] + ([memory(T * A.hidden * (2 * x + 1), name="native_dropout")]
                               if j.hidden_dropout else [])
        if op == "embedding_norm":
            return list(glue)
        if op == "loss":
            return list(self.loss.forward)
        if op == "lm_head":
            return self._head_fwd(mods) + self._softcap(backward=False)
        return self._linears_fwd(mods) + list(glue)

    def _softcap(self, *, backward: bool) -> list[Kernel]:
        """Gemma 2's final-logit soft-capping, as Gemma2ForCausalLM writes it: ``logits /
        cap``, ``tanh``, ``* cap`` over the 16-bit logits; backward: the two scalings and
        tanh's backward (1 - y^2)."""
        if self.arch.logit_softcap is None or self.arch.encoder:
            return []
        n, a = self.T * self.arch.vocab, self.a
        if backward:
            return [pointwise("softcap_mul_backward", n, reads=a, writes=a),
                    pointwise("tanh_backward", n, reads=2 * a, writes=a, flops_per_element=3),
                    pointwise("softcap_div_backward", n, reads=a, writes=a)]
        return [pointwise("softcap_div", n, reads=a, writes=a),
                pointwise("tanh", n, reads=a, writes=a, flops_per_element=4),
                pointwise("softcap_mul", n, reads=a, writes=a)]

    def _attention(self, block: int, *, backward: bool) -> list[Kernel]:
        """The attention core's kernels: eager matmul-softmax-matmul or one FlashAttention
        (a local block's over its window); Gemma 2's score soft-capping in eager is three
        passes over the scores each way (Gemma2Attention: ``/ cap``, ``tanh``, ``* cap``)."""
        A, j = self.arch, self.job
        b, s = j.micro_batch, j.seq_len
        window = A.window(block)
        if j.attention_kernel == "eager":
            kernels = attention.eager(b, s, A.heads, A.attn_dim // A.heads, self.a,
                                      chain=j.eager_chain, backward=backward,
                                      matmul_copies=self.kernels != "fused")
            if A.attention_softcap is not None:
                scores = b * A.heads * s * s
                kernels += [pointwise(f"softcap.{x}", scores, reads=2 * self.a if backward and
                                      x == "tanh" else self.a, writes=self.a)
                            for x in ("div", "tanh", "mul")]
            return kernels
        return [attention.flash(b, s, A.attn_dim, self.kv_in, self.a, causal=not A.encoder,
                                backward=backward, version=self.flash_version, window=window)]

    @property
    def flash_version(self) -> int | str:
        versions: dict[str, int | str] = {"flash3": 3, "triton": "triton", "flash1": 1,
                                          "mem_efficient": "mem_efficient"}
        return versions.get(self.job.attention_kernel, 2)

    @property
    def kv_in(self) -> int:
        """The K/V width the attention kernel is given (repeated per query head or not)."""
        A = self.arch
        if A.mla is not None:  # kv_b_proj gives every head its own k and v
            return A.attn_dim
        return A.q_dim if self.shape.repeats_kv and self.kernels != "fused" else A.kv_dim

    def _backward(self, block: int, op: str) -> list[Kernel]:
        A, T, a, j = self.arch, self.T, self.a, self.job
        if op in moe.MOE_OPS:
            return moe.backward(self, block, op)
        mods = self.by_op.get((block, op), [])
        if op == "vision":
            return vision.backward(self, mods)
        glue = list(self.memory_bound(block, op).backward)
        if op == "attention":
            return self._attention(block, backward=True)
        if op == "loss":
            return list(self.loss.backward)
        full = j.finetune == "full"
        if op == "lm_head":
            c = self.loss.chunks
            dx = self._softcap(backward=True) + [gemm(T // c, A.hidden, A.vocab, a)
                                                  for _ in range(c)]
            if not full:
                return dx
            g = j.grad_bytes
            dw = replace(gemm(A.vocab, A.hidden, T // c, a,
                              extra_bytes=A.vocab * A.hidden * self._grad_write_extra()),
                         weight_grad=True)
            # each chunk's weight gradient is added to the previous ones (autograd input buffer)
            adds = [pointwise("accumulate_head_grad", A.vocab * A.hidden, reads=2 * a, writes=a)
                    for _ in range(c - 1)]
            cast = [memory(A.vocab * A.hidden * (a + g), name="autocast_grad_to_fp32")] \
                if self.autocast and mods == [] else []
            return dx + [dw] * c + adds + cast
        if op == "embedding":  # dense grad of the table(s), scatter-add of dY
            x = block_memory.stream_bytes(self)
            drop = [memory(T * A.hidden * (2 * x + 1), name="native_dropout_backward")] \
                if j.hidden_dropout else []
            if not full:  # frozen embeddings: nothing to compute
                return drop
            tables = sum(m.in_features * m.out_features for m in mods)
            g = j.grad_bytes
            return drop + [memory(tables * g + len(mods) * T * A.hidden * (x + g),
                                  name="embedding_dense_backward")]
        linears = [m for m in mods if m.kind in ("linear", "conv1d")]
        if linears:
            kernels = [k for mod in reversed(linears) for k in self._linear_bwd(mod)]
            kernels += self._accumulate(T * linears[0].in_features,
                                        sum(m.in_features == A.hidden for m in linears))
            if op in ("attn_out", "mlp_out"):  # the residual's backward runs first
                return glue + kernels
            return kernels + glue  # qkv: the repeat/rotary backward ran before the GEMMs
        return glue

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
            if self.arch.vision is not None:  # the images through the encoder first
                head = [(-1, "vision"), *head]
        return head + [(b, op) for b in range(L) for op in self.ops_of(b)] + tail


def builder(job: Job) -> Builder:
    """The op builder of a transformer job (checkpointing.py reads its memory-bound work and
    shapes)."""
    return Builder(job)
