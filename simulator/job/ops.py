"""The ops of one micro-batch of a Job: kernels, FLOPs, HBM bytes and the gradients each completes.

An `Op` is a few kernels of one block (the attention projections, the attention core, the MLP,
a norm). ``build`` lists a phase's ops in the order they run: a transformer's come from the
kernels simulator/job/transformer_ops.py gives each op of a block, a generic workload's from
its layers' own numbers, the optimizer step from optimizer.py. Also here: model FLOPs for MFU.
simulator/job/compute.py times each kernel by a roofline.

Conventions (each with its source or reason):
- Forward FLOPs per layer 24*b*s*h^2 + 4*b*s^2*h for a standard GPT (Narayanan et al. 2021,
  arXiv:2104.04473, appendix); a generic layer's backward is twice its forward.
- Gradient order (`Op.grads`): backward ops run in reverse forward order; an op's gradients are
  complete when it ends (transformer_ops.py lists them). A tied embedding's gradient completes
  at the embedding's backward (last).
- Activation checkpointing per block (simulator/job/checkpointing.py says what each mode keeps):
  `full` recomputes the block's forward before its backward (HF gradient_checkpointing,
  torchtitan ``mode = 'full'``); `selective` recomputes the attention core (Korthikanti et al.
  2022); `op` recomputes all but the saved GEMMs and the attention kernel (torchtitan's
  op-level policy). A generic layer is the unit: every mode acts as `full`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from simulator.job import checkpointing, diffusion, optimizer
from simulator.job.kernels import FP32, Kernel, memory
from simulator.job.roles import EVERY_BLOCK_OP
from simulator.job.transformer_ops import Builder

if TYPE_CHECKING:
    from simulator.inputs.schema import GenericLayer
    from simulator.job.workload import Job

__all__ = ["Kernel", "Op", "build", "flops_counted", "model_flops_per_micro_batch",
           "recompute_flops_per_micro_batch"]

Phase = Literal["forward", "backward", "recompute", "optimizer"]


@dataclass(frozen=True)
class Op:
    """One op of the step (a block's GEMM, norm, attention, ...) with its kernels and cost."""

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

    def relabelled(self, name: str, block: int, phase: Phase, grads: tuple[int, ...]) -> Op:
        """An op of these very kernels (so of the same sums) under another name and place."""
        return Op(name, block, phase, self.flops, self.bytes, grads, self.kernels)


def _label(block: int, op: str) -> str:
    return f"layers.{block}.{op}" if op in EVERY_BLOCK_OP else op


def build(job: Job, phase: Phase, *, autocast: bool = False) -> list[Op]:
    if job.unet is not None:  # a diffusion UNet's blocks, kernel by kernel (diffusion.py)
        return _build_unet(job, phase)
    if job.arch is None:
        return _build_generic(job, phase)
    if phase == "optimizer":
        return optimizer_ops(job)
    bld = Builder(job, autocast=autocast)
    seq = bld.sequence()
    # kernel list -> (the list, kept so its id stays its own; an op of it): blocks share lists
    sums: dict[int, tuple[list[Kernel], Op]] = {}

    def of(name: str, block: int, kind: Phase, kernels: list[Kernel],
           grads: tuple[int, ...] = ()) -> Op:
        """``Op.of``, with its sums and kernel tuple made once per kernel list."""
        hit = sums.get(id(kernels))
        if hit is None or hit[0] is not kernels:
            hit = sums[id(kernels)] = (kernels, Op.of(name, block, kind, kernels))
        return hit[1].relabelled(name, block, kind, grads)
    if phase == "forward":
        return [of(_label(b, op), b, "forward", bld.forward(b, op)) for b, op in seq]
    cache: dict[tuple[int, bool, int | None], list[tuple[str, list[Kernel]]]] = {}

    def recompute(b: int) -> list[tuple[str, list[Kernel]]]:
        """The block's recomputed ops (alike for every block but the first, and for every
        block of the same kind in a mixture of experts)."""
        if job.checkpointing == "none":
            return []
        key = (min(b, 1), bld.arch.is_moe(b), bld.arch.window(b))
        if key not in cache:
            block = [(rop, bld.forward(b, rop)) for rop in bld.ops_of(b)]
            cache[key] = checkpointing.recompute(job.checkpointing, block)
        return cache[key]

    out: list[Op] = []
    current: int | None = None
    for b, op in reversed(seq):
        if b != current and 0 <= b < job.n_blocks:  # entering a block's backward
            current = b
            for rop, kernels in recompute(b):
                out.append(of(_label(b, rop), b, "recompute", kernels))
        if phase == "backward":
            out.append(of(_label(b, op), b, "backward", bld.backward(b, op), bld.grads(b, op)))
    return out


def op_params(job: Job) -> dict[str, tuple[int, ...]]:
    """Op label -> the indices into ``job.params`` of the parameters its modules hold
    (trainable or not), as ``build`` names the ops (a transformer job)."""
    bld = Builder(job)
    out: dict[str, tuple[int, ...]] = {}
    for (block, op), mods in bld.by_op.items():
        idx = tuple(i for m in mods for i in bld.mod_params[m.path])
        if idx:
            out[_label(block, op)] = idx
    return out


def optimizer_ops(job: Job) -> list[Op]:
    """One op per block over its trainable parameters (simulator/job/optimizer.py)."""
    rec = job.recipe
    p = job.master_bytes
    out = []
    for b in job.blocks:
        idx = [i for i in job.block_params(b) if job.params[i].trainable]
        n = sum(job.params[i].numel for i in idx)
        if n:
            kernels = optimizer.step_kernels(rec.optimizer, rec.optimizer_impl, n, p, p,
                                             clip=rec.clip_grad, tensors=len(idx))
            if rec.amp_o2:  # apex _process_optimizer: the unscaled 16-bit gradients copied
                # into the fp32 master gradients (multi_tensor_scale), and the updated master
                # weights back into the 16-bit model after the step
                g = job.grad_bytes
                kernels = [memory(n * (g + p), name="amp_o2.model_grads_to_master"),
                           *kernels, memory(n * (p + g), name="amp_o2.master_to_model")]
            out.append(Op.of(f"optimizer.{b}", b, "optimizer", kernels))
    return out


def tensor_step_op(job: Job, indices: list[int], name: str, block: int) -> Op:
    """The optimizer step of some tensors, one launch each: torchtune's optimizer_in_bwd gives
    every parameter an optimizer of its own, stepped from its post-accumulate-grad hook."""
    rec = job.recipe
    p = job.master_bytes
    kernels = [k for i in indices
               for k in optimizer.step_kernels(rec.optimizer, rec.optimizer_impl,
                                               job.params[i].numel, p, p, clip=rec.clip_grad,
                                               tensors=1)]
    return Op.of(name, block, "optimizer", kernels)


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
    routed = A.moe.top_k / A.moe.experts if A.moe is not None else 1.0
    for mod in job.modules:
        if mod.kind in ("linear", "conv1d"):
            share = routed if ".experts." in mod.path else 1.0  # an expert sees k/E of tokens
            total += share * weight_factor * T * mod.in_features * mod.out_features
            if mod.lora:
                total += share * 6.0 * T * job.lora_rank * (mod.in_features + mod.out_features)
    if A.tied and not A.encoder:
        total += weight_factor * T * A.hidden * A.vocab
    for b in range(A.layers):  # a local block's attention over its window only
        s, w = job.seq_len, A.window(b)
        pairs = s * s if w is None or s <= w else 2 * w * s - w * w
        total += 12.0 * job.micro_batch * pairs * A.attn_dim
    return total


def recompute_flops_per_micro_batch(job: Job) -> float:
    """The forward FLOPs activation checkpointing runs again in backward, counted as model
    FLOPs count them (GEMMs as run; a recomputed attention kernel as its full forward,
    4*b*s^2*h): what hardware FLOPs utilisation adds to model FLOPs (Korthikanti et al. 2022,
    arXiv:2205.05198, section 6: HFU includes the recompute)."""
    attention = (4.0 * job.micro_batch * job.seq_len ** 2 * job.arch.hidden
                 if job.arch is not None else 0.0)
    total = 0.0
    for op in job.backward_ops():
        if op.phase != "recompute":
            continue
        for k in op.kernels:
            if k.kind in ("gemm", "dense"):
                total += k.flops
            elif k.kind == "attention_fwd":
                total += attention
    return total


def flops_counted(job: Job) -> dict[str, str]:
    """What the MFU numerator counts for this job: ``short`` for a line of text, ``words`` in
    full. PEFT's frozen weights do no weight-gradient GEMM (simulator/job/transformer_ops.py),
    so they count 4 FLOPs per token, the adapters 6, as the LoRA paper's cost argument does
    (Hu et al. 2021, arXiv:2106.09685, section 4.2: no gradients for most parameters)."""
    if job.arch is None:
        return {"short": "3x forward",
                "words": "model FLOPs: 3x each layer's forward FLOPs (forward, input and "
                         "weight gradients)"}
    attention = "attention 12*b*s^2*h per layer (the whole score matrix, as Megatron-LM counts)"
    if job.finetune == "full":
        return {"short": "6N + attention",
                "words": f"model FLOPs: 6 per weight per token (6N) + {attention}"}
    return {"short": f"{job.finetune}: 4N frozen + 6N adapters + attention",
            "words": f"model FLOPs of {job.finetune}: 4 per frozen weight per token (forward "
                     "and input gradient; no weight gradient) + 6 per adapter weight per token "
                     f"+ {attention}"}


def _build_generic(job: Job, phase: Phase) -> list[Op]:
    """One op per layer, from the layer list's own numbers."""
    a, mb = job.activation_bytes, job.micro_batch
    if phase == "optimizer":
        return optimizer_ops(job)
    layers = list(enumerate(job.generic_layers))
    if phase == "forward":
        return [Op.of(x.name, i, "forward", _generic_fwd(x, a, mb)) for i, x in layers]
    recompute = job.checkpointing != "none"  # a layer is the unit: every mode acts as full
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
        # gradient (BatchNorm backward also re-reads its input for the statistics' gradients)
        ops.append(Op.of(x.name, i, "backward",
                         [replace(k, flops=2 * k.flops, bytes=2 * k.bytes) for k in fwd], grads))
    return ops


def _build_unet(job: Job, phase: Phase) -> list[Op]:
    """One op per UNet block: forward, backward (with the block's forward again first under
    any checkpointing: diffusers' ``enable_gradient_checkpointing`` wraps each block)."""
    u = job.unet
    assert u is not None
    if phase == "optimizer":
        return optimizer_ops(job)
    built = [diffusion.block_kernels(job, b) for b in range(len(u.blocks))]
    if phase == "forward":
        return [Op.of(name, b, "forward", built[b][0]) for b, name in enumerate(u.blocks)]
    ops: list[Op] = []
    for b in reversed(range(len(u.blocks))):
        name = u.blocks[b]
        if job.checkpointing != "none":
            ops.append(Op.of(name, b, "recompute", built[b][0]))
        if phase == "backward":
            grads = tuple(i for i in reversed(job.block_params(b)) if job.params[i].trainable)
            ops.append(Op.of(name, b, "backward", built[b][1], grads))
    return ops


def _generic_fwd(layer: GenericLayer, a: int, mb: int) -> list[Kernel]:
    # the dense part reads its weights and writes the activations it keeps for backward; the
    # memory-bound part (norms, activations, residual adds) streams its given bytes
    tf32 = layer.convolution and a == FP32  # compute.py: TF32 where the card has it
    dense = Kernel("dense", layer.forward_flops_per_sample * mb,
                   layer.params * a + layer.activation_bytes_per_sample * mb, None, a,
                   name="dense_tf32" if tf32 else "dense")
    if not layer.memory_bytes_per_sample:
        return [dense]
    return [dense, memory(layer.memory_bytes_per_sample * mb)]
