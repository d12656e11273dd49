"""A measured step of the user's job on several GPUs: the rate of the transport its collectives
cross, where no nccl-tests log of the box measures it.

Boxes of one kind differ by several times in their transports (validation/box-spread.yaml:
no-P2P RTX 4090 boxes all-reduce through host memory at 2.2 to 18 GB/s busbw), so a measured
step whose communication shows is evidence of the box's own rate. The transport's efficiency
parameter (nccl/wire.py) is the one at which the simulated step equals the measured one, with
compute as modelled or as a measured step of the job calibrated it (compute_step.py):
``brentq`` within the parameter's physical bounds (bounds.py); the step falls as the rate
grows. The rate is effective: it takes in whatever shares the transport's links in that job
(offload copies, gradient copies), so it can lie below what nccl-tests would measure alone.
A step whose communication hides under compute cannot tell the rate, and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.optimize import brentq

from simulator import api, engine
from simulator.api.ranges import WORDS, mechanisms_used
from simulator.calibration.bounds import Bound, at, bounds, start
from simulator.errors import InputError
from simulator.inputs.schema import FittedValue
from simulator.nccl.perf import time_alone

# the wire parameter that sets each transport's rate (nccl/wire.py, WireParams)
PARAMETER = {"shm": "shm_pcie_efficiency", "pcie_p2p": "p2p_pcie_simple_efficiency",
             "nvlink": "nvlink_simple_efficiency", "net_ib": "net_efficiency",
             "net_socket": "socket_stream_gbps"}
# The step must move by this much between the fitted rate and half of it: below, the
# communication hides under compute and the rate is not determined (assumption: a few times
# the 2% run-to-run noise of a measured step, ranges.py NOISE_FLOOR).
SENSITIVITY = 0.05
NCCL_TESTS_BYTES = 1 << 30  # the all-reduce size the fitted rate is also shown at


@dataclass(frozen=True)
class TransportFit:
    """The fitted parameter, and what it means for the run and for nccl-tests."""

    fitted: FittedValue
    mechanism: str  # machine/scales.py name
    modelled_step_s: float
    busbw_gbps: tuple[float, float]  # a 1 GiB all-reduce over the run's GPUs: before, after
    bound: Bound  # the parameter's physical bounds, and what ending on one means


def fit(spec: api.RunSpec, measured_step_s: float) -> TransportFit:
    """The rate of the transport ``spec``'s collectives cross that gives its measured step."""
    if measured_step_s <= 0:
        raise InputError(f"--step-time must be positive, got {measured_step_s}")
    result = api.simulate(spec, baseline=False)
    mechanism = _mechanism(result)
    name = PARAMETER[mechanism]
    comm = result.comm
    bound = bounds(comm)[name]
    default = start(comm, name)
    assert default is not None  # every transport's rate has a value

    def step(value: float) -> float:
        return float(engine.step_time(result.programs, at(comm, {name: value}),
                                      compute_slowdown=spec.compute_slowdown))

    modelled = result.timeline.step_time
    fastest, slowest = step(bound.high), step(bound.low)
    if not fastest <= measured_step_s <= slowest:
        raise InputError(
            f"--step-time {measured_step_s:g} s is outside what any rate of "
            f"{WORDS[mechanism]} gives here ({fastest:.4g} - {slowest:.4g} s): the difference "
            f"is not the transport's; calibrate compute first (--fit compute on one GPU)")
    value = float(brentq(lambda v: step(v) - measured_step_s, bound.low, bound.high,
                         rtol=1e-6))
    moved = step(value / 2) / measured_step_s - 1
    if moved < SENSITIVITY:
        raise InputError(
            f"--fit transport: the step hides its communication ({moved:.1%} longer at half "
            f"the rate), so it cannot tell {WORDS[mechanism]}'s rate; give an nccl-tests log "
            f"of the box instead")
    job = result.job
    source = (f"measured step of {job.name} ({spec.strategy}, {result.machine.n_gpus} GPUs, "
              f"micro-batch {job.micro_batch}, grad-accum {job.grad_accum}, seq "
              f"{job.seq_len}): {measured_step_s:g} s against {modelled:.4g} s modelled; an "
              f"effective rate, with what shares its links in that job")
    fitted = FittedValue(parameter=name, value=round(value, 6), default=round(default, 6),
                         source=source, low=round(bound.low, 6), high=round(bound.high, 6),
                         at_bound=bound.where(value))
    ranks = tuple(range(result.machine.n_gpus))
    before = time_alone(comm, "allreduce", NCCL_TESTS_BYTES, ranks).busbw_gbps
    after = time_alone(at(comm, {name: value}), "allreduce", NCCL_TESTS_BYTES,
                       ranks).busbw_gbps
    return TransportFit(fitted, mechanism, modelled, (before, after), bound)


def _mechanism(result: api.RunResult) -> str:
    """The one transport the run's communication crosses (NVLink left out beside another:
    it is the best measured)."""
    used = [m for m in mechanisms_used(result) if m != "compute"]
    if len(used) > 1:
        used = [m for m in used if m != "nvlink"]
    if not used:
        raise InputError("--fit transport: the run has no collectives between GPUs (one GPU?): "
                         "give the GPUs it ran on (--gpus K)")
    if len(used) > 1:
        raise InputError(f"--fit transport: the run's collectives cross "
                         f"{' and '.join(WORDS[m] for m in used)}; one step cannot tell them "
                         f"apart: give nccl-tests logs of the box instead")
    return used[0]
