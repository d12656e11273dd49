"""stepsim: simulate one multi-GPU training step on a modelled machine, without a GPU.

The flow of data (see docs/architecture.md):
YAML presets -> config (validated models) -> Machine (topology) + Job (workload)
-> strategy programs -> engine (SimPy on a shared fabric) -> Timeline -> metrics, traces, plots.
"""

__version__ = "0.1.0"
