"""Memory per GPU for one training step, line by line, and the fits verdict.

Inside: ``estimate(job, gpu, strategy, world=...)`` -> ``MemoryReport`` (itemised lines in five
categories: weights, gradients, optimizer, activations, other); the activation lines come from
simulator/memory/activations.py (``activations_per_token``).
The searches built on it (largest micro-batch, largest model) are in simulator/memory/search.py.

The training recipe per strategy (all cost 16 bytes per trainable parameter with mixed-precision
Adam, as in the ZeRO paper, Rajbhandari et al. 2019, arXiv:1910.02054 section 3.1; the split
between weights, gradients and optimizer differs and is stated on every report):
- ddp, tp: PyTorch AMP. fp32 weights (4) and fp32 gradients (4), Adam m and v (8); autocast
  keeps 16-bit copies of the matmul weights for the step (torch.autocast cache_enabled=True).
- zero1/2/3: DeepSpeed bf16/fp16. 16-bit weights (2) and gradients (2), fp32 master + m + v (12).
- fsdp: FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32). Sharded fp32
  parameters (4, they are the master copy), sharded fp32 gradients (4), Adam m and v (8).
Sharding: ZeRO-1 divides the optimizer by the data-parallel degree N, ZeRO-2 also the gradients,
ZeRO-3 and FSDP everything: 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N (ZeRO paper, figure 1). Tensor
parallelism divides every matrix by t (norm weights stay replicated).

Activations are counted per saved tensor as the kernel regime and the checkpointing mode keep
them (simulator/job/checkpointing.py); under fused kernels that is Korthikanti et al. 2022
(arXiv:2205.05198, table 2).
The peak is the largest of the step's allocation timeline (report.py MOMENTS): the loss's and
LM head's backward (every activation and the logits alive), the first block's backward (every
activation and that block's recompute, the logits freed), the end of backward (every gradient)
and the optimizer step. PyTorch's three counters (allocated, reserved, the card's total with
the CUDA context) each have their own peak on it. Under
``optimizer_in_bwd`` one gradient is alive at a time; a paged optimizer's managed states
(``Line.paged``) are outside the verdict and fill what the peak leaves, the rest in host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from simulator.catalog.gpus import GPU
from simulator.errors import InputError, quoted
from simulator.job import optimizer as optim
from simulator.job.checkpointing import job_shape
from simulator.job.modules import NF4_BITS_PER_PARAM
from simulator.job.workload import Job
from simulator.memo import IdentityMemo, Memo
from simulator.memory import host as host_memory
from simulator.memory import step_replay
from simulator.memory.activations import StageShare, activation_lines, activations_per_token
from simulator.memory.allocator import FRAGMENTATION, OVERHEAD_MIDDLE_HALF, cache_lines
from simulator.memory.report import CATEGORIES, MOMENTS, Line, MemoryReport, alive
from simulator.units import MiB

__all__ = ["CATEGORIES", "FRAGMENTATION", "MOMENTS", "Line", "MemoryReport", "StageShare",
           "activations_per_token", "alive", "estimate", "recipe"]

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp")

# CUDA context with lazy module loading (CUDA >= 11.7): "around 400MB" (pytorch/pytorch#109888,
# ptrblck; 300-700 MB reported in #20532 and #28113 depending on GPU and driver).
CUDA_CONTEXT_BYTES = 400 * MiB
# cuBLAS/cuBLASLt workspaces: 32 MiB, the size cuBLAS documents for Hopper and newer (older
# GPUs use less); one handle on the compute stream.
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# NCCL FIFO per connection: Simple NCCL_BUFFSIZE 4 MiB + LL128 120*640*8*8 B + LL 8*512*8*16 B
# (NCCL src/include/comm.h, device.h defaults). Two connections per channel (ring neighbours).
NCCL_BYTES_PER_CONNECTION = 4 * MiB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
NCCL_CONNECTIONS_PER_CHANNEL = 2
NCCL_DEFAULT_CHANNELS = 2  # assumption: NCCL's ring search gives 2 channels on PCIe-only boxes
# DeepSpeed ZeRO-1/2 gradient reduce bucket: reduce_bucket_size default 5e8 elements (config.py).
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed ZeRO-3 steps its partition in sub-groups of sub_group_size elements (default 1e9,
# DeepSpeedZeroConfig): each one's 16-bit gradients flattened and cast to fp32 at a time.
ZERO3_SUB_GROUP_ELEMENTS = 1_000_000_000


@dataclass(frozen=True)
class Recipe:
    """Bytes per trainable parameter, and how the data-parallel group divides each part."""

    weight: float
    grad: float
    optimizer: float
    shard_weights: bool
    shard_grads: bool
    shard_optimizer: bool
    description: str


def recipe(strategy: str, precision: str, optimizer: str,
           implementation: str = "foreach", amp_o2: bool = False) -> Recipe:
    """Bytes per trainable parameter of weights, gradients and optimizer states."""
    st = optim.states(optimizer, implementation, 2 if precision == "pure-bf16" else 4)
    opt, opt_name = st.bytes_per_param, st.description
    if amp_o2 and strategy in ("ddp", "tp"):
        # apex amp O2 (apex/amp/_process_optimizer.py): the model in 16 bit with 16-bit
        # .grad, the optimizer over fp32 master weights and their fp32 gradients
        return Recipe(2, 2, 4 + 4 + opt, False, False, False,
                      f"apex amp O2: {precision} weights and gradients, fp32 master weights, "
                      f"fp32 master gradients and {opt_name} in the optimizer")
    shard_o = strategy in ("zero1", "zero2", "zero3", "fsdp")
    shard_g = strategy in ("zero2", "zero3", "fsdp")
    shard_w = strategy in ("zero3", "fsdp")
    if precision == "pure-bf16":
        return Recipe(2, 2, opt, shard_w, shard_g, shard_o,
                      f"pure bf16: bf16 weights, gradients and {opt_name}, no fp32 master "
                      "copy (torchtune dtype: bf16)")
    if precision == "fp32":
        return Recipe(4, 4, opt, shard_w, shard_g, shard_o,
                      f"fp32 training: fp32 weights, gradients and {opt_name}")
    if strategy.startswith("zero"):
        return Recipe(2, 2, 4 + opt, shard_w, shard_g, shard_o,
                      f"DeepSpeed mixed precision: {precision} weights and gradients, "
                      f"fp32 master weights + {opt_name} in the optimizer")
    if strategy == "fsdp":
        return Recipe(4, 4, opt, shard_w, shard_g, shard_o,
                      f"FSDP2 mixed precision: sharded fp32 weights (the master copy) and "
                      f"fp32 gradients, {opt_name}; {precision} compute copies per unit")
    return Recipe(4, 4, opt, shard_w, shard_g, shard_o,
                  f"PyTorch AMP: fp32 weights and gradients, {opt_name}, autocast "
                  f"{precision} weight copies")


def _check(job: Job, strategy: str, world: int, tp: int) -> None:
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {quoted(strategy)}; choose from "
                         f"{', '.join(STRATEGIES)}")
    if world < 1 or tp < 1:
        raise InputError(f"GPU count and TP size must be at least 1, got {world} and {tp}")
    if world % tp:
        raise InputError(f"tensor-parallel size {tp} does not divide {world} GPUs")
    if tp > 1:
        if job.arch is None:
            raise InputError("tensor parallelism needs a transformer `model`")
        if job.heads % tp or job.kv_heads % tp:
            raise InputError(f"tensor-parallel size {tp} must divide the {job.heads} heads "
                             f"and {job.kv_heads} KV heads")


# The state lines and parameter counts by job shape (and recipe, degrees, stage): they do not
# depend on the micro-batch, and a memory search asks for them at every micro-batch it tries
_STATES: Memo[tuple[tuple[Line, ...], dict[str, float]]] = Memo(limit=256)
_COUNTS: Memo[tuple[int, int]] = Memo(limit=256)


def _parameter_counts(job: Job) -> tuple[int, int]:
    """(parameters, trainable parameters)."""
    return _COUNTS.get(job_shape(job), lambda: (job.n_params, job.n_trainable))


def _state_lines(job: Job, r: Recipe, strategy: str, dp: int, tp: int,
                 stage: StageShare | None = None) -> tuple[list[Line], dict[str, float]]:
    """Weights, gradients, optimizer per rank (of its stage's blocks under pipeline
    parallelism), plus sizes the buffer lines need."""
    key = (job_shape(job), job.grad_accum, r, strategy, dp, tp, stage)
    lines, sizes = _STATES.get(key, partial(_make_state_lines, job, r, strategy, dp, tp, stage))
    return list(lines), dict(sizes)


@dataclass(frozen=True)
class _Tensor:
    """What the state lines read of a parameter tensor: tensors alike are counted once."""

    block: int
    numel: int
    matrix: bool  # split over tensor-parallel ranks
    expert: bool  # an expert's, sharded over dp / ep ranks under expert parallelism
    trainable: bool
    quantized: bool


_ALIKE: IdentityMemo[dict[_Tensor, int]] = IdentityMemo(limit=16)


def _alike_tensors(job: Job) -> dict[_Tensor, int]:
    """The job's parameter tensors, alike ones (a mixture's experts, a block's projections of
    one shape) counted: one model's, shared by every job of it."""
    def count() -> dict[_Tensor, int]:
        out: dict[_Tensor, int] = {}
        for p in job.params:
            t = _Tensor(p.block, p.numel, len(p.shape) > 1, job.ep > 1 and ".experts." in p.name,
                        p.trainable, p.quantized)
            out[t] = out.get(t, 0) + 1
        return out
    return _ALIKE.get((job.params,), job.ep, count)


