"""Fit the wire's physical parameters (simulator/nccl/wire.py) to nccl-tests logs.

Each log row is a measured time at one size; the model is ``perf.time_alone`` on the GPUs the
log ran on, under its NCCL variables (checks.py), with the candidate parameters.
``scipy.optimize.least_squares`` minimises the log of modelled over measured time over every row
up to ``fit_max`` (both column halves; a soft-L1 loss so one odd row, like a dip of the in-place
half, does not pull the fit, after a plain least-squares start), each parameter inside its
physical bounds (bounds.py); a value that ends on a bound is reported as such.

A parameter is fitted only where the logs determine it: some row must use what it stands for,
a 10% change must move some row's time by more than ``MIN_EFFECT``, and its effect must differ
in shape from those already chosen (the columns of the normalised Jacobian stay independent: a
per-call start-up and a per-step latency look the same to logs of one GPU count). Which
parameters bind depends on where the others are (a cap binds only once an efficiency leaves it
room), so the screen is repeated at the fitted point and the fit redone until the set stops
changing: at most ``MAX_ROUNDS`` rounds, and a set seen before ends the loop with the better of
the two fits.

Large logs are thinned: at most ``MAX_SIZES`` sizes each side of ``fit_max``, evenly spaced in
log size, and at most ``MAX_SAMPLES`` measurements of a size (both halves of its first rows).
The table shows exactly the sizes used, the rms is over its fitted rows, and the per-parameter
residual ranges take (``rms_of``) counts every row of the table the parameter applies to.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from scipy.optimize import least_squares

from simulator.calibration.bounds import Bound, at, bounds, start
from simulator.calibration.checks import Run
from simulator.errors import InputError
from simulator.machine.topology import Machine
from simulator.nccl import collectives, wire
from simulator.nccl.perf import time_alone
from simulator.units import GB

# Bandwidth-like parameters first (the plateau is what a log pins best), then latencies.
ORDER = ("p2p_pcie_simple_efficiency", "nvlink_simple_efficiency", "shm_pcie_efficiency",
         "host_memory_gb_per_s", "socket_link_gb_per_s", "net_efficiency", "socket_stream_gbps",
         "simple_channel_cap_gbps", "ll_channel_cap_gbps", "p2p_simple_sync_us",
         "p2p_ll_sync_us", "shm_simple_sync_us", "shm_ll_sync_us", "net_sync_us",
         "net_ib_sync_us", "call_latency_us")
MIN_EFFECT = 1e-3  # a 10% change must move some row's time by 0.1%
MIN_INDEPENDENCE = 0.05  # smallest singular value of the chosen normalised columns
STEP = 0.1  # relative change for the sensitivity check
MAX_ROUNDS = len(ORDER)  # each round can only add or drop parameters of ORDER
MAX_SIZES = 60  # sizes fitted (and predicted) per log: beyond, evenly spaced in log size
MAX_SAMPLES = 4  # measurements of one size fitted: both halves of its first two rows


@dataclass(frozen=True)
class RowFit:
    log: str
    bytes: int
    measured_time_us: float  # the median of the out-of-place times of this size
    fitted_time_us: float
    measured_busbw: float
    fitted_busbw: float
    role: str  # "fit" | "predict"
    uses: frozenset[str] = frozenset()  # the parameters its plan depends on

    @property
    def error(self) -> float:
        """Error of the fitted bus bandwidth (from the times: the log rounds busbw to 0.01)."""
        return self.measured_time_us / self.fitted_time_us - 1


@dataclass(frozen=True)
class FitResult:
    fitted: dict[str, float]
    defaults: dict[str, float | None]
    left: dict[str, str]  # parameter -> why it stayed at its default
    rows: list[RowFit]
    rms_error: float  # over the fitted rows of the table
    bounds: dict[str, Bound] = field(default_factory=dict)
    # parameter -> the bound it ended on
    at_bound: dict[str, Literal["floor", "ceiling"]] = field(default_factory=dict)
    rounds: int = 1
    settled: bool = True  # the binding set stopped changing (else it alternated)
    thinned: dict[str, tuple[int, int]] = field(default_factory=dict)  # log -> (sizes, used)

    def wire(self, base: wire.WireParams) -> wire.WireParams:
        return replace(base, **self.fitted)

    def rms_of(self, parameter: str) -> float:
        """The residual of every table row (fitted or predicted) the parameter applies to."""
        errors = [r.error for r in self.rows if parameter in r.uses]
        return float(np.sqrt(np.mean(np.square(errors)))) if errors else self.rms_error


Residuals = Callable[[dict[str, float]], np.ndarray]


@dataclass(frozen=True)
class _Obs:
    run: Run
    bytes: int
    time_us: float


def _applies(machine: Machine, plans: Sequence[collectives.Plan]) -> set[str]:
    """The parameters whose mechanism some plan uses."""
    hops = {t for p in plans for t in p.transport.split("+")}
    protocols = {p.protocol for p in plans}
    kinds = {machine.links[lid].kind for p in plans for lid, _ in p.usage}
    pcie = any(p.transport != "P2P" or any(machine.links[lid].kind == "pcie"
                                           for lid, _ in p.usage) for p in plans)
    rules = {"p2p_pcie_simple_efficiency": "P2P" in hops and "Simple" in protocols and pcie,
             "nvlink_simple_efficiency": "nvlink" in kinds and "Simple" in protocols,
             "shm_pcie_efficiency": bool(hops & {"SHM", "NET", "NET/IB", "NET/Socket"}),
             "host_memory_gb_per_s": "memory" in kinds,
             "socket_link_gb_per_s": bool(kinds & {"upi", "xgmi"}),
             "simple_channel_cap_gbps": "Simple" in protocols and pcie,
             "ll_channel_cap_gbps": "LL" in protocols and pcie,
             "p2p_simple_sync_us": "P2P" in hops and "Simple" in protocols,
             "p2p_ll_sync_us": "P2P" in hops and bool(protocols & {"LL", "LL128"}),
             "shm_simple_sync_us": "SHM" in hops and "Simple" in protocols,
             "shm_ll_sync_us": "SHM" in hops and "LL" in protocols,
             "net_sync_us": bool(hops & {"NET", "NET/Socket"}),
             "net_efficiency": "NET/IB" in hops, "net_ib_sync_us": "NET/IB" in hops,
             "socket_stream_gbps": "NET/Socket" in hops, "call_latency_us": bool(plans)}
    return {name for name, used in rules.items() if used}


def _thin(sizes: list[int]) -> list[int]:
    """At most MAX_SIZES of ``sizes`` (sorted), evenly spaced in log size, both ends kept."""
    if len(sizes) <= MAX_SIZES:
        return sizes
    logs = np.log2(sizes)
    picks = {int(np.argmin(np.abs(logs - t))) for t in np.linspace(logs[0], logs[-1], MAX_SIZES)}
    return [sizes[k] for k in sorted(picks)]


def _samples(run: Run) -> dict[int, list[float]]:
    """Each size's measured times: out-of-place and in-place halves, row by row."""
    out: dict[int, list[float]] = {}
    for r in run.log.rows:
        if r.bytes > 0:
            out.setdefault(r.bytes, []).append(r.time_us)
            if r.in_place_time_us:
                out[r.bytes].append(r.in_place_time_us)
    return out


