"""`stepsim run`: simulate one training step of a job on a machine and say where the time goes.

Prints a compact table (or `--json`, design.md's `run` contract) and optionally writes the
Chrome trace, the Gantt PNG and the memory curve. A job that does not fit is not simulated:
it gets its memory verdict and what would fit (``--simulate-anyway`` simulates it, every
figure marked). ``--micro-batch max`` runs the largest micro-batch that fits. The answer is
`simulator.api.outcome`, which every command shares; run_text.py words it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from simulator import api
from simulator.api import RunResult, RunSpec
from simulator.commands import html_flag, price_flags, recipe_flags, terminal
from simulator.commands.parsing import NO_FIT_EXIT, Each, machine_gpus, no_fit_status
from simulator.commands.run_text import print_text
from simulator.errors import InputError, quoted
from simulator.inputs.schema import MAX_BATCH, MAX_BOXES, MAX_GPUS, MAX_TOKENS
from simulator.outputs import jsondoc
from simulator.outputs.files import Writer, check_outputs, text_writer, write_files
from simulator.units import fraction, positive_float, positive_int

MIN_BUCKET_MB = 2.0**-20  # one byte
MAX_BUCKET_MB = 2.0**20  # one TiB


def add_job_arguments(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """The options that define a job and a machine (shared by run, compare and sweep)."""
    action: Any = Each if many else "store"
    parser.add_argument("-t", "--topology", required=True, action=action,
                        help="topology YAML or preset name; NAME:K uses its first K GPUs"
                        + (" (repeatable, or a comma list)" if many else ""))
    parser.add_argument("-w", "--workload", required=True, action=action,
                        help="workload YAML, preset name or hf:config.json (a Hugging Face config)"
                        + (" (repeatable, or a comma list)" if many else ""))
    parser.add_argument("-s", "--strategy", action=action,
                        help=f"one of {', '.join(api.STRATEGIES)} (default ddp)"
                        + (" (repeatable, or a comma list)" if many else ""))
    parser.add_argument("--gpus", help="use the first K GPUs of the machine (of each box with "
                        "--nnodes)")
    parser.add_argument("--nnodes", action=action,
                        help="boxes like the topology's, joined by its network (torchrun's "
                        "--nnodes; default the topology's nnodes)"
                        + (" (repeatable, or a comma list)" if many else ""))
    parser.add_argument("--allow-tp-across-nodes", action="store_true",
                        help="let a tensor-parallel group span boxes (never worth it; refused "
                        "without this)")
    parser.add_argument("--bucket-mb", help="DDP bucket_cap_mb (MiB; default: PyTorch's 25)")
    parser.add_argument("--tp", help="tensor-parallel degree (tp, tp+ddp, tp+fsdp)")
    parser.add_argument("--ep", help="expert-parallel degree: a mixture of experts' experts "
                        "over this many ranks (with fsdp or zero3)")
    parser.add_argument("--micro-batch", metavar="B|max",
                        help="sequences per GPU per micro-step; max: the largest that fits")
    parser.add_argument("--grad-accum", help="micro-steps per optimizer step")
    parser.add_argument("--seq-len", help="tokens per sequence")
    parser.add_argument("--pp", help="pipeline-parallel stages (the strategy runs inside each)")
    parser.add_argument("--schedule", default="1f1b",
                        help="pipeline schedule with --pp: gpipe | 1f1b (default) | interleaved")
    parser.add_argument("--virtual-stages", default="1",
                        help="model chunks per stage for --schedule interleaved (Megatron's "
                        "virtual pipeline size)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="all-reduce after the whole backward (Megatron's local DDP)")
    parser.add_argument("--compute-slowdown", default=None,
                        help="fixed share of compute speed lost while NCCL kernels run "
                        "(default: channels / SMs)")
    recipe_flags.add_arguments(parser)
    price_flags.add_arguments(parser)
    parser.add_argument("--no-ranges", action="store_true",
                        help="skip the low-high ranges (each costs a few more simulations)")
    parser.add_argument("--simulate-anyway", action="store_true",
                        help="simulate a job that does not fit in memory, every figure marked "
                        "as if it fit (without it: the verdict and what would fit)")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="simulate one training step",
        description="Simulate one training step: step time, throughput, exposed "
        "communication, MFU, memory per GPU, the bottleneck link.")
    add_job_arguments(parser)
    parser.add_argument("--trace", metavar="FILE.json",
                        help="write the step as a trace (FILE.json.gz: gzipped)")
    parser.add_argument("--trace-format", default="perfetto", metavar="FORMAT",
                        help="perfetto (default: one Chrome-trace file for ui.perfetto.dev) | "
                        "kineto (PyTorch-profiler files, one per rank beside FILE: "
                        "FILE.rank0.json, ...; Holistic Trace Analysis reads the folder)")
    parser.add_argument("--trace-per-gpu", action="store_true",
                        help="with --trace (perfetto): a process for every GPU instead of one "
                        "per group of identical ranks, whose tracks stand for the others'")
    parser.add_argument("--gantt", metavar="FILE.png", help="write a Gantt chart of the step")
    parser.add_argument("--gantt-per-gpu", action="store_true",
                        help="with --gantt: one lane per GPU and stream (plots.gantt "
                        "collapse=False) instead of one shared lane per stream")
    parser.add_argument("--memory-png", metavar="FILE.png",
                        help="write memory per GPU over the step")
    html_flag.add_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument("--fail-if-no-fit", action="store_true",
                        help=f"exit {NO_FIT_EXIT} (after the usual output) when the job does "
                        "not fit in GPU or host memory")
    parser.set_defaults(handler=run)


# RunSpec field -> parser of its flag's value, within the limits of docs/inputs.md
NUMBER_FLAGS: dict[str, Callable[[str | None, str], Any]] = {
    "gpus": partial(positive_int, maximum=MAX_GPUS),
    "nnodes": partial(positive_int, maximum=MAX_BOXES),
    "bucket_mb": partial(positive_float, minimum=MIN_BUCKET_MB, maximum=MAX_BUCKET_MB),
    "tp": partial(positive_int, maximum=MAX_GPUS),
    "micro_batch": partial(positive_int, maximum=MAX_BATCH),
    "grad_accum": partial(positive_int, maximum=MAX_BATCH),
    "seq_len": partial(positive_int, maximum=MAX_TOKENS),
}


MAX = "max"  # --micro-batch max: the largest that fits, searched by the memory model


def number_flag(field: str, text: str | None) -> Any:
    """A number flag's value; ``max`` where --micro-batch takes it."""
    if field == "micro_batch" and text is not None and text.strip() == MAX:
        return MAX
    return NUMBER_FLAGS[field](text, flag_name(field))


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


