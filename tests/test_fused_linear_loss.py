"""Liger's fused linear cross-entropy keeps no logits: the head's saved memory, hand-counted."""

from simulator.inputs.config import load_workload
from simulator.job import loss
from simulator.job.workload import Job
from simulator.memory.activations import activation_lines


def _head_lines(cross_entropy: str) -> dict[str, float]:
    cfg = load_workload("llama3.2-1b").with_training(cross_entropy=cross_entropy,
                                                      activation_checkpointing="full")
    job = Job.from_config(cfg, micro_batch=2, seq_len=1024)
    lines = activation_lines(job, 2, 1, False, True, head_weight_bytes=2)
    return {line.label: line.bytes for line in lines if "LM head" in line.label}


def test_no_logits_are_saved_and_the_head_weight_gradient_is():
    job = Job.from_config(load_workload("llama3.2-1b"), micro_batch=2, seq_len=1024)
    tokens, hidden, vocab, e = 2 * 1024, job.arch.hidden, job.arch.vocab, job.activation_bytes
    fused = _head_lines("fused")
    linear = _head_lines("fused-linear")
    [saved_fused] = [b for label, b in fused.items() if "inputs" in label]
    [saved_linear] = [b for label, b in linear.items() if "inputs" in label]
    assert saved_fused == tokens * (2 * hidden * e + vocab * e)  # inputs + 16-bit logits
    assert saved_linear == tokens * 2 * hidden * e  # final-norm input + the input's gradient
    [weight_grad] = [b for label, b in linear.items() if "weight's gradient" in label]
    assert weight_grad == vocab * hidden * 2


def test_its_kernel_reads_the_chunks_logits_and_writes_their_gradient_in_place():
    fused_linear = loss.cross_entropy("fused-linear", 1e6, 2, compiled=False)
    [kernel] = fused_linear.forward
    assert (kernel.bytes, fused_linear.backward, fused_linear.saved_per_logit) == (4e6, (), 0.0)
