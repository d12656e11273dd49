"""Several boxes: the cluster graph, NCCL's network transport decisions against its rules
(paths.cc ncclTopoCheckGdr, the plugin order, net_socket.cc), closed forms of rings and trees
across boxes, the tuner's network terms, and the strategies across boxes (HSDP's traffic
split, TP kept inside a box, pipeline stages box by box)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simulator import api
from simulator.cli import main
from simulator.engine.program import Comm
from simulator.errors import InputError
from simulator.inputs.config import load_topology
from simulator.machine.topology import Machine
from simulator.nccl import tuning as nt
from simulator.nccl import wire
from simulator.nccl.communicator import Communicator
from simulator.nccl.env import NcclEnv
from simulator.nccl.perf import time_alone
from simulator.nccl.tree import btree, dtree, parents
from simulator.units import GB, US

# One GPU and one NIC on a PCIe switch under one CPU, two boxes: everything wide but the
# network, so a collective's rate is the network's (the closed forms below).
BOX = """
name: {name}
gpu: {gpu}
p2p: true
nnodes: {nnodes}
network: {{kind: {kind}, gbps: {gbps}, latency_us: 0}}
nodes:
  - {{id: cpu0, kind: cpu, model: sapphire-rapids-upi, memory_bandwidth_gb_per_s: 1000}}
  - {{id: cpu1, kind: cpu, model: sapphire-rapids-upi, memory_bandwidth_gb_per_s: 1000}}
  - {{id: sw0, kind: pcie_switch}}
  - {{id: nic0, kind: nic, gbps: {gbps}, rdma: {rdma}}}
  - {{id: gpu0, kind: gpu}}
  - {{id: gpu1, kind: gpu}}
links:
  - {{a: cpu0, b: cpu1, kind: upi}}
  - {{a: cpu0, b: sw0, kind: pcie, gen: 5, lanes: 16}}
  - {{a: sw0, b: gpu0, kind: pcie, gen: 5, lanes: 16}}
  - {{a: sw0, b: nic0, kind: pcie, gen: 5, lanes: 16}}
  - {{a: {second}, b: gpu1, kind: pcie, gen: 5, lanes: 16}}
