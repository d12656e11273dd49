"""A measured step of the user's own job, on their GPU: its achieved share of modelled compute.

stepsim models kernels from FLOPs and bytes (job/compute.py); a real job also pays for what
the model leaves out (its data loader, Python, kernels it does not list). Given the measured
step time of the job on one GPU (or K), the fraction ``f`` is the one at which the simulated
step equals it, every kernel's time divided by ``f`` (job/compute.py ``achieved``):
``brentq`` on the simulated step, which falls monotonically as ``f`` grows.
"""

from __future__ import annotations

from dataclasses import replace

from scipy.optimize import brentq

from simulator import api, engine, strategies
from simulator.errors import InputError
from simulator.inputs.schema import ComputeCalibration
from simulator.machine.topology import Machine

FRACTION_RANGE = (0.02, 20.0)  # a measured step 50x slower or 20x faster than modelled: a typo


def _step(spec: api.RunSpec, machine: Machine, fraction: float) -> float:
    job = api.job_of(spec)
    machine = machine.for_job(job.name, job.software, precision=job.precision)
    cards = replace(machine, gpu=replace(machine.gpu, achieved_fraction=fraction),
                    gpus=tuple(replace(g, achieved_fraction=fraction) for g in machine.gpus))
    programs = strategies.build(spec.strategy, job, cards, api.options_of(spec))
    comm = api.load_communicator(spec.topology, spec.gpus, spec.scales, spec.nccl, spec.nnodes)
    return float(engine.simulate(programs, comm, compute_slowdown=spec.compute_slowdown)
                 .step_time)


def fit(spec: api.RunSpec, measured_step_s: float) -> ComputeCalibration:
    """The achieved fraction of ``spec``'s job on its machine's GPU from one measured step."""
    if measured_step_s <= 0:
        raise InputError(f"--step-time must be positive, got {measured_step_s}")
    machine = api.load_machine(spec.topology, spec.gpus, nnodes=spec.nnodes)
    if len(machine.cards()) > 1:
        raise InputError("--step-time on a box of mixed cards: give --gpus K so the first K "
                         "GPUs are one kind of card")
    modelled = _step(spec, machine, 1.0)
    low, high = FRACTION_RANGE
    gap_low = _step(spec, machine, low) - measured_step_s
    gap_high = _step(spec, machine, high) - measured_step_s
    if gap_low < 0 or gap_high > 0:
        raise InputError(f"--step-time {measured_step_s:g} s is outside what any compute speed "
                         f"gives here ({_step(spec, machine, high):.4g} - "
                         f"{_step(spec, machine, low):.4g} s); check the job's flags")
    fraction = brentq(lambda f: _step(spec, machine, f) - measured_step_s, low, high,
                      rtol=1e-6)
    job = api.job_of(spec)
    return ComputeCalibration(
        workload=job.name, gpu=machine.gpu.name, achieved_fraction=round(float(fraction), 4),
        measured_step_s=measured_step_s, modelled_step_s=round(modelled, 6),
        source=f"measured step of {job.name} ({spec.strategy}, {machine.n_gpus} GPU"
               f"{'s' if machine.n_gpus > 1 else ''}, micro-batch {job.micro_batch}, "
               f"seq {job.seq_len}): {measured_step_s:g} s against {modelled:.4g} s modelled")
