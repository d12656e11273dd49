"""NCCL's behaviour on a machine: what it decides and what moving the bytes then costs.

``env`` (the ``NCCL_*`` variables as NCCL reads them), ``tuning`` (NCCL's own cost model: the
algorithm, protocol and channels it picks), ``communicator`` (``Communicator``: the transport
of every GPU pair, P2P, SHM or NET, its route, rings, plans; what the engine runs a step on),
``rings`` (NCCL's ring search), ``wire`` (what each transport and protocol really costs),
``collectives`` (a collective or send's plan: NCCL's choices and the flow it puts on the
links), ``perf`` (one collective timed alone, as nccl-tests does). Between boxes: ``net`` (the
network transport: IB verbs or sockets, each GPU's NIC, GPUDirect RDMA or host staging),
``net_rings`` (rings that cross each box once per channel, a pattern per NIC), ``tree`` (the
double binary tree between boxes), ``multinode`` (a collective or send across boxes).
"""