def _make_state_lines(job: Job, r: Recipe, strategy: str, dp: int, tp: int,
                      stage: StageShare | None) -> tuple[tuple[Line, ...], dict[str, float]]:
    frozen_bytes = job.activation_bytes  # frozen LoRA base kept in the compute dtype
    w = g = o = paged = frozen = quant = largest = 0.0
    unit: dict[int, float] = {}  # unsharded compute-dtype bytes per block (FSDP units)
    unit_grads: dict[int, float] = {}
    autocast = 0.0
    edp = max(1, dp // job.ep)  # expert parallelism: a rank's experts shard over fewer ranks
    for t, count in _alike_tensors(job).items():
        if stage is not None and t.block not in stage.blocks:
            continue
        n = t.numel / tp if t.matrix else t.numel
        d = edp if t.expert else dp  # the ranks sharing it
        if t.trainable:
            w += count * r.weight * n / (d if r.shard_weights else 1)
            g += count * r.grad * n / (d if r.shard_grads else 1)
            largest = max(largest, n / (d if r.shard_grads else 1))
            on_device, in_managed = optim.paged_state_split(job.optimizer, int(n), r.optimizer)
            o += count * on_device / (d if r.shard_optimizer else 1)
            paged += count * in_managed / (d if r.shard_optimizer else 1)
            unit[t.block] = unit.get(t.block, 0.0) + count * n * job.activation_bytes
            unit_grads[t.block] = unit_grads.get(t.block, 0.0) + count * n
            if t.matrix and t.block >= 0:  # matmul weights autocast caches
                autocast += count * n * 2
        elif t.quantized:
            quant += count * n * NF4_BITS_PER_PARAM / 8 / (d if r.shard_weights else 1)
            unit[t.block] = unit.get(t.block, 0.0) + count * n * NF4_BITS_PER_PARAM / 8
        else:
            frozen += count * n * frozen_bytes / (d if r.shard_weights else 1)
            unit[t.block] = unit.get(t.block, 0.0) + count * n * frozen_bytes
    shard = f" / {dp} ranks" if dp > 1 else ""
    tp_note = f", split over {tp} TP ranks" if tp > 1 else ""
    lines = [Line("weights", f"trainable weights, {r.weight:g} B/param"
                  f"{shard if r.shard_weights else ''}{tp_note}", w)]
    if frozen:
        lines.append(Line("weights", f"frozen base weights, {frozen_bytes} B/param"
                          f"{shard if r.shard_weights else ''}", frozen))
    if quant:
        lines.append(Line("weights", f"NF4 4-bit base + double-quant constants, "
                          f"{NF4_BITS_PER_PARAM:.3f} bits/param (QLoRA)"
                          f"{shard if r.shard_weights else ''}", quant))
    # PyTorch optimizers free gradients between steps (zero_grad set_to_none=True, the default
    # since 2.0), so DDP/FSDP gradients appear during backward; DeepSpeed keeps its gradient
    # partitions in persistent buffers, so ZeRO's are always counted. Under gradient
    # accumulation AccumulateGrad adds each micro-step's gradients into the .grad the earlier
    # ones left (zero_grad only after the step), so they are alive at every later start of
    # backward too
    persistent = strategy.startswith("zero") or job.grad_accum > 1
    if job.recipe.optimizer_in_bwd:
        # torchtune optimizer_in_bwd (training/memory.py register_optim_in_bwd_hooks): each
        # parameter's post-accumulate-grad hook steps its optimizer, then zero_grad() frees
        # the gradient, so one gradient (the largest tensor's, at most) is alive at a time
        lines.append(Line("gradients", f"gradient of the largest tensor, {r.grad:g} B/param "
                          "(optimizer_in_bwd frees each after its step)", r.grad * largest,
                          "backward"))
    else:
        lines.append(Line("gradients", f"gradients, {r.grad:g} B/param"
                          f"{shard if r.shard_grads else ''}", g,
                          "both" if persistent else "grads"))
    if paged:
        lines.append(Line("optimizer", "optimizer states on the device: absmax per block of "
                          f"{optim.BNB_BLOCK} and tensors under "
                          f"{optim.BNB_PAGED_MIN_NUMEL:,} elements", o))
        lines.append(Line("optimizer", "optimizer states in managed memory (paged, "
                          f"cudaMallocManaged){shard if r.shard_optimizer else ''}", paged,
                          paged=True))
    else:
        lines.append(Line("optimizer", f"optimizer states, {r.optimizer:g} B/param"
                          f"{shard if r.shard_optimizer else ''}", o))
    blocks = [unit.get(i, 0.0) for i in range(job.n_blocks)] if job.arch else list(unit.values())
    sizes = {"trainable_local": sum(unit_grads.values()), "autocast": autocast,
             "unit": max(blocks, default=0.0),
             "unit_grads": max((unit_grads.get(i, 0.0) for i in range(job.n_blocks)),
                               default=0.0),
             "root": sum(v for k, v in unit.items() if k < 0 or k >= job.n_blocks),
             "root_grads": sum(v for k, v in unit_grads.items() if k < 0 or k >= job.n_blocks),
             # the embeddings (block -1) and the final norm with the output projection
             "tok_embeddings": unit.get(-1, 0.0), "tok_embeddings_grads": unit_grads.get(-1, 0.0),
             "output": unit.get(job.n_blocks, 0.0),
             "output_grads": unit_grads.get(job.n_blocks, 0.0),
             "all_units": sum(unit.values()),
             "largest_quantized": max((p.numel for p in job.params if p.quantized), default=0),
             "largest_trainable": largest}
    return tuple(lines), sizes


def _buffer_lines(job: Job, r: Recipe, strategy: str, dp: int, tp: int, sizes: dict[str, float],
                  *, gradient_as_bucket_view: bool, reshard_after_forward: bool,
                  zero_overlap_comm: bool = False, fetched: bool = False,
                  reduce_bucket_size: int | None = None,
                  optimizer_on_gpu: bool = True) -> list[Line]:
    """Buffers beside the states; ``fetched``: parameters live in host RAM and come to the GPU
    unit by unit even on one rank (offloaded ZeRO-3 / FSDP); ``optimizer_on_gpu``: the
    optimizer steps on the GPU (not DeepSpeed's CPU offload)."""
    e = job.activation_bytes
    mixed = job.precision in ("bf16", "fp16")  # fp32 master weights, 16-bit compute
    lines: list[Line] = []
    if strategy in ("ddp", "tp") and dp > 1 and not gradient_as_bucket_view:
        # DistributedDataParallel(gradient_as_bucket_view=False) is PyTorch's default (and HF
        # Trainer does not change it): the buckets are a second, gradient-sized flat buffer.
        lines.append(Line("other", "DDP bucket buffers (gradient-sized; gradient_as_bucket_view"
                          "=False, the PyTorch default)", sizes["trainable_local"] * r.grad))
    if strategy in ("ddp", "tp") and mixed and sizes["autocast"] and job.recipe.autocast:
        lines.append(Line("other", "autocast 16-bit copies of the trainable matmul weights",
                          sizes["autocast"], "backward"))
    if strategy in ("zero1", "zero2") and dp > 1:
        cap = reduce_bucket_size or ZERO_REDUCE_BUCKET_ELEMENTS
        n = min(cap, sizes["trainable_local"])
        # overlap_comm: a second IPG buffer, "double buffers to avoid data access conflict"
        # (stage_1_and_2.py backward(), contiguous_gradients=True, the default)
        buffers = 2 if zero_overlap_comm else 1
        lines.append(Line("other", f"ZeRO gradient reduce bucket (reduce_bucket_size "
                          f"{_elements(cap)})"
                          + (" x 2 (overlap_comm double buffer)" if buffers == 2 else ""),
                          buffers * n * r.grad, "backward"))
    if strategy == "zero3" and dp > 1:
        # contiguous_gradients (ZeRO-3's default) gathers each bucket's gradients into a buffer
        # of reduce_bucket_size elements made once at start-up (stage3.py: bucket.buffer =
        # torch.empty(self.reduce_bucket_size, ...)); Hugging Face's "auto" is hidden^2
        cap = reduce_bucket_size or job.hidden * job.hidden
        lines.append(Line("other", f"ZeRO-3 gradient bucket buffer (reduce_bucket_size "
                          f"{_elements(cap)}, contiguous_gradients)", cap * r.grad))
    if strategy.startswith("zero") and optimizer_on_gpu:
        # the step casts the partition's 16-bit gradients to fp32 for the fp32 master weights:
        # a flattened copy, then its fp32 cast (stage_1_and_2.py step():
        # flatten_dense_tensors_aligned(...).to(fp32); stage3.py _prepare_fp32_grad_for_sub_group,
        # one sub-group at a time); fp32 gradients are only flattened
        part = sizes["trainable_local"] / (dp if r.shard_optimizer else 1)
        if strategy == "zero3":
            part = min(part, ZERO3_SUB_GROUP_ELEMENTS)
        cast = 4 if r.grad != 4 else 0
        lines.append(Line("other", "DeepSpeed step: the partition's gradients flattened"
                          + (" and cast to fp32" if cast else "")
                          + (" (per sub-group of 1e9)" if strategy == "zero3" else ""),
                          part * (r.grad + cast), "step"))
    if strategy in ("zero3", "fsdp") and (dp > 1 or fetched):
        who = "FSDP" if strategy == "fsdp" else "ZeRO-3"
        if reshard_after_forward:
            # current unit + the prefetched next one (FSDP2 one-ahead prefetch; FSDP1
            # limit_all_gathers keeps two in flight; ZeRO-3's prefetch bucket is modelled alike)
            params = 2 * sizes["unit"]
            what = "2 units (current + prefetched)"
        else:
            params = sizes["all_units"] - sizes["root"]
            what = "all units (reshard_after_forward=False)"
        # a unit's 16-bit gradients in backward, and FSDP2's reduce-scatter input: every
        # unit's gradients are copied into one (in reduce_dtype: fp32 under mixed precision,
        # else the parameters' dtype), kept in comm_ctx.reduce_scatter_state until the next
        # unit's post_backward waits on it (_fsdp_param_group.py post_backward), so one is
        # alive beside the unit being computed. DeepSpeed reduces its own 16-bit buckets.
        rs_input = (4 if mixed else e) if strategy == "fsdp" else 0
        grads = sizes["unit_grads"] * (e + rs_input)
        lines.append(Line("other", f"{who} unsharded parameters in flight: {what}", params,
                          "backward"))
        lines.append(Line("other", f"{who} unsharded gradients of one unit"
                          + (f" + the previous unit's {rs_input} B reduce-scatter input"
                             if rs_input else ""), grads, "backward"))
        # root unit (embeddings, final norm, head): not resharded after forward, its 16-bit
        # gradients (the lm_head's come first) wait for the last reduce-scatter
        # DeepSpeed ZeRO-3 fetches and releases every module's parameters as it runs
        # (partitioned_param_coordinator.py fetch_sub_module / release_sub_module): it has no
        # root unit, the embeddings and the output projection come and go like a block
        own = (("tok_embeddings", "output") if strategy == "zero3"
               else tuple(job.training.custom_sharded_layers))
        root = sizes["root"] + sizes["root_grads"] * e
        rest = [k for k in ("tok_embeddings", "output") if k not in own]
        root -= sum(sizes[k] + sizes[f"{k}_grads"] * e for k in own)
        if root > 0:
            lines.append(Line("other", f"{who} root unit ({', '.join(rest) or 'final norm'}) "
                              "unsharded with its gradients", root, "backward"))
        if own:
            # a unit of its own (torchtune custom_sharded_layers) is freed after forward and
            # gathered in backward with its gradients, in place of a block: the output
            # projection when backward starts, the embeddings when it ends
            big = max(sizes[k] + sizes[f"{k}_grads"] * (e + rs_input) for k in own)
            if big > sizes["unit"] + grads:
                lines.append(Line("other", f"{who} {' and '.join(own)} unit(s) of their own: "
                                  "the largest with its gradients in place of a block's",
                                  big - sizes["unit"] - grads, "backward"))
    if job.finetune == "qlora" and sizes["largest_quantized"]:
        lines.append(Line("other", "QLoRA dequantised weight of the largest layer",
                          sizes["largest_quantized"] / tp * e, "backward"))
    temporary = optim.states(job.optimizer, job.recipe.optimizer_impl,
                             job.grad_bytes).step_temporary_per_param
    if temporary and not strategy.startswith("zero"):  # DeepSpeed's optimizers are fused
        if job.recipe.optimizer_in_bwd:  # one optimizer per tensor, stepped in backward
            lines.append(Line("other", "optimizer step: foreach AdamW denominator of the "
                              "largest tensor", temporary * sizes["largest_trainable"],
                              "backward"))
        else:
            local = sizes["trainable_local"] / (dp if r.shard_optimizer else 1)
            lines.append(Line("other", "optimizer step: foreach AdamW denominator temporaries",
                              temporary * local, "step"))
    return lines


def _reserve_lines(dp: int, tp: int, nccl_channels: int, pp: int = 1) -> list[Line]:
    """Memory outside PyTorch's caching allocator: CUDA context, cuBLAS, NCCL."""
    lines = [Line("other", "reserve: CUDA context and kernels", CUDA_CONTEXT_BYTES,
                  pool="driver"),
             # PyTorch allocates cuBLAS workspaces through its caching allocator
             Line("other", "reserve: cuBLAS workspace", CUBLAS_WORKSPACE_BYTES)]
    communicators = (dp > 1) + (tp > 1) + (pp > 1)  # a pipeline's p2p communicator too
    if communicators:
        lines.append(Line("other", f"reserve: NCCL buffers, {communicators} communicator(s) x "
                          f"{nccl_channels} channels", communicators * nccl_channels
                          * NCCL_CONNECTIONS_PER_CHANNEL * NCCL_BYTES_PER_CONNECTION,
                          pool="driver"))
    return lines


def _elements(n: int) -> str:
    """DeepSpeed's way of writing a bucket size: 5e8, else the count with separators."""
    digits = len(str(n)) - 1
    return f"{n // 10**digits}e{digits}" if digits >= 3 and n % 10**digits == 0 else f"{n:,}"


def estimate(job: Job, gpu: GPU, strategy: str, *, world: int, tp: int = 1,
             micro_batch: int | None = None, sequence_parallel: bool = False,
             flash_attention: bool | None = None, gradient_as_bucket_view: bool = False,
             reshard_after_forward: bool = True, zero_overlap_comm: bool = False,
             nccl_channels: int = NCCL_DEFAULT_CHANNELS,
             stage: StageShare | None = None, offload: str = "none",
             host_capacity_bytes: int = 0, reduce_bucket_size: int | None = None
             ) -> MemoryReport:
    """Memory of one rank. ``strategy`` is the data-parallel scheme over world / tp ranks
    ("tp" alone: DDP over the remaining ranks, or none when tp == world); under pipeline
    parallelism ``stage`` says what this rank's stage holds (dp = world / (tp x pp))."""
    pp = stage.pp if stage is not None else 1
    if strategy == "tp" and tp == 1:
        tp = world // pp
    _check(job, strategy, world // pp, tp)
    dp = world // tp // pp
    b = micro_batch or job.micro_batch
    r = recipe(strategy, job.precision, job.optimizer, job.recipe.optimizer_impl,
               job.recipe.amp_o2)
    states, sizes = _state_lines(job, r, strategy, dp, tp, stage)
    # the forward sees FSDP's unsharded weights in its param_dtype, the others' as they are held
    head_weight = job.activation_bytes if strategy == "fsdp" else r.weight
    lines = states + activation_lines(job, b, tp, sequence_parallel and tp > 1, flash_attention,
                                      stage, head_weight_bytes=head_weight)
    lines += _buffer_lines(job, r, strategy, dp, tp, sizes,
                           gradient_as_bucket_view=gradient_as_bucket_view,
                           reshard_after_forward=reshard_after_forward,
                           zero_overlap_comm=zero_overlap_comm, fetched=offload == "params",
                           reduce_bucket_size=reduce_bucket_size,
                           optimizer_on_gpu=offload == "none")
    if job.ep > 1 and job.arch is not None and job.arch.moe is not None:
        # the all-to-all's send and receive buffers of one MoE block's routed rows (Megatron's
        # dispatcher keeps the permuted input and the received rows while the block runs)
        from simulator.job.moe import rank_load

        rows = b * job.seq_len * job.arch.moe.top_k * rank_load(
            job.arch.moe, job.ep, job.training.expert_imbalance)
        lines.append(Line("other", f"expert parallelism over {job.ep} ranks: all-to-all send "
                          "and receive buffers of one MoE block's routed rows",
                          2 * rows * job.hidden * job.activation_bytes, "backward"))
    if offload != "none":  # host.py: what moves to host RAM
        lines = host_memory.offload_lines(lines, job, strategy, offload, dp, tp)
    tensors, driver = lines, _reserve_lines(dp, tp, nccl_channels, pp)
    # a job built as fsdp_qlora builds it: its allocator replayed (step_replay.py)
    room = gpu.memory_bytes - sum(x.bytes for x in driver)  # what cudaMalloc can take
    replay = (step_replay.replay(job, strategy, dp, b, offload=offload == "params",
                                 capacity=room) if stage is None and tp == 1 else None)
    replayed = replay.reserved if replay else None
    lines = tensors + cache_lines(tensors, job, b, tp, stage, replayed=replayed) + driver
    notes = [f"recipe: {r.description}",
             "peak = the largest moment of the step: the loss's backward (activations and "
             "logits), a block's backward (activations and its recompute), the end of backward "
             "(every gradient), the optimizer step"]
    if any(x.phase == "grads" for x in lines):
        notes.append("gradients are created during backward: optimizer.zero_grad() sets them "
                     "to None by default (PyTorch >= 2.0)")
    if strategy in ("ddp", "tp") and dp == 1:
        notes.append("one data-parallel rank: no DDP wrapper, no bucket buffers")
    if job.recipe.optimizer_in_bwd:
        notes.append("optimizer_in_bwd: each tensor's optimizer step runs in backward as its "
                     "gradient is ready, and frees that gradient")
    if any(x.paged for x in lines):
        notes.append("paged optimizer: states in CUDA managed memory are not in the verdict; "
                     "what the peak leaves free holds some, the rest lives in host RAM and "
                     "pages over the host link each step")
    setup = (replay.setup.reserved, replay.setup.allocated) if replay else None
    parameters, trainable = _parameter_counts(job)
    report = MemoryReport(strategy=strategy, world=world, tp=tp, dp=dp, micro_batch=b,
                          seq_len=job.seq_len, checkpointing=job.checkpointing,
                          parameters=parameters, trainable_parameters=trainable,
                          capacity_bytes=gpu.memory_bytes, lines=tuple(lines),
                          notes=tuple(notes), host_capacity_bytes=host_capacity_bytes,
                          offload=offload, setup=setup,
                          reserved_streams=tuple(replay.streams.items()) if replay else ())
    if replayed is not None:  # the replay's own spread on published peaks (step_replay.py)
        peak = report.peak_as("reserved")
        top = min(peak * (1 + step_replay.SPREAD), max(gpu.memory_bytes, peak))  # the card's
        return replace(report, reserved_replayed=True,
                       reserved_range=(int(peak * (1 - step_replay.SPREAD)), int(top)))
    # the reserved counter again at the middle half of the published overheads (allocator.py)
    ends = [replace(report, lines=tuple(tensors + cache_lines(tensors, job, b, tp, stage, q)
                                        + driver)).peak_as("reserved")
            for q in OVERHEAD_MIDDLE_HALF[job.recipe.expandable_segments]]
    return replace(report, reserved_range=(min(ends), max(ends)))
