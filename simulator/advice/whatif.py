"""What-if upgrades for the chosen configuration: the machine changed as a buyer can change it,
the same run simulated on it (with its ranges), at the price the change implies.

Upgrades, each a rewrite of the topology (written to a temporary YAML, simulated through
``simulator.api``, then removed):
- a P2P-capable driver (``p2p: true``: a patched GeForce driver, or a data-centre card);
- one PCIe switch for GPUs spread over sockets' root ports, or two sockets' root ports for
  GPUs behind switches (the layouts a buyer chooses between);
- the next PCIe generation, where the links run below what the card supports;
- an NVLink bridge between GPU pairs, where the card has NVLink and the box none;
- twice the GPUs, each attached as its original is (same socket or switch);
- the card of the catalog with the next larger memory, the recipe at the largest micro-batch
  that now fits.
The hourly price follows the GPUs (per GPU-hour); for another card it is scaled by the
catalog's card prices (stated in the note). An upgrade that does not apply says why.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from simulator import api
from simulator.advice import candidates as cand
from simulator.advice import spec_text
from simulator.api import RunSpec
from simulator.catalog import gpus as gpu_catalog
from simulator.errors import InputError
from simulator.inputs.config import load_topology
from simulator.inputs.schema import GpuSpec, LinkConfig, NodeConfig, TopologyConfig, dump
from simulator.machine.cards import resolve_gpu
from simulator.outputs.cost import Prices

Rewrite = Callable[[TopologyConfig, gpu_catalog.GPU], "tuple[TopologyConfig | None, str]"]


def _gpu_links(config: TopologyConfig) -> dict[str, LinkConfig]:
    """Each GPU's link to its parent (switch or CPU)."""
    kinds = {n.id: n.kind for n in config.nodes}
    out: dict[str, LinkConfig] = {}
    for link in config.links:
        for gpu, other in ((link.a, link.b), (link.b, link.a)):
            if kinds.get(gpu) == "gpu" and kinds.get(other) in ("cpu", "pcie_switch") and \
                    link.kind == "pcie":
                out[gpu] = link
    return out


def p2p_driver(config: TopologyConfig, gpu: gpu_catalog.GPU) -> tuple[TopologyConfig | None, str]:
    if config.p2p:
        return None, "the box already has PCIe peer-to-peer"
    variant = config.copy(p2p=True, name=config.name + "+p2p")
    comm = api.Communicator(api.Machine.from_config(variant))
    machine = comm.machine
    pairs = [(i, j) for i in range(machine.n_gpus) for j in range(machine.n_gpus) if i != j]
    if pairs and all(comm.transport(i, j) != "P2P" for i, j in pairs):
        return None, (f"NCCL uses PCIe P2P only up to NCCL_P2P_LEVEL={config.p2p_level}, and "
                      f"these GPUs are {machine.path_type(*pairs[0])} apart: it would stay SHM")
    return variant, "PCIe peer-to-peer on (a patched driver on GeForce cards)"


def switch_or_sockets(config: TopologyConfig, gpu: gpu_catalog.GPU
                      ) -> tuple[TopologyConfig | None, str]:
    """GPUs on several sockets' root ports -> one switch on socket 0; behind switches -> two
    sockets' root ports."""
    kinds = {n.id: n.kind for n in config.nodes}
    links = _gpu_links(config)
    if not links or any(n.kind == "nvswitch" for n in config.nodes):
        return None, "the GPUs talk over NVLink or NVSwitch, not PCIe"
    parents = {(lk.b if lk.a == g else lk.a) for g, lk in links.items()}
    cpus = [n.id for n in config.nodes if n.kind == "cpu"]
    sample = next(iter(links.values()))
    if all(kinds[p] == "cpu" for p in parents):  # root ports -> one switch
        if len(parents) < 2 and len(cpus) < 2:
            return None, "the GPUs already share one socket's root ports"
        nodes = [n for n in config.nodes if n.kind != "gpu"] + \
            [NodeConfig(id="sw-new", kind="pcie_switch")] + \
            [n for n in config.nodes if n.kind == "gpu"]
        kept = [lk for lk in config.links if lk not in links.values()]
        new = [LinkConfig(a=cpus[0], b="sw-new", kind="pcie", gen=sample.gen, lanes=sample.lanes)]
        new += [LinkConfig(a="sw-new", b=g, kind="pcie", gen=lk.gen, lanes=lk.lanes)
                for g, lk in links.items()]
        return (config.copy(name=config.name + "+one-switch", nodes=nodes, links=kept + new),
                f"all GPUs behind one PCIe switch on {cpus[0]} (one x{sample.lanes} uplink)")
    switches = {p for p in parents if kinds[p] == "pcie_switch"}
    nodes = [n for n in config.nodes if n.id not in switches]
    kept = [lk for lk in config.links if lk.a not in switches and lk.b not in switches]
    if len(cpus) < 2:  # a second socket like the first, joined as that CPU's kind is
        first = next(n for n in config.nodes if n.id == cpus[0])
        nodes.insert(nodes.index(first) + 1, first.copy(id="cpu-new"))
        amd = (first.model or "").startswith("amd")
        kept.append(LinkConfig(a=cpus[0], b="cpu-new", kind="xgmi" if amd else "upi",
                               model=first.model))
        cpus.append("cpu-new")
    gpus = list(links)
    half = (len(gpus) + 1) // 2
    new = [LinkConfig(a=cpus[0] if i < half else cpus[1], b=g, kind="pcie", gen=links[g].gen,
                      lanes=links[g].lanes) for i, g in enumerate(gpus)]
    return (config.copy(name=config.name + "+two-sockets", nodes=nodes, links=kept + new),
            "GPUs on two sockets' root ports, half on each (no PCIe switch)")


