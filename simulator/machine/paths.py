"""NCCL's best path between two nodes of a machine graph, found without listing every path.

NCCL ranks the paths between two devices by their type (the worst hop: NVL < PIX < PXB < PHB <
SYS), then their bandwidth (the thinnest hop), then their hop count (``src/graph/paths.cc``);
remaining ties go to the widest physical capacity, then to the first path met by a depth-first
walk of the links in the topology file's order (the order ``networkx.all_simple_paths`` yields
them in). A path never passes through a GPU other than its ends (no NVB relays).

The graph is ``Machine.graph``: a ``networkx.DiGraph`` whose directed links carry ``rank`` (the
hop's path type, an index into ``PATH_TYPES``), ``nccl_bandwidth`` (NCCL's belief) and
``capacity`` (physical), each node's successors in the file's order. Listing every simple
path is exponential in general, so each criterion is found by its own search over the non-GPU
part of the graph (the *hubs*: CPUs, PCIe switches, NVSwitches), each confined to what the
criteria before it allow:

1. type: hubs joined by links of at most type t form components (networkx's weakly connected
   components of a filtered view, once per type); the best type is the lowest t at which both
   ends touch a common component (or share a direct link of type <= t);
2. bandwidth: the widest path over links of at most that type (networkx has no maximin path:
   a Dijkstra of its own, ``_widest``);
3. hops: networkx's BFS layers over links of at most that type and at least that bandwidth;
4. capacity and the path: NCCL's tie-breaks, which networkx lacks: the widest capacity among
   those shortest paths by dynamic programming over the BFS layers, then the first of the
   remaining ones in the file's order, walked greedily.

Each stage is exact: the paths it keeps are exactly those still optimal, and a shortest path in
the restricted graph is always simple. The searches run from the GPU end when one end is a GPU
(a GPU has a handful of links; a CPU may have hundreds of switches below it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import networkx as nx

# Path types in NCCL's order (src/include/graph.h PATH_LOC .. PATH_NET); lower is closer.
PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET")
PATH_RANK = {name: i for i, name in enumerate(PATH_TYPES)}


@dataclass(frozen=True)
class Path:
    """A path between two nodes as NCCL's path computation sees it (``paths.cc``)."""

    nodes: tuple[str, ...]
    links: tuple[str, ...]  # directed link ids, in order
    type: str  # NCCL path type
    nccl_bandwidth: float  # B/s, bottleneck of NCCL's beliefs
    capacity: float  # B/s, physical bottleneck

    def key(self) -> tuple[int, float, int, float]:
        # paths.cc prefers a lower type, then more bandwidth, then fewer hops
        return (PATH_RANK[self.type], -self.nccl_bandwidth, len(self.links), -self.capacity)


Edge = dict[str, Any]  # a link's attributes on the graph


class PathFinder:
    """Best paths over one machine graph (module docstring); GPUs are ``gpus``."""

    def __init__(self, graph: nx.DiGraph, gpus: set[str]) -> None:
        self.graph = graph
        self.succ = graph.succ
        self.gpus = gpus
        # each node's links to hubs, in the file's order
        self.hubs = {u: [(v, e) for v, e in nbrs.items() if v not in gpus]
                     for u, nbrs in self.succ.items()}
        # the hubs and their links alone, copied once: a search through a hub never walks
        # past the thousand GPUs an NVSwitch may hold
        self.hub_graph = nx.DiGraph(graph.subgraph(u for u in graph if u not in gpus))
        self.ranks = sorted({rank for _, _, rank in graph.edges(data="rank")})
        self._components: dict[int, dict[str, int]] = {}
        self._attached: dict[int, dict[int, list[str]]] = {}

    # --- stage 1: the path type ---------------------------------------------------------

    def components(self, rank: int) -> dict[str, int]:
        """Hub -> component id, hubs joined by links of type rank <= ``rank``."""
        if rank not in self._components:
            view = nx.subgraph_view(self.graph, filter_node=lambda n: n not in self.gpus,
                                    filter_edge=lambda u, v: self.succ[u][v]["rank"] <= rank)
            self._components[rank] = {node: i for i, part in
                                      enumerate(nx.weakly_connected_components(view))
                                      for node in part}
        return self._components[rank]

    def _touching(self, node: str, rank: int) -> set[int]:
        """Components ``node`` is in (a hub) or reaches in one link of type <= ``rank``."""
        comp = self.components(rank)
        if node not in self.gpus:
            return {comp[node]}
        return {comp[v] for v, e in self.hubs[node] if e["rank"] <= rank}

    def type_rank(self, a: str, b: str) -> int | None:
        """The rank of the best path type from ``a`` to ``b``; None if no path avoids GPUs."""
        direct = self.succ[a].get(b)
        for rank in self.ranks:
            if direct is not None and direct["rank"] <= rank:
                return rank
            if self._touching(a, rank) & self._touching(b, rank):
                return rank
        return None

    def nearest(self, a: str, candidates: list[str]) -> Iterator[tuple[int, list[str]]]:
        """(type rank, the candidate GPUs whose best path from ``a`` has that type), lowest
        type first, each list in the candidates' order: one sweep, not one search per pair."""
        left = dict.fromkeys(c for c in candidates if c != a)
        for rank in self.ranks:
            if not left:
                return
            reached: set[str] = set()
            for comp in self._touching(a, rank):
                reached.update(self.attached(rank).get(comp, ()))
            reached.update(v for v, e in self.succ[a].items() if e["rank"] <= rank)
            found = [c for c in left if c in reached]
            for c in found:
                del left[c]
            if found:
                yield rank, found

    def attached(self, rank: int) -> dict[int, list[str]]:
        """Component id -> the GPUs one link of type <= ``rank`` away from it."""
        if rank not in self._attached:
            comp = self.components(rank)
            out: dict[int, list[str]] = {}
            for g in self.gpus:
                for c in {comp[v] for v, e in self.hubs[g] if e["rank"] <= rank}:
                    out.setdefault(c, []).append(g)
            self._attached[rank] = out
        return self._attached[rank]

    # --- one source to every target: the best paths' capacities -----------------------------

    def capacities(self, a: str, targets: list[str]) -> dict[str, float]:
        """The physical capacity (thinnest link) of the best path from ``a`` to each target,
        as ``best`` would find it, in one sweep per distinct (type, bandwidth) of the targets
        rather than one search per pair: a bottleneck for every pair of a large machine."""
        out: dict[str, float] = {}
        gpus = [b for b in targets if b in self.gpus]
        by_type = {rank: found for rank, found in self.nearest(a, gpus)}  # a sweep for GPUs
        for b in targets:
            if b not in self.gpus and (rank := self.type_rank(a, b)) is not None:
                by_type.setdefault(rank, []).append(b)
        for rank, found in by_type.items():
            widest = self._widest_from(a, rank)
            by_width: dict[float, list[str]] = {}
            for b in found:
                by_width.setdefault(widest[b], []).append(b)
            for bandwidth, group in by_width.items():
                cap = self._capacity_from(a, rank, bandwidth)
                out.update((b, cap[b]) for b in group)
        return out

    def _widest_from(self, a: str, rank: int) -> dict[str, float]:
        """``_widest`` from ``a`` to every node at once (GPUs are ends, never passed)."""
        best = {a: math.inf}
        heap: list[tuple[float, str]] = [(-math.inf, a)]
        while heap:
            neg, u = heapq.heappop(heap)
            if -neg < best[u] or (u != a and u in self.gpus):
                continue
            for v, e in self.succ[u].items():
                if v == a or e["rank"] > rank:
                    continue
                width = min(-neg, e["nccl_bandwidth"])
                if width > best.get(v, -1.0):
                    best[v] = width
                    heapq.heappush(heap, (-width, v))
        return best

    def _capacity_from(self, a: str, rank: int, bandwidth: float) -> dict[str, float]:
        """The widest capacity among shortest paths from ``a`` to every node over links of
        type <= rank and bandwidth >= bandwidth (GPUs are ends): BFS layers, then a maximin
        over each node's predecessors on the layer before."""
        cap = {a: math.inf}
        layer = [a]
        while layer:
            found: dict[str, float] = {}
            for u in layer:
                if u != a and u in self.gpus:
                    continue
                for v, e in self.succ[u].items():
                    if v in cap or not self._ok(e, rank, bandwidth):
                        continue
                    found[v] = max(found.get(v, -1.0), min(cap[u], e["capacity"]))
            cap.update(found)
            layer = list(found)
        return cap

    # --- stages 2 to 4: bandwidth, hops, capacity and the path -------------------------------

    def best(self, a: str, b: str) -> tuple[str, ...] | None:
        """The nodes of the best path from ``a`` to ``b`` (module docstring); None if none."""
        if a == b:
            return None
        rank = self.type_rank(a, b)
        if rank is None:
            return None
        # search from the GPU end: its few links keep every search small
        start, end = (b, a) if b in self.gpus and a not in self.gpus else (a, b)
        bandwidth = self._widest(start, end, a, b, rank)
        level = self._levels(start, end, a, b, rank, bandwidth)
        if start == a:
            return self._walk_forward(a, b, rank, bandwidth, level)
        return self._walk_back(a, b, rank, bandwidth, level)

    def _steps(self, u: str, a: str, b: str) -> Iterator[tuple[str, Edge]]:
        """Where a path from ``a`` to ``b`` may go from ``u``: hubs other than ``a``, or ``b``
        (the only GPU a path may enter, other than the one it starts from)."""
        for v, e in self.hubs[u]:
            if v != a and v != b:
                yield v, e
        to_b = self.succ[u].get(b)
        if to_b is not None:
            yield b, to_b
        if u != a:
            to_a = self.succ[u].get(a)
            if to_a is not None:
                yield a, to_a

    def _widest(self, start: str, end: str, a: str, b: str, rank: int) -> float:
        """The largest thinnest-link bandwidth of a path of type <= ``rank``: a maximin
        Dijkstra (networkx's shortest paths add weights; this one takes their minimum)."""
        best = {start: math.inf}
        heap: list[tuple[float, int, str]] = [(-math.inf, 0, start)]
        while heap:
            neg, hops, u = heapq.heappop(heap)
            if u == end:
                return -neg
            if -neg < best[u] or (u != start and u in self.gpus):
                continue
            for v, e in self._steps(u, a, b):
                if v == start or e["rank"] > rank:
                    continue
                width = min(-neg, e["nccl_bandwidth"])
                if width > best.get(v, -1.0):
                    best[v] = width
                    heapq.heappush(heap, (-width, hops + 1, v))
        raise AssertionError(f"no path of rank {rank} from {start} to {end}")  # type_rank found one

    def _levels(self, start: str, end: str, a: str, b: str, rank: int,
                bandwidth: float) -> dict[str, int]:
        """Each node's BFS layer from ``start`` over links of type <= rank and bandwidth >=
        bandwidth, through hubs only, up to the layer of ``end`` (networkx's BFS layers over
        the hubs, the two ends joined to them by hand)."""
        def ok(e: Edge) -> bool:
            return self._ok(e, rank, bandwidth)

        view = nx.subgraph_view(self.hub_graph,
                                filter_edge=lambda u, v: ok(self.hub_graph.succ[u][v]))
        level = {start: 0}
        first = [v for v, e in self.hubs[start] if ok(e) and v not in (a, b)]
        into_end = self.succ[start].get(end)
        if into_end is not None and ok(into_end):  # one link: the layer holds the end too
            level.update(dict.fromkeys(first, 1))
            level[end] = 1
            return level
        layers: Iterator[list[str]] = nx.bfs_layers(view, first) if first else iter(())
        for k, layer in enumerate(layers, start=1):
            fresh = [u for u in layer if u not in level and u not in (a, b)]
            level.update(dict.fromkeys(fresh, k))
            if any((e := self.succ[u].get(end)) is not None and ok(e) for u in fresh):
                nxt: list[str] = next(layers, [])
                level.update(dict.fromkeys((u for u in nxt if u not in level
                                            and u not in (a, b)), k + 1))
                level[end] = k + 1
                return level
        raise AssertionError(f"{end} unreachable from {start}")  # _widest reached it

    def _ok(self, e: Edge, rank: int, bandwidth: float) -> bool:
        return bool(e["rank"] <= rank and e["nccl_bandwidth"] >= bandwidth)

    def _toward(self, u: str, k: int, last: str, level: dict[str, int], other: str
                ) -> Iterator[tuple[str, Edge]]:
        """``u``'s neighbours on BFS layer ``k`` in the file's order: the far end ``last`` on
        layer 0 or the final layer (``k`` < 0 asks for it), else hubs other than ``other``."""
        if k < 0:
            e = self.succ[u].get(last)
            if e is not None:
                yield last, e
            return
        for v, e in self.hubs[u]:
            if level.get(v) == k and v != other and v != last:
                yield v, e

    def _walk_forward(self, a: str, b: str, rank: int, bandwidth: float,
                      level: dict[str, int]) -> tuple[str, ...]:
        """Layers from ``a``: the widest capacity to ``b`` back from ``b``, then the walk."""
        last = level[b]
        layers: list[list[str]] = [[] for _ in range(last + 1)]
        for node, k in level.items():
            layers[k].append(node)

        def ahead(u: str, k: int) -> Iterator[tuple[str, Edge]]:
            return self._toward(u, -1 if k == last else k, b, level, a)

        cap = {b: math.inf}  # the best thinnest capacity from a node to b on a shortest path
        for k in range(last - 1, -1, -1):
            for u in layers[k]:
                widths = [min(e["capacity"], cap[v]) for v, e in ahead(u, k + 1)
                          if v in cap and self._ok(e, rank, bandwidth)]
                if widths:
                    cap[u] = max(widths)
        target = cap[a]
        path, u = [a], a
        for k in range(1, last + 1):
            u = next(v for v, e in ahead(u, k) if v in cap and self._ok(e, rank, bandwidth)
                     and min(e["capacity"], cap[v]) >= target)
            path.append(u)
        return tuple(path)

    def _walk_back(self, a: str, b: str, rank: int, bandwidth: float,
                   level: dict[str, int]) -> tuple[str, ...]:
        """Layers from ``b`` (``a`` alone on the last): the widest capacity from ``b`` forward,
        then the walk from ``a`` down the layers."""
        last = level[a]
        layers: list[list[str]] = [[] for _ in range(last + 1)]
        for node, k in level.items():
            layers[k].append(node)

        def behind(u: str, k: int) -> Iterator[tuple[str, Edge]]:
            return self._toward(u, -1 if k == 0 else k, b, level, a)

        cap = {b: math.inf}  # the best thinnest capacity from b to a node on a shortest path
        for k in range(1, last):
            for v in layers[k]:
                widths = [min(e["capacity"], cap[u]) for u, e in behind(v, k - 1)
                          if u in cap and self._ok(e, rank, bandwidth)]
                if widths:
                    cap[v] = max(widths)
        target = max(min(e["capacity"], cap[v]) for v, e in behind(a, last - 1)
                     if v in cap and self._ok(e, rank, bandwidth))
        path, u = [a], a
        for k in range(last - 1, -1, -1):
            u = next(v for v, e in behind(u, k) if v in cap and self._ok(e, rank, bandwidth)
                     and min(e["capacity"], cap[v]) >= target)
            path.append(u)
        return tuple(path)


def unreached(graph: nx.DiGraph, start: str) -> list[str]:
    """The first group of nodes (in the graph's order) that ``start`` cannot reach, sorted."""
    seen = nx.node_connected_component(graph.to_undirected(as_view=True), start)
    lonely = next((node for node in graph if node not in seen), None)
    if lonely is None:
        return []
    return sorted(nx.node_connected_component(graph.to_undirected(as_view=True), lonely))