# a run flag a strategy may not use -> the RunSpec field and value that leave it unset
_UNSET: dict[str, tuple[str, Any]] = {"--tp": ("tp", None), "--bucket-mb": ("bucket_mb", None),
                                      "--no-overlap": ("overlap", True)}


def spec_from_args(args: argparse.Namespace, topology: str, workload: str,
                   strategy: str | None, *, others: tuple[str, ...] = (),
                   gpus: int | None = None, nnodes: str | None = None) -> RunSpec:
    """The RunSpec of the flags, refusing a flag the strategy has no use for. ``others``: the
    other strategies of a `compare`; a flag one of them uses is left out here, not refused.
    ``gpus``: this machine's own count (``-t NAME:K``), over --gpus. ``nnodes``: this run's box
    count where the flag was given several (`compare`). ``--micro-batch max`` is searched here
    (``largest``)."""
    given = {field: getattr(args, field) for field in NUMBER_FLAGS}
    if isinstance(given["nnodes"], list):
        given["nnodes"] = nnodes
    numbers = {field: number_flag(field, given[field]) for field in NUMBER_FLAGS}
    if gpus is not None:
        numbers["gpus"] = gpus
    searched = numbers["micro_batch"] == MAX
    fields = recipe_flags.fields_from_args(args)
    if searched:  # the search decides it: a DeepSpeed config's micro-batch does not apply
        numbers["micro_batch"] = None
        fields["explicit"] = fields["explicit"] | {"micro_batch"}
    spec = RunSpec(
        topology=topology, workload=workload, strategy=api.check_strategy(strategy or "ddp"),
        **numbers,
        allow_tp_across_nodes=args.allow_tp_across_nodes,
        overlap=not args.no_overlap,
        compute_slowdown=fraction(args.compute_slowdown, "--compute-slowdown"),
        pp=positive_int(args.pp, "--pp", maximum=MAX_GPUS) or 1, schedule=args.schedule,
        ep=positive_int(args.ep, "--ep", maximum=MAX_GPUS) or 1,
        virtual_stages=positive_int(args.virtual_stages, "--virtual-stages",
                                    maximum=MAX_GPUS) or 1,
        nccl=api.NcclEnv.from_environ(os.environ), **fields)
    spec = api.configured(spec)  # a DeepSpeed config's settings, under the flags given

    def unused(name: str) -> dict[str, str]:
        return dict(api.unused_flags(name, tp=spec.tp, bucket_mb=spec.bucket_mb,
                                 overlap=spec.overlap))

    unset: dict[str, Any] = {}
    for flag, message in unused(spec.strategy).items():
        if all(flag in unused(other) for other in others):
            raise InputError(message)
        field, value = _UNSET[flag]
        unset[field] = value
    spec = replace(spec, **unset)
    return largest(spec) if searched else spec


def largest(spec: RunSpec) -> RunSpec:
    """``spec`` at the largest micro-batch that fits; at 1 when none does (its verdict then
    says so)."""
    return replace(spec, micro_batch=api.largest_micro_batch(spec) or 1)


def would_fit(report: dict[str, Any], spec: RunSpec) -> list[dict[str, Any]]:
    """What would make a job that does not fit fit (advice/would_fit.py); [] when it fits."""
    if api.fits(report["memory"]):
        return []
    from simulator.advice import would_fit as changes  # only for a job that does not fit

    return changes.changes(spec)


TRACE_FORMATS = ("perfetto", "kineto")


