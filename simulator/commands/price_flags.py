"""The price flags of `run`, `compare`, `sweep` and `advise`: what an hour, a kWh and a card
cost, and how many tokens the whole run trains on (simulator/outputs/cost.py uses them).

``--price-per-gpu-hour`` and ``--purchase-usd`` may be given once (every machine) or once per
``-t``, in the same order.
"""

from __future__ import annotations

import argparse

from simulator.errors import InputError
from simulator.outputs.cost import DEFAULT_USD_PER_KWH, DEFAULT_UTILIZATION, Prices
from simulator.units import parse_count, positive_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--price-per-gpu-hour", action="append", metavar="USD",
                        help="rental price of one GPU-hour, charged for the GPUs used "
                        "(overrides the topology's price_usd_per_hour; once per -t or once)")
    parser.add_argument("--train-tokens", metavar="N",
                        help="tokens of the whole training run (500M, 1B, 2T): its time and cost")
    parser.add_argument("--purchase-usd", action="append", metavar="USD",
                        help="what buying the GPUs used costs, for buy-versus-rent (default: "
                        "the catalog's card prices; once per -t or once)")
    parser.add_argument("--usd-per-kwh", metavar="USD", default=None,
                        help=f"electricity price (default {DEFAULT_USD_PER_KWH}: US average "
                        "residential retail price, January 2024, EIA)")
    parser.add_argument("--utilization", metavar="SHARE", default=None,
                        help=f"share of the month an owned box trains, for break-even "
                        f"(default {DEFAULT_UTILIZATION:g}: around the clock)")


def _per_machine(values: list[str] | None, flag: str, index: int, machines: int) -> float | None:
    if not values:
        return None
    if len(values) not in (1, machines):
        raise InputError(f"{flag}: give it once, or once per -t ({machines}), not {len(values)} "
                         "times")
    return positive_float(values[0] if len(values) == 1 else values[index], flag)


def prices(args: argparse.Namespace, index: int = 0, machines: int = 1) -> Prices:
    """The prices for the ``index``-th of ``machines`` topologies given with -t."""
    utilization = positive_float(args.utilization, "--utilization")
    if utilization is not None and utilization > 1:
        raise InputError(f"--utilization: a share of the month in (0, 1], got {utilization:g}")
    kwh = args.usd_per_kwh
    return Prices(
        usd_per_gpu_hour=_per_machine(args.price_per_gpu_hour, "--price-per-gpu-hour", index,
                                      machines),
        purchase_usd=_per_machine(args.purchase_usd, "--purchase-usd", index, machines),
        usd_per_kwh=DEFAULT_USD_PER_KWH if kwh is None else float(
            positive_float(kwh, "--usd-per-kwh") or DEFAULT_USD_PER_KWH),
        utilization=DEFAULT_UTILIZATION if utilization is None else utilization,
        train_tokens=None if args.train_tokens is None else parse_count(args.train_tokens,
                                                                       "--train-tokens"))
