"""`stepsim run`: simulate one training step of a job on a machine and say where the time goes.

Prints a compact table (or `--json`, design.md's `run` contract) and optionally writes the
Chrome trace, the Gantt PNG and the memory curve. A job that does not fit still runs; its
memory verdict comes first. The pipeline itself is `simulator.api.simulate`, which every
command shares.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from simulator import api
from simulator.api import RunResult, RunSpec
from simulator.commands import figures as fig
from simulator.commands import price_flags, recipe_flags, terminal
from simulator.commands.parsing import NO_FIT_EXIT, no_fit_status
from simulator.errors import InputError, quoted
from simulator.inputs.schema import MAX_BATCH, MAX_BOXES, MAX_GPUS, MAX_TOKENS
from simulator.outputs import jsondoc
from simulator.outputs.files import Writer, check_outputs, text_writer, write_files
from simulator.units import GiB, fraction, positive_float, positive_int

MIN_BUCKET_MB = 2.0**-20  # one byte
MAX_BUCKET_MB = 2.0**20  # one TiB


def add_job_arguments(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    """The options that define a job and a machine (shared by run, compare and sweep)."""
    action = "append" if many else "store"
    parser.add_argument("-t", "--topology", required=True, action=action,
                        help="topology YAML or preset name" + (" (repeatable)" if many else ""))
    parser.add_argument("-w", "--workload", required=True, action=action,
                        help="workload YAML, preset name or hf:config.json (a Hugging Face config)"
                        + (" (repeatable)" if many else ""))
    parser.add_argument("-s", "--strategy", action=action,
                        help=f"one of {', '.join(api.STRATEGIES)} (default ddp)"
                        + (" (repeatable)" if many else ""))
    parser.add_argument("--gpus", help="use the first K GPUs of the machine (of each box with "
                        "--nnodes)")
    parser.add_argument("--nnodes", action=action,
                        help="boxes like the topology's, joined by its network (torchrun's "
                        "--nnodes; default the topology's nnodes)" + (" (repeatable)" if many
                                                                      else ""))
    parser.add_argument("--allow-tp-across-nodes", action="store_true",
                        help="let a tensor-parallel group span boxes (never worth it; refused "
                        "without this)")
    parser.add_argument("--bucket-mb", help="DDP bucket_cap_mb (MiB; default: PyTorch's 25)")
    parser.add_argument("--tp", help="tensor-parallel degree (tp, tp+ddp, tp+fsdp)")
    parser.add_argument("--micro-batch", help="sequences per GPU per micro-step")
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


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


# a run flag a strategy may not use -> the RunSpec field and value that leave it unset
_UNSET: dict[str, tuple[str, Any]] = {"--tp": ("tp", None), "--bucket-mb": ("bucket_mb", None),
                                      "--no-overlap": ("overlap", True)}


def spec_from_args(args: argparse.Namespace, topology: str, workload: str,
                   strategy: str | None, *, others: tuple[str, ...] = (),
                   nnodes: str | None = None) -> RunSpec:
    """The RunSpec of the flags, refusing a flag the strategy has no use for. ``others``: the
    other strategies of a `compare`; a flag one of them uses is left out here, not refused.
    ``nnodes``: this run's box count where the flag was given several (`compare`)."""
    given = {field: getattr(args, field) for field in NUMBER_FLAGS}
    if isinstance(given["nnodes"], list):
        given["nnodes"] = nnodes
    spec = RunSpec(
        topology=topology, workload=workload, strategy=api.check_strategy(strategy or "ddp"),
        **{field: parse(given[field], flag_name(field))
           for field, parse in NUMBER_FLAGS.items()},
        allow_tp_across_nodes=args.allow_tp_across_nodes,
        overlap=not args.no_overlap,
        compute_slowdown=fraction(args.compute_slowdown, "--compute-slowdown"),
        pp=positive_int(args.pp, "--pp", maximum=MAX_GPUS) or 1, schedule=args.schedule,
        virtual_stages=positive_int(args.virtual_stages, "--virtual-stages",
                                    maximum=MAX_GPUS) or 1,
        nccl=api.NcclEnv.from_environ(os.environ), **recipe_flags.fields_from_args(args))
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
    return replace(spec, **unset)


