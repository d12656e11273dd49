"""paths.py: the staged best-path search returns exactly the path that walking every simple path
(networkx.all_simple_paths, NCCL's ranking, first of equals kept) returns: on every bundled and
validation machine, on generated large boxes, and on random graphs with many ties (Hypothesis)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.inputs.config import load_topology, preset_names
from simulator.machine.paths import PATH_RANK, PATH_TYPES, PathFinder
from simulator.machine.topology import Machine
from simulator.nccl.communicator import Communicator

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("boxes", ROOT / "scripts" / "boxes.py")
assert _spec is not None and _spec.loader is not None
boxes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(boxes)


def enumerated_best(graph: nx.DiGraph, gpus: set[str], a: str, b: str
                    ) -> tuple[str, ...] | None:
    """The reference: every simple path avoiding other GPUs, NCCL's key, first of equals."""
    view = nx.subgraph_view(graph, filter_node=lambda n: n in (a, b) or n not in gpus)
    best, best_key = None, None
    for nodes in nx.all_simple_paths(view, a, b):
        hops = [graph.edges[u, v] for u, v in itertools.pairwise(nodes)]
        key = (max(h["rank"] for h in hops), -min(h["nccl_bandwidth"] for h in hops), len(hops),
               -min(h["capacity"] for h in hops))
        if best_key is None or key < best_key:
            best, best_key = tuple(nodes), key
    return best


def _machines() -> list[tuple[str, Machine]]:
    out = [(name, Machine.from_config(load_topology(name))) for name in preset_names("topologies")]
    out += [(p.stem, Machine.from_config(load_topology(str(p))))
            for p in sorted((ROOT / "validation" / "topologies").glob("*.yaml"))]
    return out


def _generated(tmp_path: Path, text: str) -> Machine:
    path = tmp_path / "box.yaml"
    path.write_text(text)
    return Machine.from_config(load_topology(str(path)))


def _check_every_pair(machine: Machine, sources: int | None = None) -> None:
    """Every GPU-GPU, GPU-CPU and CPU-GPU path (from the first ``sources`` GPUs only)."""
    graph = machine.graph
    gpus = set(machine.gpu_nodes)
    cpus = [n for n, c in machine.nodes.items() if c.kind == "cpu"]
    ends = list(machine.gpu_nodes) + cpus  # the paths the simulator asks for
    starts = set(machine.gpu_nodes[:sources] if sources else machine.gpu_nodes) | set(cpus)
    for a, b in itertools.permutations(ends, 2):
        if (a in cpus and b in cpus) or a not in starts:
            continue
        want = enumerated_best(graph, gpus, a, b)
        assert machine.paths.best(a, b) == want, (machine.name, a, b)
        if want is not None:
            assert PATH_TYPES[machine.paths.type_rank(a, b)] == machine.best_path(a, b).type


@pytest.mark.parametrize("name,machine", _machines(), ids=lambda v: v if isinstance(v, str) else "")
def test_same_paths_as_walking_every_simple_path(name: str, machine: Machine) -> None:
    _check_every_pair(machine)


@pytest.mark.parametrize("family,gpus", [("nvswitch", 16), ("pcie_tree", 72)])
def test_same_paths_on_generated_boxes(tmp_path: Path, family: str, gpus: int) -> None:
    # 72 GPUs: a switch tree two levels deep (PIX, PXB and PHB paths); from the first leaf
    _check_every_pair(_generated(tmp_path, getattr(boxes, family)(gpus)), sources=9)


def test_generated_boxes_of_eight_are_the_presets(tmp_path: Path) -> None:
    for family, preset in (("nvswitch", "8xh100-nvswitch"), ("pcie_tree", "8x5090-switch")):
        made, bundled = _generated(tmp_path, getattr(boxes, family)(8)), \
            Machine.from_config(load_topology(preset))
        assert Communicator(made).ring() == Communicator(bundled).ring()
        made_comm, bundled_comm = Communicator(made), Communicator(bundled)
        assert [made_comm.route(0, j) for j in range(8)] == \
            [bundled_comm.route(0, j) for j in range(8)]


