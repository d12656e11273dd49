"""A training step's seconds from the s/it a progress bar printed, as tqdm computes them.

Hugging Face Trainer's bar (transformers ProgressCallback: tqdm with its default smoothing
0.3, under LLaMA-Factory too) prints s/it as a bias-corrected exponential moving average of
the steps' times (tqdm/std.py ``EMA``: ``last = a*x + (1-a)*last``, shown ``last / (1 -
(1-a)**calls)``; tqdm 4.70.1). After two steps of x1 and x2 seconds it shows
(x2 + b*x1) / (1 + b), b = 1 - a, so the second step took (1 + b) * shown - b * x1. The
arithmetic mean, 2 * shown - x1, reads it 2-5% short: IST-DASLab/llmq's own figures do (their
bars' elapsed times, 421 s after two 14B steps of which 221.55 s the first, agree with the
EMA: 200.0 s, not 196.2).
"""

from __future__ import annotations

SMOOTHING = 0.3  # tqdm's default ``smoothing``


def second_step_seconds(first: float, shown_after_two: float,
                        smoothing: float = SMOOTHING) -> float:
    """The second step's seconds from the s/it shown after the first and after the second."""
    b = 1.0 - smoothing
    return (1.0 + b) * shown_after_two - b * first


def tokens_per_s(point: dict) -> float:
    """A point's measured tokens/s: ``tokens_per_s`` as published, or ``tokens_per_step``
    over the second step of its ``tqdm_s_per_it`` pair (s/it after the first and second)."""
    if "tqdm_s_per_it" in point:
        first, second = point["tqdm_s_per_it"]
        return float(point["tokens_per_step"]) / second_step_seconds(first, second)
    return float(point["tokens_per_s"])