def network_summary(net: dict[str, Any]) -> str:
    """Several boxes: how many, and how NCCL crosses between them."""
    how = "GPUDirect RDMA" if net["gpudirect_rdma"] else "staged through host memory"
    return f"{net['nnodes']} x {net['gpus_per_box']} GPUs, NET/{net['plugin']}, {how}"


def memory_verdict(mem: dict[str, Any]) -> str:
    need, have = mem["peak_bytes"] / GiB, mem["capacity_bytes"] / GiB
    if mem["fits"]:
        return f"fits: needs {need:.1f} GiB of {have:.1f} GiB per GPU"
    return f"DOES NOT FIT: needs {need:.1f} GiB of {have:.1f} GiB per GPU"


def host_verdict(mem: dict[str, Any]) -> str | None:
    """The host-RAM verdict of an offloaded job (None when nothing lives there)."""
    need = mem.get("host_peak_bytes") or 0
    if not need:
        return None
    have = mem["host_capacity_bytes"]
    word = "fits" if mem["host_fits"] else "DOES NOT FIT"
    return f"{word}: needs {need / GiB:,.1f} GiB of the host's {have / GiB:,.1f} GiB"


def offload_summary(off: dict[str, Any]) -> str:
    return (f"{off['d2h_bytes_per_gpu'] / GiB:.2f} GiB down in {fig.seconds(off['d2h_s'])}, "
            f"{off['h2d_bytes_per_gpu'] / GiB:.2f} GiB up in {fig.seconds(off['h2d_s'])} per GPU "
            f"({'pinned' if off['pin_memory'] else 'pageable'}); CPU optimizer "
            f"{fig.seconds(off['cpu_optimizer_s'])}")


def paged_summary(mem: dict[str, Any], paging: dict[str, Any] | None) -> str:
    """A paged optimizer: where its states live, and what crosses the host link per step."""
    paged = mem["paged_optimizer"]
    text = (f"{paged['bytes'] / GiB:.1f} GiB of states: {paged['resident_bytes'] / GiB:.1f} "
            f"GiB on the GPU, {paged['paged_to_host_bytes'] / GiB:.1f} GiB in host RAM")
    if not paging:
        return text + "; nothing pages (they fit beside the rest)"
    return (text + f"; per step {paging['h2d_bytes_per_gpu'] / GiB:.2f} GiB in "
            f"({fig.seconds(paging['h2d_s'])}) and as much evicted "
            f"({fig.seconds(paging['d2h_s'])}), in line with compute")


def pipeline_summary(pipe: dict[str, Any]) -> str:
    chunks = f" x {pipe['virtual_stages']} chunks" if pipe["virtual_stages"] > 1 else ""
    return (f"{pipe['stages']} stages{chunks}, {pipe['schedule']}, {pipe['micro_batches']} "
            f"micro-batches: bubble {pipe['bubble_fraction']:.1%} of the pipeline phase "
            f"(closed form {pipe['bubble_fraction_closed_form']:.1%})")


