"""Tables of hardware, every number with its source: ``gpus`` (each card's rates, memory, SMs,
NVLink, PCIe, power and price), ``links`` (PCIe and NVLink generations, socket links, host
memory, NCCL's beliefs of each), ``power`` (how a power limit slows tensor-core work), ``nics``
(network cards: line rate, ports, verbs, PCIe slot; what each kind of network's frames and
switch add)."""
