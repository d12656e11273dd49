"""`stepsim collective`: one collective over a size range, printed exactly as nccl-tests does.

Flags are nccl-tests' where they mean something to a simulation (``-b -e -f -i`` sizes, ``-d``
datatype, ``-o`` reduction, ``-c 0`` for ``#wrong`` N/A, ``-g`` GPUs: nccl-tests runs on
``-g`` GPUs per thread times its threads, an integer ``-t``, the first of the machine, in its
order, as ``--gpus``; with ``--nnodes N`` that many in each box, as ``mpirun -np N ... -g G``
runs it); ``-n -w -m -N -z -G`` are accepted and named once as ignored. ``--op``
takes the collective or the nccl-tests binary name. NCCL's environment variables
(NCCL_P2P_DISABLE, NCCL_ALGO, ...) apply as NCCL reads them, and the ``# stepsim:`` lines after
nccl-tests' footer say what they changed, with the algorithm, protocol, channels and transport
of every size and the busiest link. ``--json`` prints one object per size (a list for a range),
with the keys of design.md.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from simulator import api
from simulator.commands import terminal
from simulator.commands.nccl_notes import env_notes, env_of
from simulator.commands.parsing import whole
from simulator.errors import InputError, cut, quoted
from simulator.inputs.schema import MAX_BOXES, MAX_GPUS
from simulator.outputs import jsondoc, nccl_tests
from simulator.units import format_size, parse_size

MAX_ROWS = 10000
IGNORED = (("-c", "--check"), ("-n", "--iters"), ("-w", "--warmup_iters"),
           ("-m", "--agg_iters"), ("-N", "--run_cycles"), ("-z", "--blocking"),
           ("-G", "--cudagraph"))


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "collective", help="time one NCCL collective over a range of sizes, like nccl-tests",
        description="Simulate an NCCL collective on a machine and print nccl-tests' output.")
    parser.add_argument("-t", "--topology", action="append", required=True, metavar="TOPOLOGY",
                        help="topology YAML or preset name (an integer is nccl-tests' "
                             "-t threads, ignored)")
    parser.add_argument("--op", required=True,
                        help="allreduce | allgather | reducescatter | broadcast | reduce | "
                             "alltoall | sendrecv | gather | scatter, or the nccl-tests "
                             "binary (all_reduce_perf, alltoall_perf, ...)")
    parser.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    parser.add_argument("-e", "--maxbytes", default=None, help="largest size (default: -b)")
    parser.add_argument("-f", "--stepfactor", type=int, default=None,
                        help="multiply the size by this between runs (default 2)")
    parser.add_argument("-i", "--stepbytes", default=None,
                        help="add this many bytes between runs (when -f is not given)")
    parser.add_argument("--bytes", default=None, help="one size (instead of -b/-e)")
    parser.add_argument("-d", "--datatype", default="float",
                        help=f"element type, as nccl-tests ({', '.join(nccl_tests.DATATYPES)})")
    parser.add_argument("-o", dest="redop", default="sum",
                        help="reduction shown in the redop column "
                             f"({', '.join(nccl_tests.REDOPS)})")
    parser.add_argument("--gpus", type=whole(1, MAX_GPUS), default=None,
                        help="use the first K GPUs (of each box with --nnodes)")
    parser.add_argument("--nnodes", type=whole(1, MAX_BOXES), default=None,
                        help="boxes joined by the topology's network (default: its nnodes); "
                             "nccl-tests' output for the whole job, as mpirun -np N would print")
    parser.add_argument("--algo", default="auto", help="ring | tree | auto (NCCL's choice)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--nthreads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("-g", "--ngpus", type=int, default=None, help=argparse.SUPPRESS)
    for short, long in IGNORED:
        parser.add_argument(short, long, type=int, default=None, dest=long.lstrip("-"),
                            help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def _topology(values: list[str]) -> tuple[str, list[str]]:
    """nccl-tests' integer -t (threads) apart from stepsim's -t TOPOLOGY."""
    threads = [v for v in values if v.isdigit()]
    names = [v for v in values if not v.isdigit()]
    if len(names) != 1:
        raise InputError("give exactly one -t TOPOLOGY (a preset or YAML); an integer -t is "
                         "nccl-tests' thread count")
    return names[0], threads


def _gpus(args: argparse.Namespace, threads: list[str]) -> int | None:
    """--gpus K, or nccl-tests' -g (GPUs per thread) times its -t threads: the same K."""
    if args.ngpus is None:
        return args.gpus  # type: ignore[no-any-return]
    if args.ngpus < 1:
        raise InputError(f"-g {args.ngpus}: nccl-tests needs at least 1 GPU per thread")
    total = args.ngpus
    for t in threads:
        total *= max(1, int(t))
    if args.gpus is not None and args.gpus != total:
        raise InputError(f"-g {args.ngpus} means {total} GPUs but --gpus says {args.gpus}; give "
                         "one of them")
    return total


