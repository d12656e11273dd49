"""The machine: GPU and link catalogs, the topology graph, NCCL's rings and choices, collectives.

``hardware`` (catalogs, every number with its source), ``topology`` (``Machine``: graph, path
types, P2P vs SHM, routes), ``rings`` (NCCL's ring search), ``nccl_tuning`` (what NCCL believes:
its cost model) and ``collectives`` (what really happens: a collective's flows on the fabric).
"""