"""


def cluster(tmp_path: Path, *, gpu: str = "h100-pcie", gbps: float = 100, rdma: bool = True,
            kind: str = "infiniband", nnodes: int = 2, second: str = "sw0",
            env: NcclEnv | None = None) -> Communicator:
    path = tmp_path / f"c-{gpu}-{kind}-{second}-{nnodes}.yaml"
    path.write_text(BOX.format(name=path.stem, gpu=gpu, gbps=gbps, rdma=str(rdma).lower(),
                               kind=kind, nnodes=nnodes, second=second))
    return Communicator(Machine.from_config(load_topology(str(path))), env or NcclEnv())


# --- the cluster graph ----------------------------------------------------------------------

def test_boxes_are_copies_joined_through_their_nics(tmp_path: Path) -> None:
    m = cluster(tmp_path).machine
    assert m.n_gpus == 4 and m.nnodes == 2 and m.gpus_per_box == 2
    assert [m.box_of(r) for r in range(4)] == [0, 0, 1, 1]  # torchrun's node order
    assert m.path_type(0, 1) == "PIX" and m.path_type(0, 2) == "NET"
    path = m.best_path(m.gpu_nodes[0], m.gpu_nodes[2])
    assert path.nodes == ("n0.gpu0", "n0.sw0", "n0.nic0", "net", "n1.nic0", "n1.sw0", "n1.gpu0")
    wire_rate = m.links["n0.nic0->net"].capacity
    assert wire_rate == pytest.approx(100e9 / 8 * 4096 / 4122)  # line rate x IB's frame share


def test_a_box_without_a_nic_says_what_to_add(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collective", "-t", "2x5090", "--nnodes", "2", "--op", "allreduce"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2x5090.yaml" in err
    assert "kind: nic" in err and "pcie" in err


def test_gpus_count_each_box(tmp_path: Path) -> None:
    m = api.load_machine("2x8x5090-100g-roce", gpus=2)
    assert m.n_gpus == 4 and m.gpus_per_box == 2 and m.nnodes == 2
    assert api.load_machine("2x8x5090-100g-roce", nnodes=1).n_gpus == 8


# --- NCCL's decisions -----------------------------------------------------------------------

def test_plugin_order_and_variables(tmp_path: Path) -> None:
    assert cluster(tmp_path).net.name == "IB"
    assert cluster(tmp_path, rdma=False, kind="ethernet").net.name == "Socket"
    off = NcclEnv.from_environ({"NCCL_IB_DISABLE": "1"})
    assert cluster(tmp_path, env=off).net.name == "Socket"
    forced = NcclEnv.from_environ({"NCCL_NET": "socket"})  # strcasecmp
    assert cluster(tmp_path, env=forced).net.name == "Socket"
    with pytest.raises(InputError, match="NCCL_NET=IB"):
        _ = cluster(tmp_path, rdma=False, env=NcclEnv.from_environ({"NCCL_NET": "IB"})).net.name


def test_gdr_follows_nccl_rules(tmp_path: Path) -> None:
    """paths.cc ncclTopoCheckGdr: NIC and GPU support, read rule, distance <= GDR level."""
    pro = cluster(tmp_path, gpu="rtx-pro-6000")
    assert pro.net.gdr(0, "n0.nic0", read=True).used  # PIX, Blackwell: both ways
    assert not cluster(tmp_path, gpu="rtx5090").net.gdr(0, "n0.nic0", read=False).used
    far = cluster(tmp_path, gpu="rtx-pro-6000", second="cpu1")  # gpu1 on the other socket
    assert not far.net.gdr(1, "n0.nic0", read=False).used  # SYS > PXB
    level = NcclEnv.from_environ({"NCCL_NET_GDR_LEVEL": "SYS"})
    assert cluster(tmp_path, gpu="rtx-pro-6000", second="cpu1", env=level).net.gdr(
        1, "n0.nic0", read=False).used
    never = NcclEnv.from_environ({"NCCL_NET_GDR_LEVEL": "LOC"})
    assert not cluster(tmp_path, gpu="rtx-pro-6000", env=never).net.gdr(0, "n0.nic0",
                                                                        read=False).used
    no_read = NcclEnv.from_environ({"NCCL_NET_GDR_READ": "0"})
    read_off = cluster(tmp_path, gpu="rtx-pro-6000", env=no_read).net
    assert not read_off.gdr(0, "n0.nic0", read=True).used
    assert read_off.gdr(0, "n0.nic0", read=False).used
    volta = cluster(tmp_path, gpu="v100-sxm2").net  # two GPUs, no NVLink peer: reads staged
    assert not volta.gdr(0, "n0.nic0", read=True).used and volta.gdr(0, "n0.nic0",
                                                                     read=False).used
    sockets = cluster(tmp_path, gpu="rtx-pro-6000", rdma=False, kind="ethernet").net
    assert not sockets.gdr(0, "n0.nic0", read=False).used  # NCCL_PTR_HOST only


def test_staging_goes_through_the_gpus_own_host_memory(tmp_path: Path) -> None:
    """Without GDR both ends stage through their local CPU's memory: the GPU's stores and
    the NIC's DMA, twice per side for IB and four times for sockets (the kernel's copy)."""
    for rdma, kind, passes in ((True, "infiniband", 2.0), (False, "ethernet", 4.0)):
        comm = cluster(tmp_path, gpu="rtx5090", rdma=rdma, kind=kind)
        route = dict(comm.route(0, 2))
        assert route["mem:n0.cpu0"] == passes and route["mem:n1.cpu0"] == passes
        assert route["n0.sw0->n0.cpu0"] == 1.0 and route["n0.cpu0->n0.sw0"] == 1.0
    gdr = dict(cluster(tmp_path, gpu="rtx-pro-6000").route(0, 2))
    assert not any(lid.startswith("mem:") for lid in gdr)


# --- closed forms -----------------------------------------------------------------------------

def test_two_box_ring_on_the_network_closed_form(tmp_path: Path) -> None:
    """A ring over two boxes, each box's two GPUs on one switch: every channel crosses each
    boundary once each way, so each NIC link carries 2(n-1)/n x S; on a network that binds,
    busbw = the network's payload rate x NET/IB's efficiency."""
    comm = cluster(tmp_path, gpu="rtx-pro-6000", gbps=25)
    size = 1 << 30
    r = time_alone(comm, "allreduce", size, algo="ring", protocol="Simple")
    rate = comm.machine.links["n0.nic0->net"].capacity * wire.NET_EFFICIENCY
    plan = comm.plan("allreduce", size, algo="ring", protocol="Simple")
    expected = plan.latency + 2 * 3 / 4 * size / rate
    assert r.time_us * US == pytest.approx(expected, rel=1e-6)
    assert r.busbw_gbps == pytest.approx(rate / GB, rel=2e-3)


def test_tree_on_two_boxes_goes_beyond_one_nic(tmp_path: Path) -> None:
    """NVIDIA/nccl-tests#196: on two boxes NCCL's tree moves S per NIC direction where the
    ring moves 2(n-1)/n x S: its busbw exceeds the NIC's line rate (here by 2(n-1)/n)."""
    comm = cluster(tmp_path, gpu="rtx-pro-6000", gbps=25)
    ring = time_alone(comm, "allreduce", 1 << 30, algo="ring").busbw_gbps
    tree = time_alone(comm, "allreduce", 1 << 30, algo="tree").busbw_gbps
    assert tree > 25 / 8 and tree == pytest.approx(ring * 2 * 3 / 4, rel=0.02)


