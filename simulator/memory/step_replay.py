"""The reserved memory of training steps that follow FSDP1's wrap, replayed through the caching
allocator (caching_allocator.py) after the wrap (fsdp_wrap.py), as a loop that resets the peak
counters after the wrap reports it (AnswerDotAI/fsdp_qlora train.py:
``torch.cuda.reset_peak_memory_stats`` before the epoch, ``max_memory_reserved`` after).

Three steps run, so the peak includes what each step leaves cached for the next; the figure
at each moment of the report (report.py MOMENTS) is ``max_memory_reserved`` as it stands at
that moment of the last step. The tensors are the
ones the memory lines count, each allocated and freed where the step makes and drops it, and
the temporaries of the layers that dominate them:

- FSDP1 all-gathers each unit into a buffer on its unshard stream (a pool of its own: the
  compute stream's cached blocks never serve it). A unit's buffer, freed after its forward (or
  backward), comes back to the pool only once the GPU is past that work; with
  ``limit_all_gathers`` the CPU, running ahead, waits before each all-gather for the oldest of
  the two frees in flight (_runtime_utils.py ``_unshard``, ``_FreeEventQueue``), so a new
  unit's buffer can reuse the one freed two units before, not the last. A layer's own unit
  runs before its adapters' (its pre-forward hook fires first) and is freed after them. The
  root unit stays gathered from the forward to the end of backward (_runtime_utils.py: the
  root is not resharded after forward). With CPU offload the unit's shard is first copied to
  the GPU on the same stream. NO_SHARD gathers nothing.
- Forward under full checkpointing (torch.utils.checkpoint, no grad inside): each layer keeps
  its input; its MLP's gate and up outputs, the activation and the product come and go
  (transformers models/llama/modeling_llama.py LlamaMLP), as do PEFT's dropout copy of a LoRA
  layer's input (peft/tuners/lora/layer.py Linear.forward) and QLoRA's dequantised weights
  (bitsandbytes MatMul4Bit: one per layer, freed after its GEMM).
- The head: the LM head's logits, the fp32 copy (in the model's forward under transformers <
  4.46, else in the loss), the shifted contiguous copy and log_softmax's saved output; the loss's
  backward: nll's zero-filled gradient, log_softmax_backward's output, the slice's zero-padded
  gradient and the cast back (loss.py).
- Backward, layer by layer from the last: the layer's forward again with its saved tensors
  (checkpointing.saved_tensors), the gradients of the MLP's three ffn-wide tensors and of q, k
  and v, the dequantised weights again (MatMul4Bit.backward), the input gradient; then the
  saved tensors and the layer's input are freed.
- FSDP1's unsharded gradient of each unit with trainable weights, until its reduce-scatter
  (on the post-backward stream) has run; the trainable parameters' gradients, and Adam's two
  states created by the first step (on the host under CPU offload: FSDP1 moves the reduced
  gradient there and the optimizer steps there).

What it leaves out: the kernels' own workspaces and the smaller temporaries of norms, rotary
and attention.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simulator.job import checkpointing as ckpt
from simulator.job.modules import ParamTensor
from simulator.job.workload import Job
from simulator.memo import IdentityMemo
from simulator.memory import fsdp_wrap
from simulator.memory.caching_allocator import CachingAllocator

STEPS = 3  # steps replayed: each leaves the next its cache
IN_FLIGHT = 2  # torch/distributed/fsdp/_limiter_utils.py _max_num_inflight_all_gathers
# The range the reserved counter carries: 10% either side, the span of the replay's errors on
# fsdp_qlora's seventeen published reserved peaks (-9.0% to +9.3%: validation/frameworks.yaml,
# offload.yaml; 15 of them low, as the temporaries it leaves out would make them)
SPREAD = 0.10
LONG = 8  # bytes of an int64 (input ids, labels)


@dataclass
class _Trace:
    """Named tensors over the allocator."""

    alloc: CachingAllocator
    held: dict[str, int] = field(default_factory=dict)

    def make(self, name: str, nbytes: float, stream: str = "default") -> None:
        self.held[name] = self.alloc.malloc(int(nbytes), stream)

    def drop(self, *names: str) -> None:
        for name in names:
            if name in self.held:
                self.alloc.free(self.held.pop(name))


@dataclass(frozen=True)
class Replay:
    """Rank 0's allocator after the wrap, and through the steps where they are replayed."""

    setup: fsdp_wrap.WrapMemory
    # torch.cuda.max_memory_reserved at each moment (report.py MOMENTS) of the last step,
    # counted from after the wrap; None where the step is not replayed
    reserved: dict[str, int] | None
    # what each stream's pool holds after the steps: "default" (compute), "unshard" (FSDP's
    # all-gathers), "post_backward" (its reduce-scatters)
    streams: dict[str, int] = field(default_factory=dict)