def next_pcie_gen(config: TopologyConfig, gpu: gpu_catalog.GPU
                  ) -> tuple[TopologyConfig | None, str]:
    gens = [lk.gen for lk in config.links if lk.kind == "pcie" and lk.gen]
    if not gens:
        return None, "no PCIe generation is set on the links"
    low = min(gens)
    if low >= gpu.pcie_gen:
        return None, f"the {gpu.name} is a PCIe Gen{gpu.pcie_gen} card and its links run at it"
    target = low + 1
    links = [lk.copy(gen=target) if lk.kind == "pcie" and lk.gen == low
             else lk for lk in config.links]
    return (config.copy(name=f"{config.name}+gen{target}", links=links),
            f"PCIe Gen{low} links at Gen{target}")


def nvlink_bridge(config: TopologyConfig, gpu: gpu_catalog.GPU
                  ) -> tuple[TopologyConfig | None, str]:
    if gpu.nvlink_links == 0:
        return None, f"the {gpu.name} has no NVLink"
    if any(lk.kind == "nvlink" for lk in config.links):
        return None, "the GPUs already have NVLink"
    gpus = [n.id for n in config.nodes if n.kind == "gpu"]
    bridges = [LinkConfig(a=a, b=b, kind="nvlink", count=gpu.nvlink_links)
               for a, b in zip(gpus[::2], gpus[1::2], strict=False)]
    return (config.copy(name=config.name + "+nvlink-bridge", links=list(config.links) + bridges),
            f"an NVLink bridge ({gpu.nvlink_links} links) between each pair of GPUs")


def twice_the_gpus(config: TopologyConfig, gpu: gpu_catalog.GPU
                   ) -> tuple[TopologyConfig | None, str]:
    links = _gpu_links(config)
    if len(links) != sum(1 for n in config.nodes if n.kind == "gpu"):
        return None, "not every GPU hangs off one PCIe parent (NVSwitch box): no place to copy"
    extra_nodes, extra_links = [], []
    for g, lk in links.items():
        twin = f"{g}-twin"
        node = next(n for n in config.nodes if n.id == g)
        extra_nodes.append(node.copy(id=twin))
        parent = lk.b if lk.a == g else lk.a
        extra_links.append(lk.copy(a=parent, b=twin))
    price = config.price_usd_per_hour * 2 if config.price_usd_per_hour else None
    return (config.copy(name=config.name + "+2x-gpus", nodes=list(config.nodes) + extra_nodes,
                        links=list(config.links) + extra_links, price_usd_per_hour=price),
            f"{2 * len(links)} GPUs, each new one attached as its twin is")


def more_memory(config: TopologyConfig, gpu: gpu_catalog.GPU) -> tuple[TopologyConfig | None, str]:
    bigger = sorted((g for g in gpu_catalog.GPUS.values()
                     if g.memory_bytes > gpu.memory_bytes and g.pcie_gen >= 4),
                    key=lambda g: (g.arch != gpu.arch, g.memory_bytes))
    if not bigger:
        return None, "no card in the catalog has more memory"
    card = bigger[0]
    update: dict[str, object] = {"name": f"{config.name}+{card.name}",
                                 "gpu": GpuSpec(base=card.name)}
    note = f"{card.name} ({card.memory_bytes / 2**30:.0f} GiB) in place of {gpu.name}"
    if config.price_usd_per_hour is not None:  # the box's rent follows its cards' prices
        if card.price_usd and gpu.price_usd:
            update["price_usd_per_hour"] = config.price_usd_per_hour * card.price_usd / \
                gpu.price_usd
            note += (f"; the box's rent scaled by the card prices (${card.price_usd:,.0f} / "
                     f"${gpu.price_usd:,.0f})")
        else:
            update["price_usd_per_hour"] = None
    return config.copy(**update), note