def test_socket_ceiling_is_one_stream_without_helper_threads(tmp_path: Path) -> None:
    comm = cluster(tmp_path, gpu="rtx-pro-6000", rdma=False, kind="ethernet", gbps=400)
    busbw = time_alone(comm, "allreduce", 1 << 30, algo="ring").busbw_gbps
    assert busbw == pytest.approx(wire.SOCKET_STREAM_GBPS, rel=0.01)
    threads = NcclEnv.from_environ({"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "2"})
    more = cluster(tmp_path, gpu="rtx-pro-6000", rdma=False, kind="ethernet", gbps=400,
                   env=threads)
    assert more.net.stream_ceiling(2) == pytest.approx(2 * 4 * wire.SOCKET_STREAM_GBPS * GB)
    assert time_alone(more, "allreduce", 1 << 30, algo="ring").busbw_gbps > 2 * busbw


def test_rings_take_each_nic_in_turn() -> None:
    """Eight rails a box: a channel pattern per NIC, each NIC's link equally loaded."""
    comm = api.load_communicator("4x8xh100-400g-ib")
    ring = comm.ring()
    assert len(ring.patterns) == 8 and ring.n_nodes == 4
    plan = comm.plan("allreduce", 1 << 30, algo="ring")
    loads = {lid: w for lid, w in plan.usage if lid.endswith("->net")}
    assert len(loads) == 32 and max(loads.values()) == pytest.approx(min(loads.values()))


# --- NCCL's tuner and trees -------------------------------------------------------------------

def test_double_binary_tree_is_ncclGetDtree() -> None:
    assert btree(2, 0) == (-1, -1, 1) and btree(2, 1)[0] == 0
    (p0, *_), (p1, *_) = dtree(2, 0)
    assert (p0, p1) == (-1, 1)  # the mirror: node 0 is the root of one tree, a leaf of the other
    for n in (2, 3, 4, 5, 8):
        for tree in parents(n):
            assert tree.count(-1) == 1  # one root, and every node reaches it
            for k in range(n):
                seen, node = set(), k
                while node != -1 and node not in seen:
                    seen.add(node)
                    node = tree[node]
                assert node == -1


def test_tuner_network_latency_terms() -> None:
    """tuning.cc L384-431 across two boxes of 8: ring all-reduce Simple = base + 28 intra
    steps at max(PCI 5.7, 3 x 1 us) + 2 network steps at 14; tree = base + 2 x (7 x 4.0 +
    log2(2) x 14)."""
    graph = nt.Graph(16, 2, 12.0, False, "blackwell", n_nodes=2, cpu_vendor="intel")
    assert nt.latency_us(graph, "allreduce", "ring", "Simple") == pytest.approx(
        8.4 + 28 * 5.7 + 2 * 14.0)
    assert nt.latency_us(graph, "allreduce", "tree", "Simple") == pytest.approx(
        8.4 + 2 * (7 * 4.0 + 1 * 14.0))
    amd = nt.Graph(16, 2, 12.0, False, "blackwell", n_nodes=2, cpu_vendor="amd")
    assert nt.latency_us(amd, "allreduce", "ring", "Simple") == pytest.approx(
        8.4 + 28 * 6.0 + 2 * 14.0)  # AMD's 2 us net overhead x 3 for Simple
    assert nt.caps(amd)[0] == 22.5  # llMaxBw across two boxes by CPU vendor
    plateau = nt.estimate(graph, "allreduce", 1 << 30, "ring", "Simple")
    plain = nt.latency_us(graph, "allreduce", "ring", "Simple") * 1.4
    assert plateau == pytest.approx(plain + (1 << 30) / (1000 * 12.0 * 2 * 16 / 30), rel=1e-9)


# --- strategies across boxes -------------------------------------------------------------------

def test_hsdp_reduce_scatters_inside_and_all_reduces_shards_across() -> None:
    result = api.simulate(api.RunSpec("2x8x5090-100g-roce", "llama3.2-1b", "hsdp",
                                      checkpointing="full"), baseline=False)
    comms = [t.work for p in result.programs for t in p.tasks if isinstance(t.work, Comm)]
    boxes = result.machine.box_of
    rs = [c for c in comms if c.op == "reducescatter"]
    ar = [c for c in comms if c.op == "allreduce"]
    assert rs and len(ar) == len(rs)
    assert all(len({boxes(r) for r in g}) == 1 for c in rs for g in c.groups)  # inside a box
    assert all(len({boxes(r) for r in g}) == 2 and len(g) == 2 for c in ar for g in c.groups)
    for scatter, reduce in zip(rs, ar, strict=True):  # the shard: 1/8 of the reduced bytes
        assert reduce.nbytes == pytest.approx(scatter.nbytes / 8, abs=8)
    assert result.report["parallelism"]["dp"] == 16 and result.report["network"]["nnodes"] == 2


def test_tp_across_boxes_is_refused_unless_allowed() -> None:
    spec = api.RunSpec("2x8x5090-100g-roce", "llama2-7b", "tp", tp=16)
    with pytest.raises(InputError, match="allow-tp-across-nodes"):
        api.simulate(spec, baseline=False)
    inside = api.RunSpec("2x8x5090-100g-roce", "llama3.2-1b", "tp+ddp", tp=8)
    assert api.simulate(inside, baseline=False).report["step_time_s"] > 0


def test_pipeline_stages_go_box_by_box() -> None:
    split = api.pipeline_split(api.RunSpec("2x8x5090-100g-roce", "llama3.2-1b", "ddp", pp=2))
    assert split is not None
    assert split["stage_gpus"] == [list(range(8)), list(range(8, 16))]


def test_collective_prints_the_whole_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collective", "-t", "2x8x4090-25gbe", "--op", "all_reduce_perf", "-b", "1M",
                 "-g", "8"]) == 0
    out = capsys.readouterr().out
    assert "nGpus 8 " in out and "#  Rank 15 " in out and "stepsim1" in out
    assert "NET/Socket" in out and "no GPUDirect RDMA" in out


