"""Memory per GPU: what each rank holds through the step, its peak, and whether it fits.

``estimate`` (the lines a strategy and recipe hold per rank, pipeline stage by stage),
``activations`` (saved activations per checkpointing mode), ``report`` (``MemoryReport``: the
peak, its moment, the verdict), ``host`` (what offloading moves to host RAM), ``search`` (the
largest micro-batch or model that fits).
"""
