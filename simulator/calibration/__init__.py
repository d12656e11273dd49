"""Calibration: fit a machine's physics to what the user measured on it.

``collectives_fit`` fits the wire's parameters (nccl/wire.py) to nccl-tests logs;
``compute_step`` turns one measured single-GPU step of a job into its achieved compute
fraction; ``record`` writes both into the topology YAML's ``calibration`` block, each value
with its source, so a calibrated machine says what was fitted and how well.
"""
