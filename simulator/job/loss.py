"""Cross-entropy over the logits as the frameworks compute it: kernels and memory.

Four variants (``training.cross_entropy``), each per element of the (tokens x vocab) logits:
- ``fp32``: ``F.cross_entropy(logits.float(), labels)`` (transformers loss_utils.py
  ForCausalLMLoss, torchtitan train.py loss_fn, torchtune's CrossEntropyLoss on the decoder's
  ``self.output(h).float()``): an fp32 copy of the logits, log_softmax (aten
  cunn_SoftMaxForward: a max pass, a sum pass and an output pass over a 128K-wide row that does
  not fit in shared memory), nll_loss. Saved: the fp32 log-probabilities. Backward: nll_loss's
  zero-filled fp32 gradient, log_softmax_backward (a sum pass and an output pass), the cast
  back. While log_softmax_backward runs, its output, input gradient and saved log-probabilities
  are alive at once: 12 bytes per logit.
- ``chunked``: torchtune modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss: the
  decoder returns its logits in 8 chunks (``chunked_output``) and each chunk is upcast and
  reduced on its own, so only one chunk's fp32 temporaries exist at a time.
- ``fused``: one kernel that reads the 16-bit logits, computes the loss with an online softmax,
  and writes the gradient into the logits buffer in backward (flash-attn
  flash_attn/losses/cross_entropy.py with ``inplace_backward=True``, as llm-foundry's
  ``fused_crossentropy`` uses it; Liger's LigerCrossEntropyLoss and Transformer Engine alike):
  no fp32 tensor.
- ``fused-linear``: the LM head's GEMM and the loss in one (Liger-Kernel
  ops/fused_linear_cross_entropy.py, LigerFusedLinearCrossEntropy, which LLaMA-Factory's
  ``enable_liger_kernel`` applies for pre-training and SFT): the tokens go through in chunks of
  about tokens x hidden logits, each chunk's loss gradient is computed in place and multiplied
  into the input's and the head weight's gradients during the forward; those two are saved for
  backward (activations.py), no logits are. Backward only rescales them by the upstream
  gradient (element_mul_kernel over tokens x hidden, left out: under 0.1% of a step).
When the loss itself is compiled (torchtune compiles ``compute_cross_entropy``; torchtitan
leaves its loss eager), Inductor fuses the upcast, softmax and NLL into one reduction kernel per
chunk that saves its input and a log-sum-exp per row, and one backward kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.job.kernels import FP32, Kernel, pointwise, tiny

CHUNKS = 8  # CEWithChunkedOutputLoss num_output_chunks default
VARIANTS = ("fp32", "chunked", "fused", "fused-linear")


@dataclass(frozen=True)
class Loss:
    """The loss's kernels, forward and backward, and the memory they keep alive per logit."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    saved_per_logit: float  # bytes alive from the loss's forward to its backward
    backward_peak_per_logit: float  # extra bytes alive at once while its backward runs
    chunks: int  # the LM head runs in this many GEMMs (chunked outputs)


def cross_entropy(variant: str, logits: float, e: int, *, compiled: bool) -> Loss:
    """The loss over ``logits`` elements held in an e-byte dtype."""
    chunks = CHUNKS if variant == "chunked" else 1
    n = logits / chunks
    if variant == "fused-linear":  # each chunk's logits read and their gradient written in place
        return Loss((pointwise("liger_fused_linear_cross_entropy", logits, reads=e, writes=e,
                               flops_per_element=5),), (),
                    saved_per_logit=0.0, backward_peak_per_logit=0.0, chunks=1)
    if variant == "fused":
        return Loss((pointwise("fused_cross_entropy", logits, reads=e, writes=0,
                               flops_per_element=5),),
                    (pointwise("fused_cross_entropy_backward_inplace", logits, reads=e,
                               writes=e, flops_per_element=5),),
                    saved_per_logit=e, backward_peak_per_logit=0.0, chunks=1)
    upcast = [pointwise("to_fp32", n, reads=e, writes=FP32)] if e != FP32 else []
    downcast = [pointwise("to_fp32_backward", n, reads=FP32, writes=e)] if e != FP32 else []
    if compiled:
        src = e if variant == "chunked" else FP32  # chunked: the upcast is inside the graph
        fwd = ([] if variant == "chunked" else upcast) + \
            [pointwise("cross_entropy_fused", n, reads=2 * src, writes=0, flops_per_element=5)]
        bwd = [pointwise("cross_entropy_fused_backward", n, reads=src, writes=src,
                         flops_per_element=5)] + ([] if variant == "chunked" else downcast)
        peak = src / chunks + (e / chunks if variant != "chunked" else 0.0)
        return Loss(tuple(fwd * chunks), tuple(bwd * chunks), saved_per_logit=src,
                    backward_peak_per_logit=peak, chunks=chunks)
    fwd = upcast + [pointwise("log_softmax", n, reads=3 * FP32, writes=FP32, flops_per_element=4),
                    tiny("nll_loss")]
    bwd = [pointwise("nll_loss_backward.zeros", n, reads=0, writes=FP32), tiny("nll_scatter"),
           pointwise("log_softmax_backward", n, reads=3 * FP32, writes=FP32,
                     flops_per_element=3)] + downcast
    # nll's gradient and log_softmax's input gradient, beside the saved log-probabilities
    return Loss(tuple(fwd * chunks), tuple(bwd * chunks), saved_per_logit=FP32,
                backward_peak_per_logit=2 * FP32 / chunks, chunks=chunks)
