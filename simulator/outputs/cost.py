"""What a run costs: the GPUs' hourly price, per step, per million tokens, a whole training
run, and how many months of use make buying cheaper than renting.

The hourly price: ``--price-per-gpu-hour`` times the GPUs the run uses, else the topology's
``price_usd_per_hour`` (the whole machine's rate) times the share of its GPUs the run uses.
Buying: ``--purchase-usd``, else the catalog's card prices (catalog/, dated) times
the GPUs used: cards only, the host is not in that figure (several boxes: the topology's
``network.price_usd`` is added). Owning costs electricity at the
run's average power (energy.py) times ``--usd-per-kwh``. Break-even:

    months = purchase / ((rent per hour - electricity per hour) * 730 h * utilization)

null when there is no rent to compare with or electricity costs more than the rent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COST_KEYS = ("usd_per_hour", "usd_per_step", "usd_per_million_tokens", "train_tokens",
             "time_to_train_s", "usd_to_train", "breakeven_months")
HOURS_PER_MONTH = 365 * 24 / 12  # 730
# US average residential retail price, January 2024: 15.45 cents/kWh (EIA, Electricity Monthly
# Update with data for January 2024, "Retail Service by Customer Sector"); a home or small
# office box pays this rate, a data centre less.
DEFAULT_USD_PER_KWH = 0.1545
DEFAULT_UTILIZATION = 1.0  # the box trains around the clock


@dataclass(frozen=True)
class Prices:
    """The user's prices and assumptions (the flags); None where not given."""

    usd_per_gpu_hour: float | None = None
    purchase_usd: float | None = None
    usd_per_kwh: float = DEFAULT_USD_PER_KWH
    utilization: float = DEFAULT_UTILIZATION
    train_tokens: int | None = None


def hourly_price(prices: Prices, machine_usd_per_hour: float | None, gpus: int,
                 machine_gpus: int) -> tuple[float | None, str | None]:
    """USD per hour of the GPUs used, and where the figure comes from."""
    if prices.usd_per_gpu_hour is not None:
        return prices.usd_per_gpu_hour * gpus, f"--price-per-gpu-hour {prices.usd_per_gpu_hour:g}"
    if machine_usd_per_hour is not None:
        share = gpus / machine_gpus
        return (machine_usd_per_hour * share, f"topology price_usd_per_hour "
                f"{machine_usd_per_hour:g} x {gpus}/{machine_gpus} GPUs")
    return None, None


def run_cost(*, step_time_s: float, tokens_per_s: float, gpus: int, machine_gpus: int,
             prices: Prices, machine_usd_per_hour: float | None,
             card_price_usd: float | None, card_price_source: str | None,
             avg_power_w: float | None, network: tuple[float, str] | None = None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``cost`` block (exactly ``COST_KEYS``) and the basis it was computed on.
    ``network``: what the network between several boxes costs to buy, and whence."""
    per_hour, source = hourly_price(prices, machine_usd_per_hour, gpus, machine_gpus)
    tokens = prices.train_tokens
    time_to_train = tokens / tokens_per_s if tokens and tokens_per_s > 0 else None
    cost: dict[str, Any] = {
        "usd_per_hour": per_hour,
        "usd_per_step": per_hour / 3600 * step_time_s if per_hour is not None else None,
        "usd_per_million_tokens": (per_hour / 3600 / tokens_per_s * 1e6
                                   if per_hour is not None and tokens_per_s > 0 else None),
        "train_tokens": tokens,
        "time_to_train_s": time_to_train,
        "usd_to_train": (per_hour * time_to_train / 3600
                         if per_hour is not None and time_to_train is not None else None),
    }
    if prices.purchase_usd is not None:
        purchase: float | None = prices.purchase_usd
        purchase_source: str | None = "--purchase-usd"
    elif card_price_usd is not None:
        purchase = card_price_usd * gpus
        purchase_source = (f"{gpus} cards at ${card_price_usd:,.0f} ({card_price_source}); "
                           "host not included")
    else:
        purchase, purchase_source = None, None
    if purchase is not None and network is not None and prices.purchase_usd is None:
        purchase += network[0]  # several boxes: their network too
        purchase_source = f"{purchase_source}; network ${network[0]:,.0f} ({network[1]})"
    power_usd_per_hour = (avg_power_w / 1000 * prices.usd_per_kwh
                          if avg_power_w is not None else None)
    cost["breakeven_months"] = breakeven_months(purchase, per_hour, power_usd_per_hour,
                                                prices.utilization)
    basis = {"usd_per_hour_source": source, "purchase_usd": purchase,
             "purchase_source": purchase_source, "usd_per_kwh": prices.usd_per_kwh,
             "electricity_usd_per_hour": power_usd_per_hour,
             "utilization": prices.utilization}
    return cost, basis


def breakeven_months(purchase_usd: float | None, rent_usd_per_hour: float | None,
                     power_usd_per_hour: float | None, utilization: float) -> float | None:
    """Months of use after which buying has cost less than renting (None: never or unknown)."""
    if purchase_usd is None or rent_usd_per_hour is None or power_usd_per_hour is None:
        return None
    saving_per_hour = rent_usd_per_hour - power_usd_per_hour
    if saving_per_hour <= 0 or utilization <= 0:
        return None
    return purchase_usd / (saving_per_hour * HOURS_PER_MONTH * utilization)
