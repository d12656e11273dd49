"""The Python entry point to stepsim: specs in, results out. Every command calls it.

- ``simulate(RunSpec(...)) -> RunResult``: one training step (the `stepsim run` pipeline:
  machine and job from their YAML or preset names, the strategy's programs, the engine, the
  report with its confidence grade; ``ranges=True`` adds the ranges of ranges.py).
- ``answer(RunSpec(...)) -> dict``: what the commands print for a spec: the simulated report
  when the job fits, its memory verdict alone when it does not (answers.py).
- ``memory(RunSpec(...)) -> MemoryResult``: the same spec's memory verdict without
  simulating (`stepsim memory`), optionally with the largest micro-batch or model that fits.
- ``collective(CollectiveSpec(...)) -> list[Result]``: one NCCL collective over a range of
  sizes, each alone on idle links, as nccl-tests times it (`stepsim collective`).
- ``load_machine(topology, gpus)``, ``load_communicator(topology, gpus, env=...)`` (NCCL over
  it: transports, rings) and ``presets(kind)``: a machine and the bundled inputs.
- ``advise(machines, workload, executor=...)``: `stepsim advise`'s whole answer, its
  candidates run on any ``concurrent.futures`` executor (advice/advise.py).

Specs are frozen dataclasses (hashable, picklable), so they cross process boundaries: a
sweep can fan out over ``concurrent.futures``, Dask or Ray and call ``simulate`` in each
worker (``RunResult.report`` is plain JSON-able data; docs/api.md shows a Dask sweep).
Machines and jobs are cached per process, so sweeps and comparisons build each once.

Each name is imported from its module when first asked for, so a command loads only what it
uses (``stepsim collective`` no strategy, ``stepsim presets`` nothing but the preset index).

>>> from simulator import api
>>> r = api.simulate(api.RunSpec("8x5090-switch", "llama2-7b-lora", "ddp"))  # doctest: +SKIP
>>> round(r.report["step_time_s"], 3)  # doctest: +SKIP
1.45
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.api.answers import answer, answer_all, fits, largest_micro_batch, outcome
    from simulator.api.confidence import grade_run
    from simulator.api.runner import (
        RunResult,
        clear_caches,
        degrees,
        presets,
        recipe,
        run,
        simulate,
        single_gpu_tokens_per_s,
        step_time,
    )
    from simulator.api.spec import (
        MAX_SIMULATED_OPS,
        TRAINING_OVERRIDES,
        RunSpec,
        check_offload,
        check_optimizer,
        check_size,
        configured,
        job_of,
        load_job,
        memory_scheme,
        options_of,
        tp_degree,
        with_adapters,
    )
    from simulator.api.verdict import (
        MemoryResult,
        fullest,
        memory,
        memory_of,
        memory_reports,
        pipeline_of,
        pipeline_split,
        strategy_options,
    )
    from simulator.inputs.config import load_topology, load_workload
    from simulator.machine.build import blame, load_machine
    from simulator.machine.topology import Machine
    from simulator.memory.report import MOMENTS, MemoryReport, alive
    from simulator.nccl.collectives import OPS
    from simulator.nccl.communicator import Communicator, load_communicator, transport_effects
    from simulator.nccl.env import NO_ENV, NcclEnv
    from simulator.nccl.perf import CollectiveSpec, Result, collective
    from simulator.strategies.options import (
        STRATEGIES,
        check_recipe,
        check_strategy,
        unused_flags,
    )

# name -> the module that holds it. ``advise`` and ``PricedMachine`` live in advice/, which is
# built on this package: named here so that scripts reach everything through one entry point,
# imported only when asked for (never while this package loads, so no import circle).
_HOME = {
    **dict.fromkeys(("advise", "PricedMachine"), "simulator.advice.advise"),
    **dict.fromkeys(("answer", "answer_all", "fits", "largest_micro_batch", "outcome"),
                    "simulator.api.answers"),
    "grade_run": "simulator.api.confidence",
    **dict.fromkeys(("RunResult", "clear_caches", "degrees", "presets", "recipe", "run",
                     "simulate", "single_gpu_tokens_per_s", "step_time"), "simulator.api.runner"),
    **dict.fromkeys(("MAX_SIMULATED_OPS", "TRAINING_OVERRIDES", "RunSpec", "check_offload",
                     "check_optimizer", "check_size", "configured", "job_of", "load_job",
                     "memory_scheme", "options_of", "tp_degree", "with_adapters"),
                    "simulator.api.spec"),
    **dict.fromkeys(("MemoryResult", "fullest", "memory", "memory_of", "memory_reports",
                     "pipeline_of", "pipeline_split", "strategy_options"),
                    "simulator.api.verdict"),
    **dict.fromkeys(("load_topology", "load_workload"), "simulator.inputs.config"),
    **dict.fromkeys(("blame", "load_machine"), "simulator.machine.build"),
    "Machine": "simulator.machine.topology",
    **dict.fromkeys(("MOMENTS", "MemoryReport", "alive"), "simulator.memory.report"),
    "OPS": "simulator.nccl.collectives",
    **dict.fromkeys(("Communicator", "load_communicator", "transport_effects"),
                    "simulator.nccl.communicator"),
    **dict.fromkeys(("NO_ENV", "NcclEnv"), "simulator.nccl.env"),
    **dict.fromkeys(("CollectiveSpec", "Result", "collective"), "simulator.nccl.perf"),
    **dict.fromkeys(("STRATEGIES", "check_recipe", "check_strategy", "unused_flags"),
                    "simulator.strategies.options"),
}

__all__ = ["CollectiveSpec", "PricedMachine", "advise", "Communicator", "MAX_SIMULATED_OPS",
           "MOMENTS", "Machine",
           "MemoryReport", "MemoryResult", "NO_ENV", "NcclEnv", "OPS", "Result", "RunResult",
           "RunSpec", "STRATEGIES", "TRAINING_OVERRIDES", "alive", "answer", "answer_all", "blame",
           "check_offload", "fits", "grade_run", "largest_micro_batch",
           "check_optimizer", "check_recipe", "check_size", "check_strategy", "clear_caches",
           "collective", "configured", "degrees", "fullest", "job_of", "load_communicator",
           "load_job", "load_machine", "load_topology", "load_workload", "memory", "memory_of",
           "memory_reports", "memory_scheme", "options_of", "outcome", "pipeline_of",
           "pipeline_split",
           "presets", "recipe", "run", "simulate", "single_gpu_tokens_per_s", "step_time",
           "strategy_options", "tp_degree", "transport_effects", "unused_flags",
           "with_adapters"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # asked once
    return value