def summary_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    step = r["step_time_s"]
    eff = r["scaling_efficiency"]
    bn = r["bottleneck"]
    exposed = r["exposed_comm_s"]
    rows = [
        ("step time", fig.seconds_ranged(step, r.get("step_time_s_range"))),
        ("tokens/s", fig.ranged(fig.count(r["tokens_per_s"]), r.get("tokens_per_s_range"),
                                fig.count)),
        ("tokens/s per GPU", fig.ranged(fig.count(r["tokens_per_s_per_gpu"]),
                                        r.get("tokens_per_s_per_gpu_range"), fig.count)),
        ("samples/s", fig.count(r["samples_per_s"])),
        ("MFU", fig.ranged(f"{r['mfu']:.1%}", r.get("mfu_range"), lambda x: f"{x:.1%}")),
        ("compute", fig.seconds(r["compute_time_s"])),
        ("communication", fig.seconds(r["comm_time_s"])),
        ("exposed communication",
         f"{fig.seconds_ranged(exposed, r.get('exposed_comm_s_range'))} "
         f"({exposed / step:.0%} of the step)" if step > 0 else "-"),
        ("scaling efficiency", "n/a (one GPU cannot hold it)" if eff is None else fig.ranged(
            f"{eff:.1%}", r.get("scaling_efficiency_range"), lambda x: f"{x:.1%}")),
        ("memory per GPU", memory_verdict(r["memory"])),
        ("recipe", recipe_flags.training_words(r.get("recipe", {})) or "-"),
        *([("config files", recipe_flags.config_words(r["config_files"]))]
          if r.get("config_files") else []),
        *([("host memory", host)] if (host := host_verdict(r["memory"])) else []),
        *([("offload", offload_summary(r["offload"]))] if r.get("offload") else []),
        *([("paged optimizer", paged_summary(r["memory"], r.get("paging")))]
          if r["memory"].get("paged_optimizer") else []),
        *([("pipeline", pipeline_summary(r["pipeline"]))] if r.get("pipeline") else []),
        *([("boxes", network_summary(r["network"]))] if r.get("network") else []),
        ("bottleneck link", "none" if bn["link"] is None else
         f"{bn['link']} ({bn.get('description') or bn['link']}): "
         f"{bn['utilization']:.0%} of the step, "
         f"{bn['utilization_during_comm']:.0%} while communicating"),
    ]
    if r.get("gpus_price_usd"):
        rows.append(("per GPU dollar", f"{r['tokens_per_s_per_kusd']:,.0f} tokens/s per $1k "
                                       f"(GPUs ${r['gpus_price_usd']:,.0f})"))
    return rows + cost_rows(r)


def _usd(value: float) -> str:
    return f"${value:.3g}" if value < 1000 else f"${value:,.0f}"