def test_more_bandwidth_never_slows_a_collective(tmp_path: Path) -> None:
    times = [time_alone(cluster(tmp_path, gpu="rtx5090", gbps=g), "allreduce", 1 << 26).time_us
             for g in (10, 25, 100, 400)]
    assert all(a >= b for a, b in zip(times, times[1:], strict=False))
    assert math.isfinite(times[-1])


# --- published numbers (validation/multinode.yaml), each with its tolerance ---------------------

def _rows() -> dict[tuple[str, int], float]:
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("validate_multinode",
                                                  root / "scripts" / "validate_multinode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def row(rid: str, op: str, gpus: int, nbytes: int, quantity: str, measured: float,
            simulated: float, *_: object) -> tuple[tuple[str, int], float]:
        return (rid, gpus), simulated / measured - 1

    return dict(module.rows(module.load(), row))


# Tolerances: the IB plateau fits within 5% (their mean fixed net_efficiency); the host-staged
# 100 Gb/s ring and the tree over it (nccl-tests#22) within 10%; sockets with one GPU a box
# (nccl#209) within 10%; two boxes of eight A100 on 8 RoCE rails (nccl-tests#169) within 10%.
# Not held: sockets with 8 GPUs a box and many helper threads (nccl#209, nccl#450: the model
# gives up to 2x and, past 32 MiB on #450, 5x their rate: docs/accuracy.md) and RoCE past two
# boxes (nccl-tests#169: 36-137% over; the fabric's congestion is not modelled).
PUBLISHED = {("nccl-tests-29-edr", 2): 0.05, ("nccl-812-dgxa100-8hdr", 16): 0.05,
             ("nccl-tests-119-3x8a100-4hdr", 24): 0.05, ("nccl-tests-150-2x1a100-hdr", 2): 0.01,
             ("nccl-209-gcp-32gbe-1gpu", 2): 0.10, ("nccl-209-gcp-32gbe-4x1gpu", 4): 0.10,
             ("nccl-tests-169-8xa100-8x100g-roce", 16): 0.10}


