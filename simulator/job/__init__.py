"""The job: a workload's parameters and ops, their time on one GPU, and memory per rank.

``workload`` (``Job``: parameters in Hugging Face order, LoRA / QLoRA), ``ops`` (kernels with
FLOPs and bytes), ``compute`` (kernel time on a GPU, MFU), ``memory`` and ``memory_search``
(memory per rank per strategy, the verdict, the largest batch or model that fits).
"""