def sizes(args: argparse.Namespace) -> tuple[list[int], int, bool]:
    """The requested sizes, and the step as nccl-tests' preamble prints it."""
    if args.bytes is not None:
        one = parse_size(args.bytes)
        return [one], 2, True
    low = parse_size(args.minbytes)
    high = parse_size(args.maxbytes) if args.maxbytes is not None else low
    if low < 0 or high < low:
        raise InputError(f"need 0 <= -b <= -e, got -b {cut(args.minbytes)} -e "
                         f"{cut(args.maxbytes)}")
    factor = args.stepfactor if args.stepfactor is not None else (
        1 if args.stepbytes is not None else 2)
    step = parse_size(args.stepbytes) if args.stepbytes is not None else 1 << 20
    if factor < 1 or (factor == 1 and step < 1):
        raise InputError(f"-f must be at least 1 and -i at least 1, got -f {factor}")
    out, size = [], low
    while size <= high:
        out.append(size)
        if len(out) > MAX_ROWS:
            raise InputError(f"more than {MAX_ROWS} sizes from -b {cut(args.minbytes)} to -e "
                             f"{cut(args.maxbytes)}; raise -f or -i")
        size = size * factor if factor > 1 else size + step
        if size == 0:
            size = 1 if factor > 1 else step
    return out, (factor if factor > 1 else step), factor > 1


def operation(name: str) -> str:
    op = nccl_tests.BINARIES.get(name.removeprefix("./").split("/")[-1], name)
    if op not in api.OPS:
        raise InputError(f"--op: unknown collective {quoted(name)}; expected one of "
                         f"{', '.join(api.OPS)} or {', '.join(nccl_tests.BINARIES)}")
    return op


