"""Parallelism strategies: job + machine -> per-rank programs for the engine."""
