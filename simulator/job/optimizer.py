"""The optimizer step: its kernels (bytes per parameter) and the states it keeps.

Per trainable parameter, with p bytes per weight and gradient (4 under mixed precision: the
master weights are fp32; 2 under pure bf16) and s bytes per state element:
- AdamW, ``foreach`` (torch/optim/adam.py ``_multi_tensor_adam``, the CUDA default when
  ``fused`` is not asked for): ``_foreach_mul_`` (decoupled decay: read and write p),
  ``_foreach_lerp_`` (m from g), ``_foreach_mul_`` and ``_foreach_addcmul_`` (v from g, g),
  ``_foreach_sqrt``, ``_foreach_div_``, ``_foreach_add_`` (the denominator, a temporary the
  size of v), ``_foreach_addcdiv_`` (p from m and the denominator): 21 element passes.
- AdamW, ``fused`` (``torch._fused_adamw_``, the kernel ``fused=True`` selects; apex and
  Transformer Engine FusedAdam alike): reads p, g, m, v and writes p, m, v once.
- AdamW, ``loop`` (Composer DecoupledAdamW ``adamw``: per tensor ``mul_``, ``add_``, ``mul_``,
  ``addcmul_``, ``sqrt``, ``div``, ``add_``, ``addcdiv_`` and the decay ``mul_``): 23 element
  passes, a launch per op per tensor.
- AdamW 8-bit (bitsandbytes ``optimizer_update_8bit_blockwise``): one kernel over p, g and
  1-byte m and v with an fp32 scale per block of 256 (bitsandbytes optim/optimizer.py
  Optimizer8bit, ``block_wise=True``).
- Paged AdamW (bitsandbytes ``PagedAdamW8bit`` / ``PagedAdamW``, ``is_paged=True``): the same
  update kernels (8-bit block-wise; 32-bit ``optimizer_update_32bit`` over fp32 m and v, the
  dtype ``Optimizer2State.init_state`` gives 32-bit states whatever the weights' dtype), but
  the states of every tensor of at least 1e5 elements live in CUDA managed memory
  (``get_state_buffer``: ``F.get_paged`` -> ``cudaMallocManaged``); smaller tensors' states and
  the block-wise absmax stay ordinary device tensors. ``paged_state_split`` says which is which.
- SGD with momentum (torch/optim/sgd.py ``_multi_tensor_sgd``): ``_foreach_mul_`` and
  ``_foreach_add_`` on the momentum buffer, ``_foreach_add_`` on the weights: 8 passes.
Gradient clipping (``clip_grad_norm_(foreach=True)``: ``_foreach_norm`` then ``_foreach_mul_``)
reads the gradients twice and writes them once when the framework clips by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.job.kernels import FP32, Kernel, memory

OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "sgd")
PAGED = ("paged-adamw-8bit", "paged-adamw")
IMPLEMENTATIONS = ("foreach", "fused", "loop")
BNB_BLOCK = 256  # bitsandbytes 8-bit optimizer block size
# bitsandbytes optim/optimizer.py get_state_buffer: "if not self.is_paged or p.numel() < 1e5"
# the state is a plain device tensor, else a paged (managed) one
BNB_PAGED_MIN_NUMEL = 100_000
BNB_32BIT_STATE = 4  # Optimizer2State.init_state: get_state_buffer(p, dtype=torch.float32)


@dataclass(frozen=True)
class OptimizerStates:
    """What the optimizer keeps per trainable parameter."""

    bytes_per_param: float
    description: str
    step_temporary_per_param: float  # the foreach denominator, alive during the step only


def states(optimizer: str, implementation: str, state_bytes: int) -> OptimizerStates:
    """State bytes per parameter; ``foreach`` AdamW also holds its denominator (one state's
    size) for the whole step: torch.optim's docs, foreach "uses ~ sizeof(params) more peak
    memory than the for-loop version"."""
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        paged = "paged " if optimizer == "paged-adamw-8bit" else ""
        return OptimizerStates(2 + 2 * FP32 / BNB_BLOCK,
                               f"{paged}AdamW 8-bit m and v (bitsandbytes, block-wise scales)",
                               0.0)
    if optimizer == "paged-adamw":
        return OptimizerStates(2 * BNB_32BIT_STATE, "paged AdamW fp32 m and v (bitsandbytes)",
                               0.0)
    if optimizer == "sgd":
        return OptimizerStates(state_bytes, "SGD momentum", 0.0)
    temporary = state_bytes if implementation == "foreach" else 0.0
    return OptimizerStates(2 * state_bytes, "Adam m and v", temporary)


def paged_state_split(optimizer: str, numel: int, per_param: float) -> tuple[float, float]:
    """(device bytes, managed-memory bytes) of one tensor's ``per_param`` optimizer bytes: under
    a paged optimizer a tensor of at least BNB_PAGED_MIN_NUMEL elements pages m and v (1 byte
    each in 8-bit, 4 in 32-bit) and keeps its fp32 absmax per block of 256 on the device
    (init_state allocates absmax1/absmax2 with torch.zeros on p.device); a smaller one, and
    every tensor of another optimizer, keeps everything there."""
    if optimizer not in PAGED or numel < BNB_PAGED_MIN_NUMEL:
        return per_param * numel, 0.0
    if optimizer == "paged-adamw":
        return 0.0, 2.0 * BNB_32BIT_STATE * numel
    return 2 * FP32 / BNB_BLOCK * numel, 2.0 * numel


def step_kernels(optimizer: str, implementation: str, n: float, p: int, s: int, *,
                 clip: bool, tensors: int) -> list[Kernel]:
    """The optimizer step over ``n`` parameters held in ``tensors`` tensors."""
    out: list[Kernel] = []
    if clip:
        out += [memory(n * p, n, "foreach_norm"), memory(2 * n * p, n, "foreach_mul.clip")]
    if optimizer == "paged-adamw":  # bitsandbytes optimizer_update_32bit: one kernel
        out.append(memory(n * (2 * p + p + 4 * BNB_32BIT_STATE), 12 * n, "optimizer_update_32bit"))
        return out
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        state = 1 + FP32 / BNB_BLOCK
        out.append(memory(n * (2 * p + p + 4 * state), 12 * n, "optimizer_update_8bit_blockwise"))
        return out
    if optimizer == "sgd":
        passes = [("foreach_mul.momentum", 2 * s), ("foreach_add.momentum", 2 * s + p),
                  ("foreach_add.weights", 2 * p + s)]
        out += [memory(n * b, n, name) for name, b in passes]
        return out
    if implementation == "fused":
        out.append(memory(n * (2 * p + p + 4 * s), 12 * n, "fused_adamw"))
        return out
    passes = [("mul.decay", 2 * p), ("lerp.exp_avg", 2 * s + p), ("mul.exp_avg_sq", 2 * s),
              ("addcmul.exp_avg_sq", 2 * s + 2 * p), ("sqrt", 2 * s), ("div", 2 * s),
              ("add.eps", 2 * s), ("addcdiv.weights", 2 * p + 2 * s)]
    if implementation == "loop":  # Composer: a second mul for the decay, per-tensor launches
        passes.append(("mul.exp_avg", 2 * s))
        return out + [memory(n * b / tensors, n / tensors, name)
                      for name, b in passes for _ in range(tensors)]
    return out + [memory(n * b, n, f"foreach_{name}") for name, b in passes]