def fit(runs: Sequence[Run], fit_max: int | None) -> FitResult:
    if not runs:
        raise InputError("no nccl-tests log to fit")
    base = runs[0].comm
    fit_obs: list[_Obs] = []
    table: list[tuple[Run, int, float, str]] = []  # (run, size, median out-of-place, role)
    thinned: dict[str, tuple[int, int]] = {}
    for run in runs:
        samples = _samples(run)
        sizes = sorted(samples)
        chosen = [s for s in sizes if fit_max is None or s <= fit_max]
        if not chosen:
            raise InputError(f"{run.name}: --fit-max {fit_max} leaves no row (its sizes are "
                             f"{run.log.sizes}); raise --fit-max")
        fitted_sizes = _thin(chosen)
        predicted = _thin([s for s in sizes if s not in chosen])
        thinned[run.name] = (len(sizes), len(fitted_sizes) + len(predicted))
        for size in fitted_sizes:
            fit_obs += [_Obs(run, size, t) for t in samples[size][:MAX_SAMPLES]]
        outs: dict[int, list[float]] = {}
        for r in run.log.rows:
            outs.setdefault(r.bytes, []).append(r.time_us)
        table += [(run, s, statistics.median(outs[s]), "fit" if s in chosen else "predict")
                  for s in fitted_sizes + predicted]
    measured = np.array([o.time_us for o in fit_obs])
    limits = bounds(base)
    starts = {n: v for n in ORDER if (v := start(base, n)) is not None}
    defaults = {name: base.wire.value(name) for name in ORDER}

    def times(params: dict[str, float], pairs: Sequence[tuple[Run, int]]) -> np.ndarray:
        built = {id(run): at(run.comm, params) for run in runs}
        return np.array([time_alone(built[id(run)], run.log.op, size, run.ranks).time_us
                         for run, size in pairs])

    pairs = [(o.run, o.bytes) for o in fit_obs]

    def residuals(params: dict[str, float]) -> np.ndarray:
        return np.log(times(params, pairs) / measured)

    plans = [run.comm.ring_plan(run.log.op, size, run.ranks) for run, size in pairs]
    used = _applies(base.machine, plans)
    chosen_names, left = _screen({}, starts, used, residuals, limits, [])
    history: list[tuple[frozenset[str], float, dict[str, float]]] = []
    fitted: dict[str, float] = {}
    rounds, settled = 0, False
    while rounds < MAX_ROUNDS:
        rounds += 1
        fitted = _solve(chosen_names, starts, limits, residuals)
        cost = float(np.sum(residuals(fitted) ** 2))
        history.append((frozenset(chosen_names), cost, fitted))
        again, left = _screen(fitted, starts, used, residuals, limits, chosen_names)
        if set(again) == set(chosen_names):
            settled = True
            break
        if any(frozenset(again) == seen for seen, _, _ in history):  # it alternates: keep best
            best = min(history, key=lambda h: h[1])
            fitted, chosen_names = best[2], list(best[0])
            break
        chosen_names = again
    for name in chosen_names:
        left.pop(name, None)
    rows = _rows(table, fitted, times, plans_of=lambda run, size: _applies(
        base.machine, [run.comm.ring_plan(run.log.op, size, run.ranks)]))
    fit_rows = [r.error for r in rows if r.role == "fit"]
    rms = float(np.sqrt(np.mean(np.square(fit_rows)))) if fit_rows else 0.0
    at_bound = {n: w for n, v in fitted.items() if (w := limits[n].where(v)) is not None}
    return FitResult(fitted, defaults, left, rows, rms, limits, at_bound, rounds, settled,
                     thinned)