def test_published_multinode_numbers_within_their_tolerance() -> None:
    errors = _rows()
    for key, tolerance in PUBLISHED.items():
        assert abs(errors[key]) <= tolerance, (key, errors[key])


def test_ring_and_tree_on_two_p3dn_within_ten_percent() -> None:
    """nccl-tests#22: 268 ms ring, 134 ms tree for 1 GB on two boxes of 8 V100, 100 Gb/s,
    host-staged (EFA without GDR)."""
    comm = api.load_communicator("validation/topologies/8xv100-p3dn-efa.yaml",
                                 env=NcclEnv.from_environ({"NCCL_NET_GDR_LEVEL": "LOC"}))
    ring = time_alone(comm, "allreduce", 1 << 30, algo="ring").time_us
    tree = time_alone(comm, "allreduce", 1 << 30, algo="tree").time_us
    assert ring == pytest.approx(268_000, rel=0.10) and tree == pytest.approx(134_000, rel=0.10)
    # by default NCCL picked the tree there: its graph, searched on its own, is the faster one
    assert time_alone(comm, "allreduce", 1 << 30).algorithm == "tree"
    assert comm.ring().tree_bandwidth > comm.ring().channel_bandwidth


# --- inputs ---------------------------------------------------------------------------------

def test_network_variables_read_as_nccl_reads_them() -> None:
    env = NcclEnv.from_environ({"NCCL_NET": "ib", "NCCL_IB_DISABLE": "0",
                                "NCCL_NET_GDR_LEVEL": "2", "NCCL_CROSS_NIC": "0",
                                "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "2"})
    assert (env.net, env.ib_disable, env.gdr_level, env.cross_nic) == ("IB", False, "PXB", 0)
    assert (env.socket_threads, env.socks_per_thread) == (4, 2)
    assert NcclEnv.from_environ({"NCCL_NET_GDR_LEVEL": "pxb"}).ignored  # case-sensitive
    with pytest.raises(InputError, match="no network plugin"):
        NcclEnv.from_environ({"NCCL_NET": "verbs"})


def test_nic_keys_and_boxes_are_checked_where_they_are(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ngpu: rtx4090\nnnodes: 2\nnodes:\n"
                    "  - {id: gpu0, kind: gpu, gbps: 100}\n")
    with pytest.raises(InputError) as found:
        load_topology(str(path))
    assert found.value.file == str(path) and found.value.line == 5
    assert "gbps is a key of nic nodes" in found.value.message


def test_topo_import_keeps_what_nccl_says_of_a_nic(tmp_path: Path) -> None:
    from simulator.inputs import nccl_topo_xml
    from simulator.inputs.topo_import import ImportOptions, from_nccl_xml

    xml = tmp_path / "system.xml"
    xml.write_text(
        '<system version="1"><cpu numaid="0" arch="x86_64" vendor="GenuineIntel" '
        'familyid="6" modelid="143"><pci busid="0000:10:00.0" class="0x060400" '
        'link_speed="32.0 GT/s PCIe" link_width="16">'
        '<pci busid="0000:11:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" '
        'link_width="16"><gpu dev="0" sm="90" rank="0"/></pci>'
        '<pci busid="0000:12:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" '
        'link_width="16"><nic><net name="mlx5_0" dev="0" speed="400000" gdr="1"/></nic></pci>'
        '</pci></cpu></system>')
    system = nccl_topo_xml.parse(xml.read_text(), str(xml))
    data = from_nccl_xml(system, ImportOptions(gpu="h100-sxm", name="x"), str(xml)).data
    nic = next(n for n in data["nodes"] if n["kind"] == "nic")
    assert nic["gbps"] == 400 and nic["rdma"] is True


# --- advice -----------------------------------------------------------------------------------

def test_a_second_box_is_weighed_with_its_cost() -> None:
    from simulator.advice import boxes
    from simulator.advice.advise import PricedMachine
    from simulator.outputs.cost import Prices

    def report(n: int, tokens: float, usd: float, hourly: float) -> dict[str, object]:
        return {"options": {"topology": "t", "nnodes": n}, "parallelism": {"nnodes": n},
                "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / (8 * n),
                "label": "fsdp", "cost": {"usd_per_hour": hourly},
                "cost_basis": {"purchase_usd": usd, "purchase_source": "cards; network $1,000"},
                **({"network": {"plugin": "IB", "gpudirect_rdma": False}} if n > 1 else {})}

    machines = [PricedMachine("t", Prices(), 1), PricedMachine("t", Prices(), 2)]
    lines = boxes.lines([report(2, 1800, 33000, 20), report(1, 1000, 16000, 10)], machines)
    assert "x1.80" in lines[1] and "90% of one box's tokens/s per GPU" in lines[1]
    assert "$17,000 more to buy (cards and network)" in lines[1]
    assert "$21,250 per added 1k tokens/s" in lines[1] and "$10.00 more per hour" in lines[1]


def test_calibrate_recovers_the_network_from_a_log_across_boxes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A two-box log the simulator printed with a slower network (net_efficiency 0.8): the fit
    finds 0.8 back, and says which parameters these rows cannot tell."""
    from dataclasses import replace

    comm = api.load_communicator("2x8x5090-100g-roce")
    slow = Communicator(comm.machine, comm.env, replace(comm.wire, net_efficiency=0.8))
    rows = []
    for k in range(3, 31, 3):
        r = time_alone(slow, "allreduce", 1 << k)
        rows.append(f"{1 << k:>12} {(1 << k) // 4:>12}  float  sum  -1  {r.time_us:8.2f}  "
                    f"{r.algbw_gbps:6.2f}  {r.busbw_gbps:6.2f}  0  {r.time_us:8.2f}  "
                    f"{r.algbw_gbps:6.2f}  {r.busbw_gbps:6.2f}  0")
    header = ["# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 8(factor)", "#",
              "# Using devices"]
    header += [f"#  Rank {r:2d} Group  0 Pid {r // 8:6d} on   stepsim{r // 8} device {r % 8:2d} "
               f"[0x{r % 8:02x}] NVIDIA GeForce RTX 5090" for r in range(16)]
    header += ["#", "#       size         count      type   redop    root     time   algbw   busbw "
               "#wrong     time   algbw   busbw #wrong", "#        (B)    (elements)   "
               "                            (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    log = tmp_path / "two-boxes.log"
    log.write_text("\n".join(header + rows + ["# Out of bounds values : 0 OK",
                                              "# Avg bus bandwidth    : 1 ", "#"]) + "\n")
    assert main(["calibrate", "-t", "2x8x5090-100g-roce", "--nnodes", "2", str(log)]) == 0
    out = capsys.readouterr().out
    fitted = next(line for line in out.splitlines() if line.strip().startswith("net_efficiency"))
    assert float(fitted.split("->")[1].split()[0]) == pytest.approx(0.8, rel=0.02)