def _steps_apply(job: Job) -> bool:
    """fsdp_qlora's kind of step: a decoder, full checkpointing, an eager fp32 cross-entropy."""
    return (job.arch is not None and not job.arch.encoder and job.checkpointing == "full"
            and job.recipe.cross_entropy == "fp32" and not job.recipe.loss_compiled)


_REPLAYS: IdentityMemo[Replay] = IdentityMemo(limit=64)  # a range's re-runs ask again


def replay(job: Job, strategy: str, ranks: int, micro_batch: int, *, offload: bool,
           capacity: float) -> Replay | None:
    """The wrap and STEPS steps on rank 0's allocator, for a job built with
    ``sync_module_states`` under ``fsdp`` (FULL_SHARD) or ``ddp`` (NO_SHARD) over ``ranks``;
    ``capacity``: what cudaMalloc can take on the card. None for any other job."""
    if not (job.training.sync_module_states and strategy in ("fsdp", "ddp")
            and len(job.params) <= fsdp_wrap.MAX_TENSORS):
        return None
    return _REPLAYS.get((job,), (strategy, ranks, micro_batch, offload, capacity),
                        lambda: _replayed(job, strategy, ranks, micro_batch, offload=offload,
                                          capacity=capacity))


def _replayed(job: Job, strategy: str, ranks: int, micro_batch: int, *, offload: bool,
              capacity: float) -> Replay:
    sharded = strategy == "fsdp" and ranks > 1
    alloc = CachingAllocator(capacity=capacity)
    fsdp_wrap.build(alloc, job, ranks, sharded=sharded, offload=offload)
    setup = fsdp_wrap.WrapMemory(alloc.reserved, alloc.allocated)
    if not _steps_apply(job):
        return Replay(setup, None)
    alloc.reset_peak()
    t = _Trace(alloc)
    moments: dict[str, int] = {}
    layout = _Layout.of(job)
    for step in range(STEPS):
        _step(t, job, layout, ranks, micro_batch, sharded=sharded, offload=offload,
              first=step == 0, moments=moments)
    return Replay(setup, moments, alloc.reserved_by_stream())


@dataclass(frozen=True)
class _Layout:
    """What every step reads of the job, worked out once."""

    layers: list[list[list[ParamTensor]]]  # each decoder layer's units, in the order they run
    root: list[ParamTensor]  # the root unit's parameters (embeddings, final norm, head)
    saved_per_token: list[float]  # a checkpointed layer's saved tensors, bytes per token
    dequantised: list[float]  # a layer's 4-bit weights as MatMul4Bit makes them, in 16 bits
    lora: bool  # a layer has adapters (PEFT's dropout copies of their inputs)

    @classmethod
    def of(cls, job: Job) -> _Layout:
        e = job.activation_bytes
        units = fsdp_wrap.units(job)
        by_layer: dict[int, list[list[ParamTensor]]] = {}
        for unit in units[:-1]:
            by_layer.setdefault(unit[0].block, []).append(unit)
        return cls(
            # the layer's own unit runs first (its pre-forward hook fires before its
            # children's), the adapters' after it
            layers=[own[-1:] + own[:-1] for own in by_layer.values()], root=units[-1],
            saved_per_token=[per_token for per_token, _ in ckpt.saved_tensors(job).values()],
            dequantised=[p.numel * e for p in job.params if p.quantized and p.block == 0],
            lora=any(p.trainable for p in job.params if p.block == 0))


