"""The machine as hardware: a graph of GPUs, PCIe switches, CPUs, NVLink and NVSwitch, and the
links between them, as the topology file describes it.

``topology`` (``Machine``: nodes, directed links, NCCL's path types and best paths over them,
a link in words), ``links`` (each link's capacity and latency from the catalog), ``paths``
(NCCL's path ranking), ``cards`` (the card at each GPU node), ``host`` (sockets, host RAM,
copies to and from it, the CPU optimizer), ``scales`` (the achieved-rate factors ranges use),
``build`` (machines from files, cached), ``cluster`` (several boxes as one graph: N copies
joined through their NICs by a switch). What NCCL makes of it lives in ``simulator.nccl``.
"""
