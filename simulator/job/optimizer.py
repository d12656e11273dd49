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
- SGD with momentum (torch/optim/sgd.py ``_multi_tensor_sgd``): ``_foreach_mul_`` and
  ``_foreach_add_`` on the momentum buffer, ``_foreach_add_`` on the weights: 8 passes.
Gradient clipping (``clip_grad_norm_(foreach=True)``: ``_foreach_norm`` then ``_foreach_mul_``)
reads the gradients twice and writes them once when the framework clips by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.job.kernels import FP32, Kernel, memory

OPTIMIZERS = ("adamw", "adamw-8bit", "sgd")
IMPLEMENTATIONS = ("foreach", "fused", "loop")
BNB_BLOCK = 256  # bitsandbytes 8-bit optimizer block size


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
    if optimizer == "adamw-8bit":
        return OptimizerStates(2 + 2 * FP32 / BNB_BLOCK,
                               "AdamW 8-bit m and v (bitsandbytes, block-wise scales)", 0.0)
    if optimizer == "sgd":
        return OptimizerStates(state_bytes, "SGD momentum", 0.0)
    temporary = state_bytes if implementation == "foreach" else 0.0
    return OptimizerStates(2 * state_bytes, "Adam m and v", temporary)


def step_kernels(optimizer: str, implementation: str, n: float, p: int, s: int, *,
                 clip: bool, tensors: int) -> list[Kernel]:
    """The optimizer step over ``n`` parameters held in ``tensors`` tensors."""
    out: list[Kernel] = []
    if clip:
        out += [memory(n * p, n, "foreach_norm"), memory(2 * n * p, n, "foreach_mul.clip")]
    if optimizer == "adamw-8bit":
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