def _step(t: _Trace, job: Job, layout: _Layout, ranks: int, b: int, *, sharded: bool,
          offload: bool, first: bool, moments: dict[str, int]) -> None:
    a, e = job.arch, job.activation_bytes
    assert a is not None
    tokens = b * job.seq_len
    h, f, logits = tokens * a.hidden * e, tokens * a.ffn_hidden * e, tokens * a.vocab
    layers, root, saved = layout.layers, layout.root, layout.saved_per_token

    def gather(name: str, unit: list[ParamTensor]) -> None:
        if len(resharded) >= IN_FLIGHT:  # the rate limiter waits for the oldest free
            t.alloc.free(resharded.popleft())
        full = sum(fsdp_wrap.tensor_bytes(p, e) for p in unit)
        if offload:  # the shard's copy to the GPU, then the all-gather from it
            t.make(f"{name}.local", full / ranks, "unshard")
        if sharded or offload:
            t.make(name, full, "unshard")
        t.drop(f"{name}.local")

    def reshard(*names: str) -> None:  # freed, but reusable only once the GPU is past it
        resharded.extend(t.held.pop(name) for name in names if name in t.held)

    def dequantise() -> None:  # MatMul4Bit: each 4-bit weight in 16 bits for its GEMM
        for nbytes in layout.dequantised:
            t.make("dequantised", nbytes)
            t.drop("dequantised")

    resharded: deque[int] = deque()  # the allocator's handles of buffers freed in flight
    t.make("input_ids", tokens * LONG)
    t.make("labels", tokens * LONG)
    gather("root", root)
    t.make("x0", h)  # the embeddings' output: the first layer's checkpointed input
    for i, units in enumerate(layers):  # forward, no grad inside each checkpointed layer
        for j, unit in enumerate(units):
            gather(f"u{i}.{j}", unit)
        t.make("gate", f)
        t.make("up", f)
        t.make("act", f)
        t.drop("gate")
        t.make("product", f)
        t.drop("up", "act")
        if layout.lora:  # the dropout copy of the down projection's input, with its mask
            t.make("dropped", f * (e + 1) / e)
        dequantise()
        t.drop("dropped", "product")
        t.make(f"x{i + 1}", h)
        reshard(*(f"u{i}.{j}" for j in [*range(1, len(units)), 0]))  # the layer's last
    head = job.output_logit_bytes  # 4: the model's forward upcast them (transformers < 4.46)
    t.make("norm_out", h)
    t.make("logits16", logits * e)
    t.make("logits32", logits * 4)
    if head != 4:
        t.drop("logits16")
    t.make("shifted", logits * 4)  # logits[..., :-1, :].contiguous()
    t.make("log_probs", logits * 4)
    t.drop("shifted")
    if head == 4:
        t.drop("logits16")
    t.make("nll_grad", logits * 4)
    t.make("log_softmax_grad", logits * 4)
    moments["loss_backward"] = t.alloc.peak_reserved
    t.drop("nll_grad", "log_probs")
    t.make("slice_grad", logits * 4)
    t.drop("log_softmax_grad")
    t.make("logits_grad", logits * e)
    t.drop("slice_grad")
    t.make("grad", h)
    t.drop("logits_grad", "norm_out")
    if not head:  # the loop drops its output before backward
        t.drop("logits32")
    for i in reversed(range(len(layers))):
        for j, unit in enumerate(layers[i]):
            gather(f"u{i}.{j}", unit)
        for k, per_token in enumerate(saved):  # the layer's forward again
            t.make(f"saved{k}", per_token * tokens)
        for name in ("grad_product", "grad_up", "grad_gate"):
            t.make(name, f)
        dequantise()
        t.drop("grad_product", "grad_up", "grad_gate")
        for name in ("grad_q", "grad_k", "grad_v"):
            t.make(name, h)
        t.drop("grad_q", "grad_k", "grad_v")
        to_reduce = sum(p.numel * e for unit in layers[i] for p in unit if p.trainable)
        if sharded and to_reduce:  # FSDP1's unsharded gradient, until its reduce-scatter
            t.make("unsharded_grad", to_reduce)
            t.make("reduced_grad", to_reduce / ranks, "post_backward")
            t.drop("unsharded_grad", "reduced_grad")
        if i == 0:  # the first block's backward
            moments["backward"] = t.alloc.peak_reserved
        t.make("grad_in", h)
        t.drop(*(f"saved{k}" for k in range(len(saved))), "grad", f"x{i + 1}")
        t.held["grad"] = t.held.pop("grad_in")
        reshard(*(f"u{i}.{j}" for j in [*range(1, len(layers[i])), 0]))
    t.drop("grad", "x0", "root", "input_ids", "labels")
    while resharded:  # loss.item() waits for the GPU: every free has landed
        t.alloc.free(resharded.popleft())
    trainable = [p.numel * e / (ranks if sharded else 1) for p in job.params if p.trainable]
    on_gpu = first and not offload  # CPU offload keeps .grad and the optimizer on the host
    if on_gpu:  # gradients, kept as .grad, and Adam's states made by the first step
        for k, nbytes in enumerate(trainable):
            t.make(f"param_grad{k}", nbytes)
    moments["backward_end"] = t.alloc.peak_reserved
    if on_gpu:
        for k, nbytes in enumerate(trainable):
            t.make(f"exp_avg{k}", nbytes)
            t.make(f"exp_avg_sq{k}", nbytes)
    moments["step"] = t.alloc.peak_reserved
    t.drop("logits32")  # the loop's `output = None` after the step
