"""Activation memory of one rank: the blocks' saved tensors, the recompute working set, the loss.

Per block, the bytes per token come from simulator/job/checkpointing.py (the kernel regime's
saved tensors under the checkpointing mode); the head keeps the final norm's input and the LM
head's input; the loss keeps what simulator/job/loss.py says its variant saves, and while the
loss's backward runs (the first thing backward does, every activation still alive) its
temporaries come on top. The blocks' saved tensors are alive through backward
(``phase="backward"``), the head's and the loss's only until the head's backward (``"loss"``),
a block's recompute only during that block's backward (``"recompute"``), the model output a
training loop keeps (``training.keeps_output``) to the end of the step (``"output"``):
report.py MOMENTS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.errors import InputError
from simulator.job import checkpointing as ckpt
from simulator.job import loss
from simulator.job.parameters import QA_LABELS
from simulator.job.workload import Job

# The working set of the layer being recomputed (full/op checkpointing): alive only while
# backward runs, one layer at a time; the memory curve draws it so (outputs/plots.py).
RECOMPUTED_LAYER = "one layer recomputed during backward"

if TYPE_CHECKING:
    from simulator.memory.estimate import Line


@dataclass(frozen=True)
class StageShare:
    """What one pipeline stage holds (strategies/pipeline_layout.py): its blocks, and the
    activations alive at once under its schedule (the first stage of 1F1B holds p
    micro-batches')."""

    pp: int
    blocks: frozenset[int]
    layers_in_flight: int  # layer-micro-batches whose activations are alive at once
    heads_in_flight: int  # micro-batches whose logits and loss are alive (the last stage)


def activations_per_token(job: Job, *, tp: int = 1, sequence_parallel: bool = False,
                          flash_attention: bool | None = None,
                          checkpointing: str | None = None) -> tuple[float, float]:
    """Activation bytes per token of one transformer layer: (stored, working set).

    *stored* is what a layer keeps for backward under the checkpointing mode; *working set* is
    one layer's full activations, held while that layer is recomputed (``full`` and ``op``).
    Under the ``fused`` kernels with a GELU MLP, dropout and eager attention this is exactly
    Korthikanti et al. 2022 (arXiv:2205.05198) table 2: s b h (34 + 5as/h).
    """
    if job.arch is None:
        raise InputError("per-layer activations need a transformer `model`")
    return ckpt.per_token(job, tp=tp, sequence_parallel=sequence_parallel,
                          flash=flash_attention, mode=checkpointing)


def activation_lines(job: Job, b: int, tp: int, sp: bool, flash: bool | None,
                     stage: StageShare | None = None, *, head_weight_bytes: float) -> list[Line]:
    """``head_weight_bytes``: bytes per element of the LM head's weight as the forward sees it
    (the fused linear cross-entropy's weight gradient is allocated like it)."""
    from simulator.memory.report import Line

    if job.arch is None:  # generic layer list: the given per-sample bytes
        total = sum(layer.activation_bytes_per_sample for layer in job.generic_layers) * b
        return [Line("activations", f"activations of {job.n_blocks} layers (as given, "
                     f"micro-batch {b}, checkpointing not modelled)", total, "backward")]
    a, s, e, mode = job.arch, job.seq_len, job.activation_bytes, job.checkpointing
    tokens = b * s
    stored, working = activations_per_token(job, tp=tp, sequence_parallel=sp,
                                            flash_attention=flash)
    if flash is None:
        flash = job.flash_attention
    attn = "flash attention" if flash else "eager attention (s x s scores)"
    layers = a.layers if stage is None else stage.layers_in_flight
    what = (f"{a.layers} layers" if stage is None else
            f"{layers} layer-micro-batches in flight (pipeline stage)")
    lines = [Line("activations", f"{what}, checkpointing {mode}, {job.kernels} kernels, {attn}, "
                  f"{tokens} tokens", stored * tokens * layers, "backward")]
    if working and layers:  # during its own block's backward only (not beside the logits)
        lines.append(Line("activations", RECOMPUTED_LAYER,
                          working * tokens, "recompute"))
    head = 2 * a.hidden * e / (tp if sp else 1)  # final-norm input and lm_head input
    width = QA_LABELS if a.encoder else a.vocab / tp  # vocab-parallel logits under TP
    ce = loss.cross_entropy(job.recipe.cross_entropy, 1.0, e, compiled=job.recipe.loss_compiled)
    logits = width * (ce.saved_per_logit + ce.backward_peak_per_logit)
    what = (f"task head input and logits ({QA_LABELS} per token)" if a.encoder else
            f"final norm and LM head inputs; {job.recipe.cross_entropy} cross-entropy: "
            f"{ce.saved_per_logit:g} B saved + {ce.backward_peak_per_logit:g} B in its "
            f"backward per logit (vocab {a.vocab})")
    heads = 1 if stage is None else stage.heads_in_flight
    if heads:
        lines.append(Line("activations", what + (f" x {heads} micro-batches" if heads > 1
                                                 else ""), (head + logits) * tokens * heads,
                          "loss"))
    held = job.output_logit_bytes
    if heads and held and not a.encoder:  # the loop's `output` holds them to the step's end
        lines.append(Line("activations", f"the model output's logits, kept by the training "
                          f"loop until after the step: {held:g} B per logit",
                          width * held * tokens * heads, "output"))
    if heads and job.recipe.cross_entropy == "fused-linear" and not a.encoder:
        # Liger's forward saves the head weight's gradient (zeros_like(weight): the weight's
        # dtype) beside the input's; the input's takes the place of the saved head input
        lines.append(Line("activations", "fused linear cross-entropy: the LM head weight's "
                          "gradient, computed in forward", width * a.hidden * head_weight_bytes
                          * heads, "loss"))
    return lines