def trace_paths(path: str, fmt: str, world: int) -> list[str]:
    """The files a trace goes to: the path itself, or one per rank beside it (kineto)."""
    if fmt not in TRACE_FORMATS:
        raise InputError(f"--trace-format: expected perfetto or kineto, got {quoted(fmt)}")
    if fmt == "perfetto":
        return [path]
    from simulator.outputs import kineto  # its exporter only for a kineto trace

    return kineto.rank_paths(path, world)


def trace_writers(result: RunResult, path: str, fmt: str,
                  every_gpu: bool = False) -> list[tuple[str, Writer]]:
    from simulator.outputs import kineto, trace  # only when a trace is asked for

    deps = [{t.id: t.deps for t in p.tasks} for p in result.programs]
    timeline = result.timeline
    if fmt == "perfetto":
        return [(path, text_writer(trace.dumps(timeline, deps=deps, every_gpu=every_gpu)))]
    machine = result.machine
    devices = [kineto.device_properties(g.name, g.memory_bytes, g.compute_capability, g.sms)
               for g in (machine.gpu_of(r) for r in range(machine.n_gpus))]
    reduce_dtype, activation_dtype = kineto.comm_dtypes(
        result.spec.strategy, result.job.precision, result.spec.grad_compression)
    docs = kineto.rank_traces(timeline, devices, deps=deps, reduce_dtype=reduce_dtype,
                              activation_dtype=activation_dtype)

    def writer(doc: dict[str, Any]) -> Writer:
        # ": " after keys: HTA finds a file's rank with the pattern '"rank":\s+(\d+)'
        return lambda p: text_writer(json.dumps(doc, separators=(",", ": ")))(p)

    return [(p, writer(doc)) for p, doc in
            zip(trace_paths(path, fmt, timeline.world), docs, strict=True)]


def write_outputs(result: RunResult, args: argparse.Namespace) -> None:
    words = "".join(f", {x}" for x in recipe_flags.words(result.report.get("recipe", {})))
    pipe = result.report.get("pipeline")
    if isinstance(pipe, dict):
        words += (f", pp {pipe['stages']} {pipe['schedule']} x {pipe['micro_batches']} "
                  f"micro-batches, bubble {pipe['bubble_fraction']:.1%}")
    title = (f"{result.job.name} on {result.machine.name}, {result.spec.strategy}{words}: "
             f"step {result.timeline.step_time * 1e3:.1f} ms")
    writers: list[tuple[str, Writer]] = []
    if args.trace:
        writers += trace_writers(result, args.trace, args.trace_format, args.trace_per_gpu)
    if args.gantt or args.memory_png:
        # matplotlib only when a picture is asked for
        from simulator.outputs import memory_plot, plots

        mem = result.memory
        if args.gantt:
            writers.append((args.gantt, lambda p: plots.gantt(
                result.timeline, p, title=title, collapse=not args.gantt_per_gpu)))
        if args.memory_png:
            writers.append((args.memory_png, lambda p: memory_plot.memory_curve(
                result.timeline, mem["lines"], mem["capacity_bytes"], p, title=title,
                micro_steps=result.job.grad_accum)))
    write_files(writers)


def run(args: argparse.Namespace) -> int:
    if args.gantt_per_gpu and not args.gantt:
        raise InputError("--gantt-per-gpu changes the Gantt chart: give --gantt FILE.png too")
    if args.trace_per_gpu and (not args.trace or args.trace_format != "perfetto"):
        raise InputError("--trace-per-gpu changes the perfetto trace: give --trace FILE.json "
                         "(kineto writes every rank's file already)")
    topology, gpus = machine_gpus(args.topology)
    spec = spec_from_args(args, topology, args.workload, args.strategy, gpus=gpus)
    traces = trace_paths(args.trace, args.trace_format,
                         api.load_machine(spec.topology, spec.gpus,
                                          nnodes=spec.nnodes).n_gpus) if args.trace else []
    check_outputs([*traces, args.gantt, args.memory_png, args.html])  # before minutes of work
    what = "the step" if args.no_ranges else "the step and its range"
    with terminal.progress(f"simulating {what}"):  # shows only past two seconds
        report, result = api.outcome(spec, prices=price_flags.prices(args),
                                     ranges=not args.no_ranges,
                                     simulate_anyway=args.simulate_anyway,
                                     gantt=bool(args.html))
    changes = would_fit(report, spec)
    if changes:
        report["what_would_fit"] = changes
    label = report["topology"] + (f":{spec.gpus}" if spec.gpus else "")
    html_flag.write(args, [label], [report], [], doc=report)
    report.pop("gantt", None)  # the picture's data: in the HTML report, not the JSON
    if result is not None:
        write_outputs(result, args)
    else:
        for path in [*traces, args.gantt, args.memory_png]:
            if path:
                print(f"stepsim run: {path} not written: the job does not fit in memory "
                      "(--simulate-anyway draws it as if it fit)", file=sys.stderr)
    if args.json:
        print(jsondoc.dumps(report))
    else:
        print_text(report, would_fit=changes)
    return no_fit_status(args, report["memory"])