def run(args: argparse.Namespace) -> int:
    op = operation(args.op)
    if args.algo not in ("auto", "ring", "tree"):
        raise InputError(f"--algo: expected ring, tree or auto, got {quoted(args.algo)}")
    if args.datatype not in nccl_tests.DATATYPES:
        raise InputError(f"-d: unknown datatype {quoted(args.datatype)}; nccl-tests knows "
                         f"{', '.join(nccl_tests.DATATYPES)}")
    if args.redop not in nccl_tests.REDOPS:
        raise InputError(f"-o: unknown reduction {quoted(args.redop)}; nccl-tests knows "
                         f"{', '.join(nccl_tests.REDOPS)}")
    topology, threads = _topology(args.topology)
    gpus = _gpus(args, threads)
    requested, step, is_factor = sizes(args)
    env = env_of(os.environ)
    with api.blame(topology, "topologies"):
        comm = api.load_communicator(topology, gpus, env=env, nnodes=args.nnodes)
    machine = comm.machine

    def simulate(nbytes: list[int]) -> list[api.Result]:
        # in pieces, so that a long size range on a large machine shows its progress
        piece = max(1, -(-len(nbytes) // 20))
        out: list[api.Result] = []
        with terminal.progress(f"{op} over {len(nbytes)} sizes") as update:
            for i in range(0, len(nbytes), piece):
                out += api.collective(api.CollectiveSpec(
                    topology, op, tuple(nbytes[i:i + piece]), gpus, args.algo, env,
                    args.nnodes))
                update(len(out), len(nbytes))
        return out

    if args.json:
        objs = [r.to_json() for r in simulate(requested)]
        print(jsondoc.dumps(objs[0] if args.bytes is not None else objs))
        return 0
    element = nccl_tests.DATATYPES[args.datatype]
    shaped = [nccl_tests.sizes(op, n, machine.n_gpus, element) for n in requested]
    results = simulate([nbytes for nbytes, _ in shaped])
    rows = [nccl_tests.Row(nbytes, count, r.time_us, r.algbw_gbps, r.busbw_gbps)
            for (nbytes, count), r in zip(shaped, results, strict=True)]
    given = {short: getattr(args, long.lstrip("-")) for short, long in IGNORED}

    def echo(flag: str, default: int) -> int:  # nccl-tests' preamble shows what was asked
        value = given[flag]
        return default if value is None else value

    header = nccl_tests.Header(
        machine.n_gpus, requested[0], requested[-1], step, is_factor,
        warmup_iters=echo("-w", 5), iters=echo("-n", 20), agg_iters=echo("-m", 1),
        validation=echo("-c", 1), graph=echo("-G", 0),
        device_name=f"{machine.gpu.name} (simulated)", boxes=machine.nnodes)
    with api.blame(topology, "topologies"):  # paths and rings are found on demand
        counted = threads if args.ngpus is None else []  # with -g, -t counts the GPUs
        notes = _notes(topology, gpus, args.nnodes, comm, op, args.algo, results, given,
                       counted + ([str(args.nthreads)] if args.nthreads is not None else []))
        if args.ngpus is not None:  # which GPUs nccl-tests' -g means here
            chosen = ", ".join(comm.machine.gpu_nodes[:comm.machine.gpus_per_box])
            each = " of each box" if comm.machine.nnodes > 1 else ""
            notes.insert(1, f"-g {args.ngpus}" + (f" x -t {' x '.join(threads)}" if threads
                                                  else "") +
                         f": {comm.machine.gpus_per_box} GPUs{each}, the first of {topology} "
                         f"in its order ({chosen}), as nccl-tests numbers them")
    print(nccl_tests.render(header, op, args.datatype, args.redop, rows, notes,
                            check=given["-c"] != 0))
    return 0


def _notes(topology: str, gpus: int | None, nnodes: int | None, comm: api.Communicator,
           op: str, algo: str, results: list[api.Result], given: dict[str, int | None],
           threads: list[str]) -> list[str]:
    machine = comm.machine
    boxes = f"{machine.nnodes} boxes of {machine.gpus_per_box}" if machine.nnodes > 1 else \
        f"{machine.n_gpus}"
    notes = [f"simulated {op} on {machine.name} ({boxes} x {machine.gpu.name}); "
             "the in-place half repeats the other (the model has no difference)"]
    if machine.nnodes > 1:  # how NCCL crosses between boxes, and why
        notes.append(f"between boxes: {comm.net.describe()}")
    flags = [f"{k} {v}" for k, v in given.items() if v is not None]
    flags += [f"-t {t}" for t in threads]
    if flags:
        notes.append(f"ignored nccl-tests flags: {' '.join(flags)} (a simulation runs no "
                     "threads, iterations, graphs or data checks; -g or --gpus picks GPUs)")
    if comm.env.active:  # what NCCL would choose without the variables
        plain = api.load_communicator(topology, gpus, nnodes=nnodes)
        baseline = api.collective(api.CollectiveSpec(topology, op, tuple(r.bytes for r in results),
                                                     gpus, algo, nnodes=nnodes))
        notes += env_notes(comm, plain, results, baseline)
    notes.append(f"{'size':>12}  {'algo':>5}  {'proto':>6}  {'nch':>3}  transport")
    names = {"ring": "Ring", "tree": "Tree", "p2p": "P2P"}
    notes += [f"{r.bytes:>12}  {names.get(r.algorithm, r.algorithm):>5}  {r.protocol:>6}  "
              f"{r.n_channels:>3}  {r.transport}" for r in results]
    last = results[-1]
    plan = comm.plan(op, last.bytes, algo=algo)
    moving = last.time_us * 1e-6 - plan.flow.latency
    bound = (len(plan.flows) == 1 and plan.flow.nbytes and moving > 0
             and plan.flow.nbytes / moving >= plan.flow.max_rate * 0.99)
    if len(plan.flows) != 1:  # a flow per pair (all-to-all, gather, scatter, sendrecv)
        notes += _pairs_note(machine, plan, last)
    elif bound and "NET/Socket" in plan.transport:
        notes.append(f"at {format_size(last.bytes)} the socket transport binds, not a link: "
                     f"{plan.flow.max_rate / 1e9:.2f} GB/s of progress (one TCP stream a "
                     "proxy thread: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD add streams)")
    elif bound:
        notes.append(f"at {format_size(last.bytes)} the {plan.n_channels} channels bind, not a "
                     f"link: {plan.flow.max_rate / plan.n_channels / 1e9:.1f} GB/s each over PCIe "
                     "(NCCL_MIN_NCHANNELS raises their number)")
    elif last.bottleneck_link is not None:
        notes.append(f"bottleneck at {format_size(last.bytes)}: {last.bottleneck_link} "
                     f"({last.bottleneck_utilization:.0%} utilised): "
                     f"{machine.describe(last.bottleneck_link)}")
    if machine.calibration is not None:
        notes.append(f"calibrated machine: {machine.calibration.source or 'stepsim calibrate'}")
        if machine.calibration.forced:
            notes.append(f"calibration forced: {machine.calibration.forced}")
    return notes


def _pairs_note(machine: api.Machine, plan: Any, last: api.Result) -> list[str]:
    """What binds a call made of a flow per pair: a link they share, or their thread blocks."""
    if not plan.flows or last.bottleneck_link is None:
        return []
    size = format_size(last.bytes)
    link = last.bottleneck_link
    crossing = sum(1 for f in plan.flows if any(lid == link for lid, _ in f.usage))
    tasks = [t for t in plan.tasks if t.src != t.dst]
    lines = [f"{len(tasks)} pair transfers at once, {plan.n_channels} channels per GPU, "
             f"{min(t.channels for t in tasks)}-{max(t.channels for t in tasks)} per pair"]
    if last.bottleneck_utilization >= 0.9:
        lines.append(f"bottleneck at {size}: {link} ({last.bottleneck_utilization:.0%} "
                     f"utilised, {crossing} of the {len(plan.flows)} pairs cross it): "
                     f"{machine.describe(link)}")
    else:
        lines.append(f"at {size} no link fills (busiest {link}, "
                     f"{last.bottleneck_utilization:.0%}): the thread blocks bind, each pair "
                     "getting its task's share of the warps on its channels over PCIe "
                     "(NCCL_MIN_P2P_NCHANNELS / NCCL_MAX_NCHANNELS change it)")
    return lines
