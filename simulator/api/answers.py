"""A spec's answer as the commands give it: simulated when the job fits, its memory verdict
when it does not.

A step that runs out of memory has no step time, throughput or price, so ``answer`` does not
print them as if it ran: it checks the spec as ``simulate`` would (one line of InputError),
judges its memory without simulating (milliseconds), and returns either the simulated report
or the verdict alone, ``{"simulated": false, "memory": {...}, ...}``. ``simulate_anyway``
simulates a job that does not fit and marks the report ``"simulated_anyway": true``: every
figure in it is what the step would take if it fit. ``simulate`` itself always simulates.

``answer_all`` answers many specs (a comparison, a sweep) in order, on any executor with the
``concurrent.futures`` interface (a process pool, Dask's ``client.get_executor()``, ...) or
here; ``gantt=True`` adds each simulated step's lanes (outputs/lanes.py) as plain data under
``"gantt"``, so a worker process can send the pictures back with the figures.

``largest_micro_batch`` is ``--micro-batch max``: the largest micro-batch whose verdict fits
(GPU and host memory), searched as `stepsim memory --micro-batch max` searches it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from functools import partial
from typing import Any

from simulator.api.runner import RunResult, _job_and_machine, check, recipe, simulate
from simulator.api.spec import RunSpec, _tp_degree, configured
from simulator.api.verdict import memory, memory_of
from simulator.outputs import cost


def fits(mem: Mapping[str, Any]) -> bool:
    """GPU memory holds the job, and host RAM holds what it offloads."""
    return bool(mem["fits"]) and mem.get("host_fits", True) is not False


def outcome(spec: RunSpec, *, prices: cost.Prices | None = None, ranges: bool = False,
            simulate_anyway: bool = False, baseline: bool = True, gantt: bool = False
            ) -> tuple[dict[str, Any], RunResult | None]:
    """``answer``'s report, and the run it came from (None: not simulated), for a command
    that also writes the run's trace or pictures."""
    spec = configured(spec)
    job, machine, _ = _job_and_machine(spec)
    check(spec, job, machine)
    mem = memory_of(spec)
    if not fits(mem) and not simulate_anyway:
        tp = _tp_degree(spec, machine)
        return {"topology": machine.name, "workload": job.name, "strategy": spec.strategy,
                "gpu": machine.gpu.name, "gpus": machine.n_gpus, "simulated": False,
                "recipe": recipe(spec, job),
                "parallelism": {"world": machine.n_gpus, "tp": tp, "pp": spec.pp,
                                "dp": machine.n_gpus // (tp * spec.pp),
                                **({"ep": spec.ep} if spec.ep > 1 else {})},
                "micro_batch": job.micro_batch, "seq_len": job.seq_len,
                "grad_accum": job.grad_accum, "memory": mem}, None
    result = simulate(spec, baseline=baseline, prices=prices, ranges=ranges)
    if not fits(result.report["memory"]):
        result.report["simulated_anyway"] = True
    if gantt:
        from simulator.outputs.lanes import gantt_data  # only for a picture

        result.report["gantt"] = gantt_data(result.timeline)
    return result.report, result


def answer(spec: RunSpec, *, prices: cost.Prices | None = None, ranges: bool = False,
           simulate_anyway: bool = False, baseline: bool = True,
           gantt: bool = False) -> dict[str, Any]:
    """The report of `run --json` for a job that fits (``simulate(spec).report``); for one that
    does not, its memory verdict and what was asked, not simulated (``simulate_anyway``: the
    simulated report, marked)."""
    return outcome(spec, prices=prices, ranges=ranges, simulate_anyway=simulate_anyway,
                   baseline=baseline, gantt=gantt)[0]


def _answer_point(point: tuple[RunSpec, cost.Prices | None], **options: Any) -> dict[str, Any]:
    spec, prices = point
    return answer(spec, prices=prices, **options)


def answer_all(specs: Sequence[RunSpec], *,
               prices: cost.Prices | Sequence[cost.Prices | None] | None = None,
               executor: Executor | None = None,
               progress: Callable[[int, int], None] | None = None,
               **options: Any) -> list[dict[str, Any]]:
    """``answer`` of every spec, in order: on ``executor`` (any ``concurrent.futures``
    executor; specs and reports pickle) or here. ``prices``: one for all, or one per spec;
    ``options``: answer's keywords. Bad input in any spec raises its InputError here."""
    each = (list(prices) if isinstance(prices, Sequence) else [prices] * len(specs))
    points = list(zip(specs, each, strict=True))
    work = partial(_answer_point, **options)
    results = executor.map(work, points) if executor is not None else map(work, points)
    out: list[dict[str, Any]] = []
    for report in results:
        out.append(report)
        if progress is not None:
            progress(len(out), len(points))
    return out


def largest_micro_batch(spec: RunSpec) -> int:
    """The largest micro-batch of ``spec`` that fits in GPU and host memory (0: not even 1)."""
    spec = replace(configured(spec), micro_batch=None)
    spec = replace(spec, explicit=spec.explicit | {"micro_batch"})  # searched, not the file's
    return int(memory(spec, largest_micro_batch=True).summary["largest_micro_batch"])
