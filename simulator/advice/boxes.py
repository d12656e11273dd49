"""A second box? When `advise` weighs one topology at several box counts (``--nnodes 1,2``),
what each added box buys: its tokens/s against one box's, how much of the added GPUs' speed
survives the network (the scaling of tokens/s per GPU), and what it costs: the added cards and
the network (``network.price_usd``) to buy, the added boxes' and the network's rent per hour,
and dollars per added thousand tokens/s; `--what-if` then lists what upgrading the first box
would buy instead (whatif.py), at its own price.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.advice.advise import PricedMachine


def lines(reports: list[dict[str, Any]], machines: Sequence[PricedMachine]) -> list[str]:
    """For each topology asked at several box counts: each count's best against the fewest
    boxes' best (reports best first: the first of each count is its best)."""
    out: list[str] = []
    for topology in dict.fromkeys(m.topology for m in machines):
        counts = [m.nnodes for m in machines if m.topology == topology]
        if len(counts) < 2:
            continue
        best: dict[int, dict[str, Any]] = {}
        for r in reports:
            if r["options"]["topology"] == topology:
                best.setdefault(r["parallelism"].get("nnodes", 1), r)
        if not best:
            continue
        fewest = min(best)
        base = best[fewest]
        out.append(f"more boxes of {topology}, against {fewest} box"
                   f"{'es' if fewest > 1 else ''} ({base['tokens_per_s']:,.0f} tokens/s, "
                   f"{base['label']}):")
        for n in sorted(best):
            if n != fewest:
                out.append("  " + _added(base, best[n], n - fewest))
        missing = sorted(c or 1 for c in counts if (c or 1) not in best)
        if missing:
            out.append(f"  nothing fits on {', '.join(map(str, missing))} boxes")
    return out


def _added(base: dict[str, Any], more: dict[str, Any], added: int) -> str:
    """One box count against the fewest: speed, scaling, and what the added boxes cost."""
    gain = more["tokens_per_s"] / base["tokens_per_s"]
    per_gpu = more["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
    boxes = more["parallelism"].get("nnodes", 1)
    net = more.get("network", {})
    how = (f"NET/{net['plugin']}, " + ("GPUDirect RDMA" if net["gpudirect_rdma"] else
                                       "staged through host memory")) if net else ""
    text = (f"{boxes} boxes: {more['tokens_per_s']:,.0f} tokens/s (x{gain:.2f}; "
            f"{per_gpu:.0%} of one box's tokens/s per GPU), {more['label']}"
            + (f", {how}" if how else ""))
    bought, had = _purchase(more), _purchase(base)
    buy_more = bought - had if bought is not None and had is not None else None
    rent = (more["cost"]["usd_per_hour"] - base["cost"]["usd_per_hour"]
            if more["cost"]["usd_per_hour"] is not None and base["cost"]["usd_per_hour"]
            is not None else None)
    added_speed = more["tokens_per_s"] - base["tokens_per_s"]
    costs = []
    if buy_more is not None:
        costs.append(f"${buy_more:,.0f} more to buy ({_what_is_bought(more)})")
        if added_speed > 0:
            costs.append(f"${buy_more / added_speed * 1000:,.0f} per added 1k tokens/s")
    if rent is not None:
        costs.append(f"${rent:,.2f} more per hour rented")
    if added_speed <= 0:
        costs.append(f"the {added} added box{'es' if added > 1 else ''} make it slower: the "
                     "network costs more time than the added GPUs save")
    return text + ("; " + "; ".join(costs) if costs else "")


def _purchase(report: dict[str, Any]) -> float | None:
    value = report.get("cost_basis", {}).get("purchase_usd")
    return float(value) if value is not None else None


def _what_is_bought(report: dict[str, Any]) -> str:
    source = report.get("cost_basis", {}).get("purchase_source") or ""
    return ("cards and network" if "network" in source else
            "cards only: give network.price_usd for the NICs and switch")
