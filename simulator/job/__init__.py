"""The job: a workload's parameters and ops, and their time on one GPU.

``workload`` (``Job``: parameters in Hugging Face order, LoRA / QLoRA), ``parameters``,
``recipe`` (framework bundles), ``ops`` and ``transformer_ops`` (kernels with FLOPs and bytes),
the kernel regimes (``eager``, ``compiled``, ``fused``), ``attention``, ``loss``,
``optimizer``, ``checkpointing``, and ``compute`` (kernel time on a GPU, MFU).
"""
