"""`stepsim calibrate`: fit a topology to the user's own measurements.

``stepsim calibrate -t TOPOLOGY LOG... [--fit-max SIZE] [-o OUT.yaml]`` fits the wire's
physical parameters to nccl-tests logs (calibration/collectives_fit.py) and prints measured,
fitted and error per size (rows above ``--fit-max`` are predictions), then each fitted value
and each parameter left at its default with the reason. ``stepsim calibrate -t TOPOLOGY -w
WORKLOAD --step-time SECONDS [--gpus 1]`` turns one measured step of the user's job into its
achieved compute fraction (calibration/compute_step.py). Both can be given at once. ``-o``
writes the calibrated topology (the input file plus its ``calibration`` block).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from simulator import api
from simulator.errors import InputError
from simulator.inputs import nccl_tests_log
from simulator.inputs.schema import (
    CALIBRATION_PARAMETERS,
    MAX_BOXES,
    FittedValue,
    UnfittedValue,
)
from simulator.units import format_size, parse_size, positive_int


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit a topology to your nccl-tests logs and a measured GPU step",
        description="Fit the machine's physical parameters to nccl-tests logs (per-transport "
                    "efficiency, per-hop latency, host memory, socket link, per-channel cap) "
                    "and/or record the achieved compute of one measured step of your job.")
    parser.add_argument("logs", nargs="*", metavar="LOG", help="nccl-tests output files")
    parser.add_argument("--fit-max", metavar="SIZE",
                        help="fit on rows up to this size; larger rows are predicted")
    parser.add_argument("--step-time", type=float, metavar="SECONDS",
                        help="a measured training step of the job given by -w")
    parser.add_argument("-o", "--output", metavar="OUT.yaml",
                        help="write the calibrated topology here")
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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from simulator.calibration import compute_step, record  # scipy: only when calibrating

    if not args.logs and args.step_time is None:
        raise InputError("give nccl-tests LOG files, or -w WORKLOAD --step-time SECONDS")
    if args.step_time is not None and not args.workload:
        raise InputError("--step-time needs the job it measured: -w WORKLOAD")
    nnodes = positive_int(args.nnodes, "--nnodes", maximum=MAX_BOXES)
    with api.blame(args.topology, "topologies"):
        comm = api.load_communicator(args.topology, nnodes=nnodes)
    calibration = comm.machine.calibration
    if args.logs:
        calibration = _fit_logs(args, comm, calibration)
    if args.step_time is not None:
        spec = api.RunSpec(
            args.topology, args.workload, api.check_strategy(args.strategy),
            gpus=positive_int(args.gpus, "--gpus") or 1,
            micro_batch=positive_int(args.micro_batch, "--micro-batch"),
            grad_accum=positive_int(args.grad_accum, "--grad-accum"),
            seq_len=positive_int(args.seq_len, "--seq-len"))
        step = compute_step.fit(spec, args.step_time)
        print(f"compute: {step.workload} on {step.gpu} reaches {step.achieved_fraction:.1%} of "
              f"the modelled speed ({step.source})")
        calibration = record.merged(calibration, compute=step,
                                    source=f"stepsim calibrate --step-time {args.step_time:g}")
    if args.output:
        assert calibration is not None
        record.write(args.topology, calibration, args.output)
        print(f"wrote {args.output}: {args.topology} with its calibration block")
    else:
        print("(give -o OUT.yaml to write the calibrated topology)")
    return 0


def _fit_logs(args: argparse.Namespace, comm: api.Communicator, old: Any) -> Any:
    from simulator.calibration import collectives_fit, record

    fit_max = parse_size(args.fit_max) if args.fit_max else None
    logs = []
    for name in args.logs:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read the file: {exc.strerror or exc}",
                             file=name) from None
        logs.append(nccl_tests_log.parse(text, name))
    result = collectives_fit.fit(comm, logs, fit_max)
    for log in logs:
        print(f"{Path(log.source).name}: {log.op} on {log.gpus} GPUs, {len(log.rows)} sizes"
              + (f", fitted up to {format_size(fit_max)}" if fit_max else ""))
        print(f"  {'size':>12}  {'measured':>9}  {'fitted':>9}  {'error':>7}  (busbw GB/s)")
        for row in (r for r in result.rows if r.log == log.source):
            print(f"  {row.bytes:>12}  {row.measured_busbw:>9.2f}  {row.fitted_busbw:>9.2f}  "
                  f"{row.error:>+7.1%}  {row.role}")
    scope = ", ".join(f"{Path(log.source).name} ({log.op}, {log.gpus} GPUs)" for log in logs)
    sizes = f"sizes up to {format_size(fit_max)}" if fit_max else "all sizes"
    source = f"least squares on {scope}, {sizes}"
    print(f"fitted ({source}; rms error {result.rms_error:.1%}):")
    fitted = []
    for name, value in result.fitted.items():
        default = result.defaults.get(name)
        unit = CALIBRATION_PARAMETERS[name][1]
        print(f"  {name:<28} {_show(default):>9} -> {value:9.4g} {unit}   "
              f"({CALIBRATION_PARAMETERS[name][0]})")
        fitted.append(FittedValue(parameter=name, value=round(value, 6),
                                  default=None if default is None or not math.isfinite(default)
                                  else round(default, 6),
                                  source=source, rms_error=round(result.rms_error, 4)))
    if not fitted:
        print("  nothing: no parameter is determined by these rows")
    print("left at stepsim's defaults:")
    left = [UnfittedValue(parameter=name, reason=why) for name, why in result.left.items()]
    for item in left:
        print(f"  {item.parameter:<28} {item.reason}")
    return record.merged(old, source=f"stepsim calibrate: {scope}, {sizes}", fitted=fitted,
                         left=left)


def _show(value: float | None) -> str:
    if value is None:
        return "(links)"
    return "none" if not math.isfinite(value) else f"{value:.4g}"
