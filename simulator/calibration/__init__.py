"""Calibration: fit a machine's physics to what the user measured on it.

``checks`` reads how each nccl-tests log ran (its GPUs, its NCCL variables) and refuses a log
that contradicts the machine; ``bounds`` holds each parameter's physical bounds and the fit's
starting point; ``collectives_fit`` fits the wire's parameters (nccl/wire.py) to the logs,
re-screening which ones bind until that stops changing; ``compute_step`` turns one measured
single-GPU step of a job into its achieved compute fraction; ``record`` writes both into the
topology YAML's ``calibration`` block, each value with its source, bounds and residual, so a
calibrated machine says what was fitted, how well, and whether it was forced.
"""