def cost_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Price, whole-run, buy-versus-rent and energy rows (where the report has them)."""
    rows: list[tuple[str, str]] = []
    cost, basis = r.get("cost") or {}, r.get("cost_basis") or {}
    if cost.get("usd_per_hour") is not None:
        per_million = fig.ranged(_usd(cost["usd_per_million_tokens"]),
                                 cost.get("usd_per_million_tokens_range"), _usd)
        rows.append(("price", f"{per_million} per million tokens "
                              f"(${cost['usd_per_hour']:,.2f}/h: {basis['usd_per_hour_source']})"))
    if cost.get("time_to_train_s") is not None:
        took = fig.ranged(fig.duration(cost["time_to_train_s"]), cost.get("time_to_train_s_range"),
                          fig.duration)
        money = ("" if cost["usd_to_train"] is None else
                 ", " + fig.ranged(_usd(cost["usd_to_train"]), cost.get("usd_to_train_range"),
                                   _usd))
        rows.append(("whole run", f"{cost['train_tokens']:,} tokens in {took}{money}"))
    if cost.get("breakeven_months") is not None:
        rows.append(("buy or rent", f"buying (${basis['purchase_usd']:,.0f}) pays off after "
                                    f"{cost['breakeven_months']:.3g} months at "
                                    f"{basis['utilization']:.0%} use and "
                                    f"${basis['usd_per_kwh']:g}/kWh"))
    power = r.get("energy") or {}
    if power.get("joules_per_step") is not None:
        per_token = power["kwh_per_million_tokens"]
        rows.append(("energy", f"{power['joules_per_step']:,.0f} J per step, "
                               f"{power['avg_power_w'] / 1000:.3g} kW average"
                               + ("" if per_token is None else
                                  f", {per_token:.3g} kWh per million tokens")))
    return rows


def bucket_summary(buckets: list[dict[str, Any]]) -> str:
    if not buckets:
        return ""
    sizes = [b["bytes"] for b in buckets]
    first, last = buckets[0], buckets[-1]
    return (f"{len(buckets)} buckets, {sum(sizes) / 2**20:,.1f} MiB of gradients "
            f"(largest {max(sizes) / 2**20:.1f} MiB, smallest {min(sizes) / 2**20:.2f} MiB); "
            f"first all-reduce starts at {fig.seconds(first['start_s'])}, last ends at "
            f"{fig.seconds(last['end_s'])}")


def print_text(result: RunResult, out: Any = None) -> None:
    r = result.report
    console = terminal.console(out)
    if not r["memory"]["fits"]:
        console.print(f"memory: {memory_verdict(r['memory'])}; simulated anyway, "
                      "but this step would run out of memory")
    if not r["memory"].get("host_fits", True):
        console.print(f"host memory: {host_verdict(r['memory'])}; simulated anyway, but the "
                      "offloaded states would not fit in host RAM")
    cards = " + ".join(f"{len(ranks)} x {name}" for name, ranks in
                       r.get("cards", {r["gpu"]: range(r["gpus"])}).items())
    title = (f"{r['workload']} on {r['topology']} ({cards}), "
             f"{r['strategy']}{'' if r['overlap'] else ', no overlap'}"
             + "".join(f", {x}" for x in recipe_flags.words(r.get("recipe", {}))))
    table = terminal.table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in summary_rows(r):
        table.add_row(name, value)
    console.print(table)
    if r.get("buckets"):
        console.print("buckets: " + bucket_summary(r["buckets"]))
    if r.get("range_basis"):
        console.print(r["range_basis"]["summary"])
    cal = r.get("calibration")
    if cal:
        console.print(f"calibrated machine ({cal['source'] or 'stepsim calibrate'}): "
                      + (", ".join(f"{k} {v:.3g}" for k, v in cal["fitted"].items())
                         or "no collective parameter fitted"))
        if cal.get("forced"):
            console.print(f"  forced: {cal['forced']}; its ranges take nothing from this fit")
        for name, where in (cal.get("at_bound") or {}).items():
            console.print(f"  {name} ended on its physical {where}: the model could not "
                          "explain those rows, so it narrows no range")
        if cal["compute_achieved_fraction"]:
            console.print("  compute from a measured step of this job: " + ", ".join(
                f"{gpu} at {f:.0%} of the modelled speed"
                for gpu, f in cal["compute_achieved_fraction"].items()))
        elif cal["compute_calibrated_for_other_workloads"]:
            console.print("  compute is modelled: the measured step was of "
                          + ", ".join(cal["compute_calibrated_for_other_workloads"]))
    env = r.get("nccl_env")
    if env:
        console.print("NCCL environment (read as NCCL reads it): " + " ".join(
            f"{k}={v}" for k, v in env["variables"].items()))
        for line in [f"{x}: ignored, as NCCL ignores it" for x in env["ignored"]] + (
                env["effects"] or ["it changes nothing on this machine"]):
            console.print(f"  {line}")


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
    spec = spec_from_args(args, args.topology, args.workload, args.strategy)
    traces = trace_paths(args.trace, args.trace_format,
                         api.load_machine(spec.topology, spec.gpus,
                                          nnodes=spec.nnodes).n_gpus) if args.trace else []
    check_outputs([*traces, args.gantt, args.memory_png])  # before minutes of work
    what = "the step" if args.no_ranges else "the step and its range"
    with terminal.progress(f"simulating {what}"):  # shows only past two seconds
        result = api.simulate(spec, prices=price_flags.prices(args), ranges=not args.no_ranges)
    write_outputs(result, args)
    if args.json:
        print(jsondoc.dumps(result.report))
    else:
        print_text(result)
    return no_fit_status(args, result.report["memory"])

