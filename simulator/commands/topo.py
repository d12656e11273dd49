"""`stepsim topo`: the machine as NCCL sees it, like `nvidia-smi topo -m`.

Prints, per GPU pair, the path type, the transport and the bottleneck bandwidth of a lone
transfer (GB/s, physical), then the ring NCCL would build with its channels. A machine of more
than ``MATRIX_GPUS`` GPUs gets the pairs counted by kind instead of matrices no one reads
(``--json`` keeps every pair; each row is one sweep from its GPU, so 1,024 GPUs take seconds).
NCCL's variables in the environment (NCCL_P2P_LEVEL, NCCL_P2P_DISABLE, ...) apply as
`collective` applies them: both ask the same ``Communicator.transport``. ``--png`` draws the
graph as the tree it is (each CPU at the top, switches under it, every device under its
parent); ``--json`` prints the same matrices and ring as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from simulator import api
from simulator.commands.nccl_notes import env_of
from simulator.commands.parsing import whole
from simulator.errors import InputError
from simulator.inputs.schema import MAX_BOXES, MAX_GPUS
from simulator.outputs import jsondoc
from simulator.outputs.files import write_atomically
from simulator.units import GB


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topo", help="GPU-pair matrix (path type, transport, GB/s) and NCCL rings",
        description="Show how NCCL sees a machine: path types, P2P or SHM, bottleneck GB/s per "
                    "GPU pair, and the ring order and channels it would choose.")
    parser.add_argument("-t", "--topology", help="topology YAML file or bundled preset name")
    parser.add_argument("--gpus", type=whole(1, MAX_GPUS), default=None, metavar="K",
                        help="use only the first K GPUs (of each box with --nnodes)")
    parser.add_argument("--nnodes", type=whole(1, MAX_BOXES), default=None, metavar="N",
                        help="boxes like the topology's, joined by its network")
    parser.add_argument("--png", metavar="FILE", help="draw the machine graph to a PNG file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(handler=run)
    from simulator.commands import topo_import  # `stepsim topo import FILE`

    topo_import.add_parser(parser.add_subparsers(dest="topo_command", metavar="import"))


def run(args: argparse.Namespace) -> int:
    if args.topology is None:
        raise InputError("give -t TOPOLOGY (a preset or YAML), or `stepsim topo import FILE`")
    with api.blame(args.topology, "topologies"):  # paths and rings are found on demand
        comm = api.load_communicator(args.topology, args.gpus, env=env_of(os.environ),
                                     nnodes=args.nnodes)
        report = summary(comm)
        if comm.env.active:  # what the variables changed, as `collective` says it
            plain = api.load_communicator(args.topology, args.gpus, nnodes=args.nnodes)
            report["nccl_env"] = {"variables": comm.env.line(),
                                  "ignored": list(comm.env.ignored),
                                  "changes": api.transport_effects(comm, plain)}
    if args.png:
        draw(comm.machine, Path(args.png))
    if args.json:
        print(jsondoc.dumps(report))
    elif sys.stdout.isatty() and not os.environ.get("CI"):
        _print_rich(report)
    else:
        _print_plain(report)
    return 0


def summary(comm: api.Communicator) -> dict[str, Any]:
    """Matrices and ring as plain data (GB/s = 1e9 B/s)."""
    machine = comm.machine
    n = machine.n_gpus
    gpus = list(machine.gpu_nodes)
    ring = comm.ring()
    types = [machine.path_type_row(i) for i in range(n)]
    return {
        "name": machine.name,
        "description": machine.description,
        "gpu": machine.gpu.name,
        "gpus": gpus,
        "path_type": types,
        "transport": [[None if i == j else comm.transport_over(kind)
                       for j, kind in enumerate(row)] for i, row in enumerate(types)],
        "bottleneck_gbps": [[None if i == j else round(gbps / GB, 2)
                             for j, gbps in enumerate(comm.bottleneck_row(i))]
                            for i in range(n)],
        "cpu_affinity": [machine.local_cpu(i) for i in range(n)],
        "ring": {
            "order": list(ring.order),
            "n_channels": ring.n_channels,
            "channel_gbps": round(ring.channel_bandwidth / GB, 3),
            "nccl_busbw_gbps": round(ring.nccl_bus_bandwidth / GB, 3),
            "limited_by": ring.bottleneck,
            "fallback": ring.fallback,
        },
    }


def _matrices(report: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    def cell(value: Any) -> str:
        if value is None or value == "LOC":
            return "X"
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    return [(title, [[cell(v) for v in row] for row in report[key]])
            for title, key in (("Path type (NCCL)", "path_type"), ("Transport", "transport"),
                               ("Bottleneck GB/s of a lone transfer", "bottleneck_gbps"))]


def _ring_lines(report: dict[str, Any]) -> list[str]:
    env = report.get("nccl_env")
    lines = []
    if env:
        lines.append(f"NCCL environment (read as NCCL reads it): {env['variables']}")
        lines += [f"{text}: ignored, as NCCL ignores it" for text in env["ignored"]]
        lines += env["changes"] or ["the transports are NCCL's own"]
    ring = report["ring"]
    names = [report["gpus"][r] for r in ring["order"]]
    if len(names) > MATRIX_GPUS:  # the whole order is in --json
        names = [*names[:6], f"... ({len(names) - 8} more)", *names[-2:]]
    lines += [f"Ring: {' -> '.join(names)} -> {report['gpus'][ring['order'][0]]}",
              f"Channels: {ring['n_channels']} x {ring['channel_gbps']:g} GB/s = "
              f"{ring['nccl_busbw_gbps']:g} GB/s (NCCL's search; physical rates can differ)"]
    if ring["fallback"]:
        lines.append("NCCL's ring search finds no ring at its lowest speed and falls back to "
                     "one channel in rank order at 0.1 GB/s (search.cc); only its channels "
                     "(doubled to 2, of 256 threads each) fall back: each pair keeps the "
                     "transport above")
    elif ring["limited_by"]:
        lines.append(f"Channel packing limited by: {ring['limited_by']}")
    return lines


MATRIX_GPUS = 16  # nvidia-smi's matrix stays readable up to about this many GPUs


def _pair_counts(report: dict[str, Any]) -> list[str]:
    """Every kind of GPU pair (path type, transport, bottleneck), with how many pairs."""
    kinds: dict[tuple[str, str, float], int] = {}
    for types, transports, gbps in zip(report["path_type"], report["transport"],
                                       report["bottleneck_gbps"], strict=True):
        for kind in zip(types, transports, gbps, strict=True):
            if kind[1] is not None:
                kinds[kind] = kinds.get(kind, 0) + 1
    lines = [f"{'path':>6}  {'transport':>9}  {'GB/s':>8}  pairs"]
    lines += [f"{path:>6}  {transport:>9}  {gbps:>8.1f}  {count:,}"
              for (path, transport, gbps), count in sorted(kinds.items(),
                                                           key=lambda kv: (-kv[1], kv[0]))]
    return lines


def _print_plain(report: dict[str, Any]) -> None:
    print(f"{report['name']}: {report['gpus'].__len__()} x {report['gpu']}")
    gpus = report["gpus"]
    if len(gpus) > MATRIX_GPUS:
        print(f"\nGPU pairs by kind ({len(gpus)} GPUs: --json lists every pair; bottleneck: "
              "GB/s of a lone transfer)")
        for line in _pair_counts(report):
            print(line)
        print()
        for line in _ring_lines(report):
            print(line)
        return
    for title, rows in _matrices(report):
        print(f"\n{title}")
        width = max(len(s) for s in gpus + [c for row in rows for c in row]) + 2
        print(" " * width + "".join(g.rjust(width) for g in gpus))
        for name, row in zip(gpus, rows, strict=True):
            print(name.ljust(width) + "".join(c.rjust(width) for c in row))
    print()
    for line in _ring_lines(report):
        print(line)


def _print_rich(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{report['name']}[/]: {len(report['gpus'])} x {report['gpu']}")
    if len(report["gpus"]) > MATRIX_GPUS:
        console.print(f"GPU pairs by kind ({len(report['gpus'])} GPUs: --json lists every "
                      "pair; bottleneck: GB/s of a lone transfer)")
        for line in _pair_counts(report):
            console.print(line, highlight=False)
        for line in _ring_lines(report):
            console.print(line)
        return
    for title, rows in _matrices(report):
        table = Table(title=title, title_justify="left")
        table.add_column("")
        for g in report["gpus"]:
            table.add_column(g, justify="right")
        for name, row in zip(report["gpus"], rows, strict=True):
            table.add_row(name, *row)
        console.print(table)
    for line in _ring_lines(report):
        console.print(line)


_COLOURS = {"gpu": "#76b900", "cpu": "#4f81bd", "pcie_switch": "#f4b183",
            "nvswitch": "#8064a2", "nic": "#a5a5a5"}


def draw(machine: api.Machine, path: Path) -> None:
    """Draw the graph, nodes coloured by kind, links labelled with GB/s per direction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    graph = machine.graph.to_undirected(as_view=True)  # a link's two directions are alike
    pos = layout(machine)
    width = max(x for x, _ in pos.values()) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * width), 5.0))
    try:
        colours = [_COLOURS[d["kind"]] for _, d in graph.nodes(data=True)]
        # a socket's label carries its host-memory bandwidth: SHM traffic is staged there
        names = {n: (f"{n}\nmem {machine.links[f'mem:{n}'].capacity / GB:.0f}"
                     if f"mem:{n}" in machine.links else n) for n in graph.nodes}
        nx.draw_networkx(graph, pos, ax=ax, node_color=colours, node_size=1400, font_size=8,
                         labels=names)
        labels = {(u, v): f"{d['kind']} {d['capacity'] / GB:.0f}"
                  for u, v, d in graph.edges(data=True)}
        nx.draw_networkx_edge_labels(graph, pos, edge_labels=labels, ax=ax, font_size=7)
        ax.set_title(f"{machine.name} (link labels: GB/s per direction)")
        ax.axis("off")
        fig.tight_layout()
        write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    finally:
        plt.close(fig)