def _screen(point: dict[str, float], starts: dict[str, float], used: set[str],
            residuals: Residuals, limits: dict[str, Bound], previous: Sequence[str]
            ) -> tuple[list[str], dict[str, str]]:
    """The parameters these rows determine at ``point`` (the fitted values; every other
    parameter at its default), the previous set tried first, and why each other one is left
    out."""
    base = residuals(point)
    columns: list[np.ndarray] = []
    chosen: list[str] = []
    left: dict[str, str] = {}
    order = [*previous, *(n for n in ORDER if n not in previous)]
    for name in order:
        if name not in starts:
            left[name] = {"socket_link_gb_per_s": "the machine has no socket link",
                          "host_memory_gb_per_s": "the machine has no CPU node"}.get(
                name, "stepsim sets no such cap by default, so no row shows where one binds")
            continue
        if name not in used:
            left[name] = "no row of these logs uses what it describes"
            continue
        value = point.get(name, starts[name])
        # 10% of the value, or of the default where the fit took it near 0 (a sync on its
        # floor still binds: a step away from it moves rows), into the bounds
        delta = STEP * max(abs(value), abs(starts[name]) or 1.0)
        nudged = value - delta if limits[name].where(value) == "ceiling" else value + delta
        column = residuals({**point, name: nudged}) - base
        if np.max(np.abs(column)) < MIN_EFFECT:
            left[name] = (f"no row up to --fit-max depends on it where the fit ends (a 10% "
                          f"change moves none by {MIN_EFFECT:.1%})")
            continue
        trial = [*columns, column / np.linalg.norm(column)]
        singular = np.linalg.svd(np.array(trial).T, compute_uv=False)
        if singular[-1] < MIN_INDEPENDENCE:
            twin = max(chosen, key=lambda c: abs(float(columns[chosen.index(c)] @ trial[-1])))
            left[name] = f"these logs cannot tell it apart from {twin}"
            continue
        columns.append(trial[-1])
        chosen.append(name)
    return chosen, left


def _solve(names: Sequence[str], starts: dict[str, float], limits: dict[str, Bound],
           residuals: Residuals) -> dict[str, float]:
    """Least squares over ``names`` from their starts, inside their bounds; every other
    parameter at its default."""
    if not names:
        return {}
    scale = np.array([starts[n] or 1.0 for n in names])  # unknowns in units of their start

    def of(x: np.ndarray) -> dict[str, float]:
        return dict(zip(names, (x * scale).tolist(), strict=True))

    low = np.array([limits[n].low for n in names]) / scale
    high = np.array([limits[n].high for n in names]) / scale
    x0 = np.clip(np.array([starts[n] for n in names]) / scale, low, high)
    # plain least squares first (a robust loss started far off downweights exactly the rows
    # that are wrong), then soft-L1 from there so one odd row cannot pull the fit
    plain = least_squares(lambda x: residuals(of(x)), x0, bounds=(low, high), diff_step=1e-3,
                          max_nfev=200)
    robust = least_squares(lambda x: residuals(of(x)), plain.x, bounds=(low, high),
                           loss="soft_l1", f_scale=0.05, diff_step=1e-3, max_nfev=200)
    return dict(zip(names, (robust.x * scale).tolist(), strict=True))


def _rows(table: list[tuple[Run, int, float, str]], fitted: dict[str, float],
          times: Callable[[dict[str, float], Sequence[tuple[Run, int]]], np.ndarray],
          plans_of: Callable[[Run, int], set[str]]) -> list[RowFit]:
    modelled = times(fitted, [(run, size) for run, size, _, _ in table])
    rows = []
    for (run, size, measured, role), t in zip(table, modelled, strict=True):
        factor = collectives.bus_factor(run.log.op, len(run.ranks))
        rows.append(RowFit(run.name, size, measured, float(t),
                           size / (measured * 1e-6) / GB * factor,
                           size / (t * 1e-6) / GB * factor, role,
                           frozenset(plans_of(run, size))))
    return rows