UPGRADES: dict[str, Rewrite] = {
    "p2p driver": p2p_driver,
    "pcie switch or two sockets": switch_or_sockets,
    "next pcie generation": next_pcie_gen,
    "nvlink bridge": nvlink_bridge,
    "twice the gpus": twice_the_gpus,
    "more memory": more_memory,
}


def _price(prices: Prices, old: gpu_catalog.GPU, new: gpu_catalog.GPU) -> tuple[Prices, str]:
    if new.name == old.name or prices.usd_per_gpu_hour is None:
        return prices, ""
    if not (old.price_usd and new.price_usd):
        return replace(prices, usd_per_gpu_hour=None), "; no card price to scale the rent by"
    ratio = new.price_usd / old.price_usd
    return (replace(prices, usd_per_gpu_hour=prices.usd_per_gpu_hour * ratio),
            f"; rent scaled by the card prices (${new.price_usd:,.0f} / ${old.price_usd:,.0f})")


def upgrades(best: dict[str, Any], prices: Prices) -> list[dict[str, Any]]:
    """Each upgrade's new step time, throughput and cost with their ranges, beside the best."""
    spec = _spec(best)
    config = load_topology(spec.topology)
    gpu = api.load_machine(spec.topology).gpu
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepsim-whatif-") as tmp:
        for name, rewrite in UPGRADES.items():
            variant, note = rewrite(config, gpu)
            if variant is None:
                out.append({"upgrade": name, "applies": False, "note": note})
                continue
            path = Path(tmp) / f"{variant.name}.yaml"
            path.write_text(yaml.safe_dump(dump(variant, exclude_none=True),
                                           sort_keys=False), encoding="utf-8")
            new_gpu = resolve_gpu(variant.gpu)
            priced, price_note = _price(prices, gpu, new_gpu)
            try:
                out.append(_simulate(name, note + price_note, replace(spec, topology=str(path)),
                                     priced, best, grow=name == "more memory"))
            except InputError as exc:  # e.g. a TP degree the doubled box no longer divides
                out.append({"upgrade": name, "applies": False, "note": f"{note}: {exc}"})
    return out


def _spec(best: dict[str, Any]) -> RunSpec:
    return spec_text.spec_of(best["options"])


def _simulate(name: str, note: str, spec: RunSpec, prices: Prices, best: dict[str, Any],
              grow: bool) -> dict[str, Any]:
    if name == "twice the gpus" and spec.strategy == "tp" and spec.tp:
        spec = replace(spec, tp=2 * spec.tp)  # tp spans every GPU
    if grow:  # more memory: the same recipe at the largest micro-batch that now fits
        recipe, mode = cand.recipe_of(spec)
        verdict = cand.largest_micro_batch(replace(spec, micro_batch=None), recipe, mode)
        if verdict is not None and verdict.largest > (spec.micro_batch or 1):
            spec = replace(spec, micro_batch=verdict.largest)
            note += f"; micro-batch {verdict.largest} now fits"
    r = api.simulate(spec, baseline=False, prices=prices, ranges=True).report
    cost = r["cost"]
    return {"upgrade": name, "applies": True, "note": note, "fits": cand.fits(r["memory"]),
            "micro_batch": spec.micro_batch,
            "step_time_s": r["step_time_s"], "step_time_s_range": r["step_time_s_range"],
            "tokens_per_s": r["tokens_per_s"], "tokens_per_s_range": r["tokens_per_s_range"],
            "speedup": r["tokens_per_s"] / best["tokens_per_s"],
            "usd_per_hour": cost["usd_per_hour"],
            "usd_per_million_tokens": cost["usd_per_million_tokens"],
            "usd_per_million_tokens_range": cost.get("usd_per_million_tokens_range")}


def lines(best: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """The text form: one line per upgrade."""
    out = [f"what if, for {best['label']} on {best['topology']} "
           f"({best['step_time_s']:.3g} s per step, {best['tokens_per_s']:,.0f} tokens/s):"]
    for r in results:
        if not r["applies"]:
            out.append(f"  {r['upgrade']}: does not apply: {r['note']}")
            continue
        low, high = r["step_time_s_range"]
        usd = r["usd_per_million_tokens"]
        price = "" if usd is None else (
            f", ${usd:.3g} per million tokens" + (
                f" (${r['usd_per_million_tokens_range'][0]:.3g}-"
                f"{r['usd_per_million_tokens_range'][1]:.3g})"
                if r["usd_per_million_tokens_range"] else ""))
        fits = "" if r["fits"] else " (DOES NOT FIT in memory)"
        if abs(r["speedup"] - 1) < 0.005:
            fits += "; no change: the step does not use what this upgrade adds"
        out.append(f"  {r['upgrade']} ({r['note']}): {r['step_time_s']:.3g} s per step "
                   f"({low:.3g}-{high:.3g}), {r['tokens_per_s']:,.0f} tokens/s, "
                   f"x{r['speedup']:.2f}{price}{fits}")
    return out