def layout(machine: api.Machine) -> dict[str, tuple[float, float]]:
    """The PCIe tree as a tree: each node one row below the node that reaches it from a CPU
    (breadth first over PCIe links, file order), leaves side by side, a parent centred over its
    children; NVSwitches on a row of their own below, anything the tree does not reach after."""
    kinds = {n.id: n.kind for n in machine.config.nodes}
    pcie: dict[str, list[str]] = {n: [] for n in kinds}
    for lc in machine.config.links:
        if lc.kind == "pcie":
            pcie[lc.a].append(lc.b)
            pcie[lc.b].append(lc.a)
    children: dict[str, list[str]] = {n: [] for n in kinds}
    depth: dict[str, int] = {}
    roots = [n for n, k in kinds.items() if k == "cpu"]
    queue = list(roots)
    for root in roots:
        depth[root] = 0
    while queue:
        node = queue.pop(0)
        if kinds[node] == "gpu":
            continue  # a GPU is a leaf of the tree, not a way through it
        for other in pcie[node]:
            if other not in depth and kinds[other] != "cpu":
                depth[other] = depth[node] + 1
                children[node].append(other)
                queue.append(other)
    x: dict[str, float] = {}
    slot = [0.0]

    def place(node: str) -> float:
        if not children[node]:
            x[node], slot[0] = slot[0], slot[0] + 1
        else:
            spots = [place(child) for child in children[node]]
            x[node] = (spots[0] + spots[-1]) / 2
        return x[node]

    for root in roots:
        place(root)
    bottom = max(depth.values(), default=0) + 1
    rest = [n for n in kinds if n not in depth]
    for n in rest:  # NVSwitches, and whatever no PCIe link reaches
        depth[n] = bottom
    spread = [n for n in rest if kinds[n] != "nvswitch"]
    for n in spread:
        x[n], slot[0] = slot[0], slot[0] + 1
    for n in rest:
        if kinds[n] == "nvswitch":
            x[n] = (slot[0] - 1) / 2
    return {n: (x[n], -float(depth[n])) for n in kinds}
