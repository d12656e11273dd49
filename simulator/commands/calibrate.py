"""`stepsim calibrate`: fit a topology to the user's own measurements.

``stepsim calibrate -t TOPOLOGY LOG... [--fit-max SIZE] [-o OUT.yaml]`` fits the wire's
physical parameters to nccl-tests logs (calibration/collectives_fit.py) and prints measured,
fitted and error per size (rows above ``--fit-max`` are predictions), then each fitted value
and each parameter left at its default with the reason. ``stepsim calibrate -t TOPOLOGY -w
WORKLOAD --step-time SECONDS [--gpus 1]`` turns one measured step of the user's job into its
achieved compute fraction (calibration/compute_step.py); with ``--fit transport`` a measured
step on several GPUs gives the rate of the transport its collectives cross instead
(calibration/transport_step.py), compute as modelled or as calibrated before. The job takes
`stepsim run`'s recipe flags (offload, DeepSpeed config, ...). Both can be given at once.
``-o`` writes the calibrated topology (the input file plus its ``calibration`` block).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from simulator import api
from simulator.commands import recipe_flags
from simulator.errors import InputError
from simulator.inputs import nccl_tests_log
from simulator.inputs.schema import (
    CALIBRATION_PARAMETERS,
    MAX_BOXES,
    FittedValue,
    UnfittedValue,
)
from simulator.units import format_size, parse_size, positive_float, positive_int

FITS = ("compute", "transport")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit a topology to your nccl-tests logs and a measured GPU step",
        description="Fit the machine's physical parameters to nccl-tests logs (per-transport "
                    "efficiency, per-hop latency, host memory, socket link, per-channel cap) "
                    "and/or record the achieved compute of one measured step of your job.")
    parser.add_argument("logs", nargs="*", metavar="LOG", help="nccl-tests output files")
    parser.add_argument("--fit-max", metavar="SIZE",
                        help="fit on rows up to this size; larger rows are predicted")
    parser.add_argument("--step-time", metavar="SECONDS",
                        help="a measured training step of the job given by -w")
    parser.add_argument("-o", "--output", metavar="OUT.yaml",
                        help="write the calibrated topology here")
    parser.add_argument("--force", action="store_true",
                        help="fit logs that contradict the topology (another transport, GPU "
                             "model or link rate than it gives); the result says it was forced")
    parser.add_argument("-t", "--topology", required=True, help="topology YAML or preset name")
    parser.add_argument("-w", "--workload", help="the job --step-time measured (YAML or preset)")
    parser.add_argument("-s", "--strategy", default="ddp", help="as in `stepsim run` (ddp)")
    parser.add_argument("--gpus", default=None, help="GPUs the step ran on (default 1)")
    parser.add_argument("--nnodes", default=None,
                        help="boxes the logs ran on (torchrun's --nnodes; mpirun -np N with "
                        "-g GPUs each): fits the network between them as well")
    parser.add_argument("--micro-batch", help="sequences per GPU per micro-step")
    parser.add_argument("--grad-accum", help="micro-steps per optimizer step")
    parser.add_argument("--seq-len", help="tokens per sequence")
    parser.add_argument("--fit", default="compute", choices=FITS,
                        help="what --step-time calibrates: compute (the job's achieved share "
                        "of modelled compute; default) | transport (the rate of the transport "
                        "the job's collectives cross, for a step on several GPUs whose "
                        "compute is modelled or calibrated)")
    recipe_flags.add_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from simulator.calibration import record  # scipy: only when calibrating

    if not args.logs and args.step_time is None:
        raise InputError("give nccl-tests LOG files, or -w WORKLOAD --step-time SECONDS")
    if args.step_time is not None and not args.workload:
        raise InputError("--step-time needs the job it measured: -w WORKLOAD")
    nnodes = positive_int(args.nnodes, "--nnodes", maximum=MAX_BOXES)
    with api.blame(args.topology, "topologies"):
        comm = api.load_communicator(args.topology, nnodes=nnodes)
    calibration = comm.machine.calibration
    report: list[str] = []
    if args.logs:
        calibration, report = _fit_logs(args, comm, calibration)
    if args.step_time is not None:
        spec = api.configured(api.RunSpec(
            args.topology, args.workload, api.check_strategy(args.strategy),
            gpus=positive_int(args.gpus, "--gpus") or 1,
            micro_batch=positive_int(args.micro_batch, "--micro-batch"),
            grad_accum=positive_int(args.grad_accum, "--grad-accum"),
            seq_len=positive_int(args.seq_len, "--seq-len"),
            **recipe_flags.fields_from_args(args)))
        seconds = positive_float(args.step_time, "--step-time")
        assert seconds is not None
        fit = _fit_transport if args.fit == "transport" else _fit_compute
        calibration, lines = fit(spec, seconds, calibration)
        report += lines
    if args.output:  # written before anything is printed: `calibrate ... -o X | head` keeps X
        assert calibration is not None
        record.write(args.topology, calibration, args.output)
        report.append(f"wrote {args.output}: {args.topology} with its calibration block")
    else:
        report.append("(give -o OUT.yaml to write the calibrated topology)")
    for line in report:
        print(line)
    return 0


def _fit_compute(spec: api.RunSpec, seconds: float, old: Any) -> tuple[Any, list[str]]:
    from simulator.calibration import compute_step, record

    step = compute_step.fit(spec, seconds)
    lines = [f"compute: {step.workload} on {step.gpu} reaches {step.achieved_fraction:.1%} of "
             f"the modelled speed ({step.source})"]
    if (spec.gpus or 1) > 1:
        lines.append("  (all of the difference taken as compute's: where the run's "
                     "communication shows, --fit transport gives it to the transport instead)")
    return record.merged(old, compute=step,
                         source=f"stepsim calibrate --step-time {seconds:g}"), lines


def _fit_transport(spec: api.RunSpec, seconds: float, old: Any) -> tuple[Any, list[str]]:
    from simulator.api.ranges import WORDS
    from simulator.calibration import record, transport_step

    result = transport_step.fit(spec, seconds)
    value = result.fitted
    meaning, unit = CALIBRATION_PARAMETERS[value.parameter]
    assert value.default is not None and value.low is not None and value.high is not None
    before, after = result.busbw_gbps
    lines = [f"transport: {WORDS[result.mechanism]}, from a {value.source}",
             f"  {value.parameter:<28} {value.default:>9.4g} -> {value.value:9.4g} {unit:<4} "
             f"({value.value / value.default:.2f}x; in [{value.low:.4g}, {value.high:.4g}]: "
             f"{meaning})",
             f"  as nccl-tests would time it alone: all_reduce_perf of "
             f"{format_size(transport_step.NCCL_TESTS_BYTES)} over {spec.gpus} GPUs, busbw "
             f"{before:.2f} -> {after:.2f} GB/s"]
    if value.at_bound is not None:
        bound = result.bound
        means = bound.low_means if value.at_bound == "floor" else bound.high_means
        lines.append(f"    at its {value.at_bound}: {means}; it narrows no range")
    return record.merged(old, transport=value,
                         source=f"stepsim calibrate --fit transport --step-time "
                                f"{seconds:g}"), lines


def _fit_logs(args: argparse.Namespace, comm: api.Communicator, old: Any
              ) -> tuple[Any, list[str]]:
    from simulator.calibration import checks, collectives_fit, record

    fit_max = parse_size(args.fit_max) if args.fit_max else None
    logs = []
    for name in args.logs:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read the file: {exc.strerror or exc}",
                             file=name) from None
        log = nccl_tests_log.parse(text, name)
        if (warning := log.warning()) is not None:
            print(f"{name}: warning: {warning}", file=sys.stderr)
        logs.append(log)
    runs = [checks.run_of(log, comm, args.topology) for log in logs]
    problems = [p for run in runs for p in checks.contradictions(run, args.topology)]
    if problems and not args.force:
        raise InputError(f"{problems[0]} (--force fits it anyway)")
    for problem in problems:
        print(f"warning: forced: {problem}", file=sys.stderr)
    result = collectives_fit.fit(runs, fit_max)
    lines = []
    for run in runs:
        lines += _describe(run, args.topology, fit_max, result)
        lines.append(f"  {'size':>12}  {'measured':>9}  {'fitted':>9}  {'error':>7}  (busbw GB/s)")
        lines += [f"  {row.bytes:>12}  {row.measured_busbw:>9.2f}  {row.fitted_busbw:>9.2f}  "
                  f"{row.error:>+7.1%}  {row.role}" for row in result.rows if row.log == run.name]
    scope = ", ".join(f"{Path(r.name).name} ({r.log.op}, {len(r.ranks)} GPUs)" for r in runs)
    sizes = f"sizes up to {format_size(fit_max)}" if fit_max else "all sizes"
    source = f"least squares on {scope}, {sizes}"
    n_fit = sum(1 for r in result.rows if r.role == "fit")
    rounds = (f"settled after {result.rounds} round{'s' if result.rounds > 1 else ''}"
              if result.settled else f"alternated over {result.rounds} rounds; the better fit "
              "kept")
    lines.append(f"fitted ({source}; rms error {result.rms_error:.1%} over the {n_fit} fitted "
                 f"rows above; the parameters that bind {rounds}):")
    fitted = []
    for name, value in result.fitted.items():
        default = result.defaults.get(name)
        meaning, unit = CALIBRATION_PARAMETERS[name]
        bound = result.bounds[name]
        lines.append(f"  {name:<28} {_show(default):>9} -> {value:9.4g} {unit:<4} in "
                     f"{bound.text(unit):<16} ({meaning})")
        where = result.at_bound.get(name)
        if where is not None:
            means = bound.low_means if where == "floor" else bound.high_means
            lines.append(f"    at its {where}: {means}; it narrows no range")
        fitted.append(FittedValue(
            parameter=name, value=round(value, 6),
            default=None if default is None or not math.isfinite(default) else round(default, 6),
            source=source, rms_error=round(result.rms_of(name), 4),
            low=round(bound.low, 6), high=round(bound.high, 6), at_bound=where))
    if not fitted:
        lines.append("  nothing: no parameter is determined by these rows")
    lines.append("left at stepsim's defaults:")
    left = [UnfittedValue(parameter=name, reason=why) for name, why in result.left.items()]
    lines += [f"  {item.parameter:<28} {item.reason}" for item in left]
    forced = "; ".join(problems)
    if forced:
        lines.append(f"forced: {forced}")
    return record.merged(old, source=f"stepsim calibrate: {scope}, {sizes}", fitted=fitted,
                         left=left, forced=forced), lines


def _describe(run: Any, topology: str, fit_max: int | None, result: Any) -> list[str]:
    """What the log is and how it ran: its GPUs of the topology, NCCL, its variables."""
    log = run.log
    nodes = ", ".join(run.comm.machine.gpu_nodes[r] for r in run.ranks)
    head = (f"{Path(log.source).name}: {log.op} on {len(run.ranks)} GPUs of {topology} "
            f"({nodes}: {run.chosen_by}), {len(log.rows)} rows"
            + (f", fitted up to {format_size(fit_max)}" if fit_max else ""))
    ran = [f"NCCL {log.nccl_version}" if log.nccl_version else "NCCL version not in the log",
           f"as run with {run.comm.env.line()}" if run.comm.env.active
           else "no NCCL_* variable in the log"]
    if log.transports:
        ran.append(f"NCCL's lines say {'/'.join(sorted(log.transports))}")
    lines = [head, f"  {'; '.join(ran)}"]
    total, used = result.thinned.get(run.name, (0, 0))
    if used < total:
        lines.append(f"  {total} sizes: the fit and the table use {used}, evenly spaced in log "
                     "size")
    return lines


def _show(value: float | None) -> str:
    if value is None:
        return "(links)"
    return "none" if not math.isfinite(value) else f"{value:.4g}"