def test_nearest_lists_gpus_by_path_type(tmp_path: Path) -> None:
    machine = _generated(tmp_path, boxes.pcie_tree(72))
    head, rest = machine.gpu_nodes[0], list(machine.gpu_nodes[1:])
    swept = [(rank, node) for rank, found in machine.paths.nearest(head, rest) for node in found]
    by_pair = sorted((machine.paths.type_rank(head, n), rest.index(n)) for n in rest)
    assert [(rank, rest.index(node)) for rank, node in swept] == by_pair


# --- random graphs: cycles among hubs and few distinct numbers, so ties are common ----------

RANKS = [PATH_RANK[t] for t in ("NVL", "PIX", "PXB", "PHB", "SYS")]


Hop = dict[str, float]  # a link's rank, NCCL bandwidth and capacity


@st.composite
def machines(draw: st.DrawFn) -> tuple[list[tuple[str, str, Hop]], list[str], list[str]]:
    n_hubs = draw(st.integers(2, 6))
    n_gpus = draw(st.integers(2, 4))
    hubs, gpus = [f"h{i}" for i in range(n_hubs)], [f"g{i}" for i in range(n_gpus)]
    hop = st.fixed_dictionaries({"rank": st.sampled_from(RANKS),
                                 "nccl_bandwidth": st.sampled_from([10.0, 20.0]),
                                 "capacity": st.sampled_from([1.0, 2.0])})
    pairs = [p for p in itertools.combinations(hubs + gpus, 2)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, min_size=1, max_size=14))
    edges = [(u, v, draw(hop)) for u, v in draw(st.permutations(chosen))]
    return edges, hubs, gpus


@settings(max_examples=150, deadline=None)
@given(machines())
def test_same_paths_on_random_graphs(case: tuple[list[tuple[str, str, Hop]], list[str],
                                                 list[str]]) -> None:
    edges, hubs, gpus = case
    graph = nx.DiGraph()
    graph.add_nodes_from(hubs + gpus)
    for u, v, hop in edges:  # a link is both directions, alike
        graph.add_edge(u, v, **hop)
        graph.add_edge(v, u, **hop)
    finder = PathFinder(graph, set(gpus))
    for a, b in itertools.permutations(hubs + gpus, 2):
        want = enumerated_best(graph, set(gpus), a, b)
        assert finder.best(a, b) == want, (a, b)
        if want is not None:
            rank = max(graph.edges[u, v]["rank"] for u, v in itertools.pairwise(want))
            assert finder.type_rank(a, b) == rank
        else:
            assert finder.type_rank(a, b) is None
    for a in hubs + gpus:  # one sweep gives every best path's capacity
        others = [b for b in hubs + gpus if b != a and finder.best(a, b) is not None]
        want = {b: min(graph.edges[u, v]["capacity"]
                       for u, v in itertools.pairwise(finder.best(a, b) or ())) for b in others}
        assert finder.capacities(a, others) == want, a


def test_capacities_from_one_source_are_the_best_paths_capacities(tmp_path: Path) -> None:
    for machine in (*(m for _, m in _machines()), _generated(tmp_path, boxes.pcie_tree(72))):
        ends = list(machine.gpu_nodes) + list(machine.cpu_nodes)
        for a in machine.gpu_nodes[:9]:
            swept = machine.path_capacities(a, [b for b in ends if b != a])
            assert swept == {b: machine.best_path(a, b).capacity for b in ends if b != a}


def test_the_paths_are_found_on_the_machines_graph() -> None:
    machine = Machine.from_config(load_topology("8x5090-dual-socket"))
    assert isinstance(machine.graph, nx.DiGraph) and machine.paths.graph is machine.graph
    path = machine.best_path("gpu0", "gpu5")
    assert all(machine.graph.has_edge(u, v) for u, v in itertools.pairwise(path.nodes))
    assert path.links == tuple(machine.graph.edges[u, v]["id"]
                               for u, v in itertools.pairwise(path.nodes))
