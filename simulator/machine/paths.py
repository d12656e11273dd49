"""NCCL's best path between two nodes of a machine, found without listing every path
(and which nodes a machine's links leave unreached).

NCCL ranks the paths between two devices by their type (the worst hop: NVL < PIX < PXB < PHB <
SYS), then their bandwidth (the thinnest hop), then their hop count (``src/graph/paths.cc``);
remaining ties go to the widest physical capacity, then to the first path met by a depth-first
walk of the adjacency lists in the topology file's order (the order ``networkx.all_simple_paths``
yields them in). A path never passes through a GPU other than its ends (no NVB relays).

Listing every simple path is exponential in general and cubic in GPUs over all pairs of a large
NVSwitch box, so each criterion is found by its own search over the non-GPU part of the graph
(the *hubs*: CPUs, PCIe switches, NVSwitches), each search confined to what the criteria
before it allow:

1. type: hubs joined by hops of at most type t form components (one union-find per type,
   built once per machine); the best type is the lowest t at which both ends touch a common
   component (or share a direct link of type <= t);
2. bandwidth: a widest-path Dijkstra over hops of at most that type;
3. hops: breadth first over hops of at most that type and at least that bandwidth;
4. capacity: the widest of those shortest paths, by dynamic programming over the BFS layers;
5. the path: the first of the remaining ones in adjacency order, walked greedily.

Each stage is exact: the paths it keeps are exactly those still optimal, and a shortest path in
the restricted graph is always simple. The searches run from the GPU end when one end is a GPU
(a GPU has a handful of links; a CPU may have hundreds of switches below it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Hop:
    """What the search needs of one link: its type's rank, NCCL's bandwidth, its capacity."""

    rank: int  # index of the hop's path type in PATH_TYPES
    bandwidth: float  # NCCL's belief, B/s
    capacity: float  # physical, B/s


Adjacency = Mapping[str, Mapping[str, Hop]]


class PathFinder:
    """Best paths over one machine's links (``adjacency`` in the topology file's order)."""

    def __init__(self, adjacency: Adjacency, gpus: set[str]) -> None:
        self.adj = adjacency
        self.gpus = gpus
        # each node's non-GPU neighbours, in adjacency order
        self.hubs = {u: [(v, hop) for v, hop in nbrs.items() if v not in gpus]
                     for u, nbrs in adjacency.items()}
        self.ranks = sorted({hop.rank for nbrs in adjacency.values() for hop in nbrs.values()})
        self._components: dict[int, dict[str, int]] = {}
        self._attached: dict[int, dict[int, list[str]]] = {}

    # --- stage 1: the path type ---------------------------------------------------------

    def components(self, rank: int) -> dict[str, int]:
        """Hub -> component id, hubs joined by hops of type rank <= ``rank`` (union-find)."""
        if rank not in self._components:
            parent = {u: u for u in self.adj if u not in self.gpus}

            def root(u: str) -> str:
                while parent[u] != u:
                    parent[u] = parent[parent[u]]
                    u = parent[u]
                return u

            for u in parent:
                for v, hop in self.hubs[u]:
                    if hop.rank <= rank:
                        parent[root(u)] = root(v)
            ids: dict[str, int] = {}
            self._components[rank] = {u: ids.setdefault(root(u), len(ids)) for u in parent}
        return self._components[rank]

    def _touching(self, node: str, rank: int) -> set[int]:
        """Components ``node`` is in (a hub) or reaches in one hop of type <= ``rank``."""
        comp = self.components(rank)
        if node not in self.gpus:
            return {comp[node]}
        return {comp[v] for v, hop in self.hubs[node] if hop.rank <= rank}

    def type_rank(self, a: str, b: str) -> int | None:
        """The rank of the best path type from ``a`` to ``b``; None if no path avoids GPUs."""
        direct = self.adj[a].get(b)
        for rank in self.ranks:
            if direct is not None and direct.rank <= rank:
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
            reached.update(v for v, hop in self.adj[a].items() if hop.rank <= rank)
            found = [c for c in left if c in reached]
            for c in found:
                del left[c]
            if found:
                yield rank, found

    def attached(self, rank: int) -> dict[int, list[str]]:
        """Component id -> the GPUs one hop of type <= ``rank`` away from it."""
        if rank not in self._attached:
            comp = self.components(rank)
            out: dict[int, list[str]] = {}
            for g in self.gpus:
                for c in {comp[v] for v, hop in self.hubs[g] if hop.rank <= rank}:
                    out.setdefault(c, []).append(g)
            self._attached[rank] = out
        return self._attached[rank]

    # --- stages 2 to 5: bandwidth, hops, capacity, the path ---------------------------------

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
        layers, level = self._layers(start, end, a, b, rank, bandwidth)
        if start == a:
            return self._walk_forward(a, b, rank, bandwidth, layers, level)
        return self._walk_back(a, b, rank, bandwidth, layers, level)

    def _steps(self, u: str, a: str, b: str) -> Iterator[tuple[str, Hop]]:
        """Where a path from ``a`` to ``b`` may go from ``u``: hubs other than ``a``, or ``b``
        (the only GPU a path may enter, other than the one it starts from)."""
        for v, hop in self.hubs[u]:
            if v != a and v != b:
                yield v, hop
        hop_b = self.adj[u].get(b)
        if hop_b is not None:
            yield b, hop_b
        if u != a:
            hop_a = self.adj[u].get(a)
            if hop_a is not None:
                yield a, hop_a

    def _widest(self, start: str, end: str, a: str, b: str, rank: int) -> float:
        """The largest thinnest-hop bandwidth of a path of type <= ``rank`` (Dijkstra)."""
        best = {start: math.inf}
        heap: list[tuple[float, int, str]] = [(-math.inf, 0, start)]
        while heap:
            neg, hops, u = heapq.heappop(heap)
            if u == end:
                return -neg
            if -neg < best[u] or (u != start and u in self.gpus):
                continue
            for v, hop in self._steps(u, a, b):
                if v == start or hop.rank > rank:
                    continue
                width = min(-neg, hop.bandwidth)
                if width > best.get(v, -1.0):
                    best[v] = width
                    heapq.heappush(heap, (-width, hops + 1, v))
        raise AssertionError(f"no path of rank {rank} from {start} to {end}")  # type_rank found one

    def _layers(self, start: str, end: str, a: str, b: str, rank: int, bandwidth: float
                ) -> tuple[list[list[str]], dict[str, int]]:
        """BFS layers from ``start`` over hops of type <= rank and bandwidth >= bandwidth, up
        to the layer before ``end`` (which ends the last one)."""
        level = {start: 0}
        layers = [[start]]
        while True:
            nxt: list[str] = []
            for u in layers[-1]:
                if u != start and u in self.gpus:
                    continue  # a GPU (the other end) is never passed through
                for v, hop in self._steps(u, a, b):
                    if v in level or hop.rank > rank or hop.bandwidth < bandwidth:
                        continue
                    level[v] = len(layers)
                    nxt.append(v)
            if end in level:
                layers.append([end])
                return layers, level
            if not nxt:
                raise AssertionError(f"{end} unreachable from {start}")  # _widest reached it
            layers.append(nxt)

    @staticmethod
    def _ok(hop: Hop, rank: int, bandwidth: float) -> bool:
        return hop.rank <= rank and hop.bandwidth >= bandwidth

    def _toward(self, u: str, k: int, last: str, level: dict[str, int], other: str
                ) -> Iterator[tuple[str, Hop]]:
        """``u``'s neighbours on BFS layer ``k`` in adjacency order: the far end ``last`` on
        layer 0 or the final layer (``k`` < 0 asks for it), else hubs other than ``other``."""
        if k < 0:
            hop = self.adj[u].get(last)
            if hop is not None:
                yield last, hop
            return
        for v, hop in self.hubs[u]:
            if level.get(v) == k and v != other and v != last:
                yield v, hop

    def _walk_forward(self, a: str, b: str, rank: int, bandwidth: float,
                      layers: list[list[str]], level: dict[str, int]) -> tuple[str, ...]:
        """Layers from ``a``: the widest capacity to ``b`` back from ``b``, then the walk."""
        last = len(layers) - 1

        def ahead(u: str, k: int) -> Iterator[tuple[str, Hop]]:
            return self._toward(u, -1 if k == last else k, b, level, a)

        cap = {b: math.inf}  # the best thinnest capacity from a node to b on a shortest path
        for k in range(last - 1, -1, -1):
            for u in layers[k]:
                widths = [min(hop.capacity, cap[v]) for v, hop in ahead(u, k + 1)
                          if v in cap and self._ok(hop, rank, bandwidth)]
                if widths:
                    cap[u] = max(widths)
        target = cap[a]
        path, u = [a], a
        for k in range(1, last + 1):
            u = next(v for v, hop in ahead(u, k) if v in cap and self._ok(hop, rank, bandwidth)
                     and min(hop.capacity, cap[v]) >= target)
            path.append(u)
        return tuple(path)

    def _walk_back(self, a: str, b: str, rank: int, bandwidth: float,
                   layers: list[list[str]], level: dict[str, int]) -> tuple[str, ...]:
        """Layers from ``b`` (``a`` alone on the last): the widest capacity from ``b`` forward,
        then the walk from ``a`` down the layers."""
        last = len(layers) - 1

        def behind(u: str, k: int) -> Iterator[tuple[str, Hop]]:
            return self._toward(u, -1 if k == 0 else k, b, level, a)

        cap = {b: math.inf}  # the best thinnest capacity from b to a node on a shortest path
        for k in range(1, last):
            for v in layers[k]:
                widths = [min(hop.capacity, cap[u]) for u, hop in behind(v, k - 1)
                          if u in cap and self._ok(hop, rank, bandwidth)]
                if widths:
                    cap[v] = max(widths)
        target = max(min(hop.capacity, cap[v]) for v, hop in behind(a, last - 1)
                     if v in cap and self._ok(hop, rank, bandwidth))
        path, u = [a], a
        for k in range(last - 1, -1, -1):
            u = next(v for v, hop in behind(u, k) if v in cap and self._ok(hop, rank, bandwidth)
                     and min(hop.capacity, cap[v]) >= target)
            path.append(u)
        return tuple(path)


def unreached(adjacency: Mapping[str, Mapping[str, object]], start: str) -> list[str]:
    """The first group of nodes (in adjacency order) that ``start`` cannot reach, sorted."""
    seen = _component(adjacency, start)
    for node in adjacency:
        if node not in seen:
            return sorted(_component(adjacency, node))
    return []


def _component(adjacency: Mapping[str, Mapping[str, object]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for v in adjacency[todo.pop()]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen
