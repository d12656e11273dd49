"""`stepsim collective`: one collective over a size range, printed like nccl-tests.

The text form has nccl-tests' columns (out-of-place only: the simulator has no in-place
difference) plus the algorithm, protocol and channels NCCL would pick; then one line naming
the transport and the most utilised link. ``--json`` prints one object per size (a list for
a range), with the keys of design.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from simulator.errors import InputError
from simulator.inputs.config import load_topology
from simulator.machine import collectives
from simulator.machine.topology import Machine
from simulator.units import parse_size

# nccl-tests prints the element type and reduction; stepsim moves bytes, so it reports them as
# nccl-tests' default run would (float, sum; root 0 for broadcast, -1 otherwise).
ELEMENT_BYTES = 4


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "collective", help="time one NCCL collective over a range of sizes, like nccl-tests",
        description="Simulate an NCCL collective on a machine and print nccl-tests' columns.")
    parser.add_argument("-t", "--topology", required=True, help="topology YAML or preset name")
    parser.add_argument("--op", required=True,
                        help="allreduce | allgather | reducescatter | broadcast")
    parser.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    parser.add_argument("-e", "--maxbytes", default=None, help="largest size (default: -b)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2,
                        help="multiply the size by this between runs (default 2)")
    parser.add_argument("--bytes", default=None, help="one size (instead of -b/-e)")
    parser.add_argument("--gpus", type=int, default=None, help="use the first K GPUs")
    parser.add_argument("--algo", default="auto", help="ring | tree | auto (NCCL's choice)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def sizes(args: argparse.Namespace) -> list[int]:
    if args.bytes is not None:
        return [parse_size(args.bytes)]
    low = parse_size(args.minbytes)
    high = parse_size(args.maxbytes) if args.maxbytes is not None else low
    if low <= 0 or high < low:
        raise InputError(f"need 0 < -b <= -e, got -b {args.minbytes} -e {args.maxbytes}")
    if args.stepfactor < 2:
        raise InputError(f"-f must be at least 2, got {args.stepfactor}")
    out = []
    size = low
    while size <= high:
        out.append(size)
        size *= args.stepfactor
    return out


def run(args: argparse.Namespace) -> int:
    if args.op not in collectives.OPS:
        raise InputError(f"--op: unknown collective {args.op!r}; expected one of "
                         f"{', '.join(collectives.OPS)}")
    if args.algo not in ("auto", "ring", "tree"):
        raise InputError(f"--algo: expected ring, tree or auto, got {args.algo!r}")
    byte_sizes = sizes(args)
    machine = Machine.from_config(load_topology(args.topology))
    if args.gpus is not None:
        machine = machine.subset(args.gpus)
    results = [collectives.simulate(machine, args.op, n, algo=args.algo) for n in byte_sizes]
    if args.json:
        objs = [r.to_json() for r in results]
        print(json.dumps(objs[0] if args.bytes is not None else objs, indent=2))
        return 0
    print(render(machine, args.op, results))
    return 0


def render(machine: Machine, op: str, results: list[collectives.Result]) -> str:
    n = results[0].gpus if results else machine.n_gpus
    lines = [f"# stepsim collective: {op} on {machine.name}, {n} GPUs "
             f"(simulated; out-of-place columns only)",
             "#",
             f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} "
             f"{'time':>10} {'algbw':>7} {'busbw':>7}  {'algo':>5} {'proto':>6} {'nch':>3}",
             f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} "
             f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}"]
    redop = "sum" if op in ("allreduce", "reducescatter") else "none"
    root = "0" if op == "broadcast" else "-1"
    for r in results:
        count = r.bytes // ELEMENT_BYTES
        if op in ("allgather", "reducescatter"):
            count //= max(r.gpus, 1)  # nccl-tests counts elements per rank for these
        lines.append(f"  {r.bytes:>12} {count:>12} {'float':>6} {redop:>6} {root:>5} "
                     f"{r.time_us:>10.2f} {r.algbw_gbps:>7.2f} {r.busbw_gbps:>7.2f}  "
                     f"{r.algorithm:>5} {r.protocol:>6} {r.n_channels:>3}")
    last = results[-1]
    if last.bottleneck_link is not None:
        lines.append(f"# transport {last.transport}; bottleneck at {_size(last.bytes)}: "
                     f"{last.bottleneck_link} ({last.bottleneck_utilization:.0%} utilised): "
                     f"{machine.describe(last.bottleneck_link)}")
    else:
        lines.append(f"# transport {last.transport}; no link is used")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    from simulator.units import format_size

    return format_size(nbytes)
