"""The typed, frozen models of the two input files (topology and workload YAML).

Units are in the key names (``bandwidth_gb_per_s``, ``latency_us``). Every model is a frozen
dataclass; pydantic checks the data against them (``from_data``), and loads only then: a
preset read back from the cache (preset_cache.py) is a model without pydantic ever imported,
which is most of what starting a run costs. The bounds and checks below are written as plain
markers that pydantic reads when it checks; see simulator/inputs/config.py for how errors are
reported (file:line:key).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self, get_args

from simulator.errors import quoted

if TYPE_CHECKING:
    from pydantic import TypeAdapter

# network_switch: the switch that joins the boxes of a cluster (machine/cluster.py makes it)
NodeKind = Literal["gpu", "cpu", "pcie_switch", "nvswitch", "nic", "network_switch"]
NetworkKind = Literal["ethernet", "roce", "infiniband"]
LinkKind = Literal["pcie", "nvlink", "upi", "xgmi", "network"]
PathLevel = Literal["LOC", "NVL", "PIX", "PXB", "PHB", "SYS"]


# Limits: each number keeps the simulation finite and fast, far beyond any real machine or
# model (docs/inputs.md, "Limits", gives the reasons; tests/test_docs.py keeps the two in step).
MAX_GPUS = 1024  # the largest machine the benchmarks (scripts/bench.py) cover
MAX_NODES = 16_384
MAX_LINKS = 65_536
MIN_GB_PER_S = 0.001  # 1 MB/s: below any link a GPU talks over (USB 2 is 60 MB/s)
MAX_GB_PER_S = 100_000.0  # 100 TB/s: 50x NVLink 5's 1.8 TB/s per GPU
MAX_LATENCY_US = 1e6  # one second per hop
MAX_LANES = 32  # PCIe's widest link (x32)
MAX_NVLINKS = 64  # NVLinks between two ends; an H100 has 18 in all
MAX_LAYERS = 4096  # 32x the deepest published transformer (Megatron-LM's 1T: 128 layers)
MAX_WIDTH = 2**18  # hidden: 10x Megatron-LM 1T's 25,600; also heads and kv_heads
MAX_FFN = 2**20  # 20x Llama 3.1 405B's 53,248
MAX_EXPERTS = 4096  # 16x DeepSeek-V3's 256 routed experts
MAX_VOCAB = 2**24  # 64x Gemma's 256,000
MAX_TOKENS = 2**24  # seq_len, max_positions: 16x the longest training context (1M)
MAX_BATCH = 2**16  # micro_batch, grad_accum
MAX_STEP_TOKENS = 2**28  # micro_batch x grad_accum x seq_len per GPU: 16x Llama 3's whole
# 16M-token global batch (arXiv:2407.21783, table 4)
MAX_LAYER_PARAMS = 10**13  # one generic layer: 10 trillion parameters
MAX_PER_SAMPLE = 1e18  # a generic layer's FLOPs or bytes per sample (1 exa)
MAX_USD = 1e6
MAX_CORES = 4096  # CPU cores of one socket: 20x the largest (EPYC 9965: 192)
MAX_HOST_GIB = 2**20  # host memory of one socket, GiB: 1 PiB, 170x a 6 TB server socket
MAX_BOXES = 1024  # boxes of a cluster (nnodes); the GPUs of all of them stay within MAX_GPUS
MAX_NIC_GBPS = 3200.0  # one NIC port: 4x today's fastest (ConnectX-8, 800 Gb/s)
MAX_PORTS = 16  # ports of one NIC


class Bounds:
    """Limits of a value, in pydantic's own terms (``gt``, ``le``, ``min_length`` ...).

    Kept as data here and handed to pydantic as ``Field(**bounds)`` when it checks, so the
    errors and the JSON Schema are pydantic's own for those bounds.
    """

    def __init__(self, **bounds: float | str) -> None:
        self.bounds = bounds

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic import Field

        bounded = Field(**self.bounds)  # type: ignore[call-overload]
        return handler.generate_schema(Annotated[source, bounded])


class _Number:
    """Marks a field that takes a number: a boolean is refused there (`lanes: true` is an
    error, not an x1 link), where pydantic would read it as 1."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(_refuse_bool, handler(source))


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


NUMBER = _Number()  # the outermost marker of every int or float field (tests/test_schema.py)


class _Versions:
    """Marks ``training.software``: a mapping's versions must be text (YAML reads an unquoted
    2.10 as the number 2.1, another release), and anything but a year or a mapping is refused
    in one message rather than one per branch of the union."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(_check_versions, handler(source))


def _check_versions(value: Any) -> Any:
    if isinstance(value, dict):
        for key in ("torch", "cuda"):
            if key in value and not isinstance(value[key], str):
                raise ValueError(f"quote the version: {key}: \"{value[key]}\" (a number "
                                 "reads 2.10 as 2.1)")
    elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"expected a year (2023) or {{torch: \"2.1\", cuda: \"12.1\"}}, "
                         f"got {value!r}")
    return value


VERSIONS = _Versions()
PositiveInt = Annotated[int, Bounds(gt=0)]
PositiveFloat = Annotated[float, Bounds(gt=0)]
Bandwidth = Annotated[float, Bounds(ge=MIN_GB_PER_S, le=MAX_GB_PER_S)]


# The parameters a calibration block may fit (nccl/wire.py's WireParams, each default with its
# source there): (what it is, unit) for calibrate's reports. Efficiencies are fractions.
CALIBRATION_PARAMETERS = {
    "call_latency_us": ("per-call start-up (launch, prologue, final sync)", "us"),
    "p2p_ll_sync_us": ("LL/LL128 per-step sync over P2P, beyond the route's link latencies",
                       "us"),
    "p2p_simple_sync_us": ("Simple per-step fence + flag over P2P, beyond the route", "us"),
    "shm_ll_sync_us": ("LL per-step host-memory poll over SHM, beyond the route", "us"),
    "shm_simple_sync_us": ("Simple per-step fence + host-memory poll over SHM", "us"),
    "net_sync_us": ("per-step cost of NET over loopback sockets (NCCL_SHM_DISABLE)", "us"),
    "p2p_pcie_simple_efficiency": ("share of a PCIe link's payload rate Simple P2P uses "
                                   "(default: by PCIe generation)", ""),
    "nvlink_simple_efficiency": ("share of NVLink's payload rate Simple uses", ""),
    "shm_pcie_efficiency": ("share of a PCIe link's payload rate SHM kernels use", ""),
    "simple_channel_cap_gbps": ("Simple throughput of one 512-thread channel over PCIe",
                                "GB/s"),
    "ll_channel_cap_gbps": ("LL throughput of one channel over PCIe", "GB/s"),
    "host_memory_gb_per_s": ("host-memory bandwidth of every socket (SHM staging)", "GB/s"),
    "socket_link_gb_per_s": ("socket-link bandwidth, each way", "GB/s"),
    # the network between boxes (nccl/wire.py; stepsim calibrate --nnodes N)
    "net_efficiency": ("share of the network's payload rate NCCL's IB transport moves", ""),
    "net_ib_sync_us": ("per-step cost of NET/IB between boxes (proxy, flag, flush)", "us"),
    "socket_stream_gbps": ("one TCP stream of NCCL's socket transport (proxy thread)", "GB/s"),
}


@dataclass(frozen=True, kw_only=True)
class Frozen:
    """What every model shares: unknown keys and non-finite numbers are errors, and a copy
    with some keys changed. allow_inf_nan=False: `.inf` FLOPs or a `.nan` bandwidth would
    stall the simulated clock."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "allow_inf_nan": False}

    @classmethod
    def from_data(cls, data: Any) -> Self:
        """``data`` (what a YAML file holds) checked and made this model; raises pydantic's
        ValidationError (config.py turns it into one line naming file, line and key)."""
        return _adapter(cls).validate_python(data)  # type: ignore[no-any-return]

    def copy(self, **changes: Any) -> Self:
        """The same model with some keys changed (not checked again)."""
        return dataclasses.replace(self, **changes)


def _around(source: Any, handler: Any, kind: Any, check: Any) -> Any:
    """A model's own ``check`` around pydantic's schema of its fields, as a validator of
    ``kind`` (a pydantic_core.core_schema maker). The check takes over the model's reference,
    so every place the model appears is checked alike."""
    inner = handler(source)
    ref = inner.pop("ref", None)
    outer = kind(check, inner)
    if ref is not None:
        outer["ref"] = ref
    return outer


def _adapter(model: type[Frozen]) -> TypeAdapter[Any]:
    """pydantic's checker of ``model``, built once per process."""
    adapter = _ADAPTERS.get(model)
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = _ADAPTERS[model] = TypeAdapter(model)
    return adapter


_ADAPTERS: dict[type[Frozen], TypeAdapter[Any]] = {}


def json_schema(model: type[Frozen]) -> dict[str, Any]:
    """The JSON Schema pydantic checks ``model`` with."""
    return _adapter(model).json_schema()  # type: ignore[no-any-return]


def dump(value: Any, *, exclude_none: bool = False, exclude_defaults: bool = False) -> Any:
    """A model as plain data (mappings, lists, scalars), field by field in order."""
    if isinstance(value, Frozen):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if exclude_none and item is None:
                continue
            if exclude_defaults and item == (f.default if f.default_factory is dataclasses.MISSING
                                              else f.default_factory()):
                continue
            out[f.name] = dump(item, exclude_none=exclude_none, exclude_defaults=exclude_defaults)
        return out
    if isinstance(value, list):
        return [dump(v, exclude_none=exclude_none, exclude_defaults=exclude_defaults)
                for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class GpuSpec(Frozen):
    """A GPU: a catalog name, or a catalog entry (``base``) with some numbers overridden.

    ``gpu: h100-sxm`` and ``gpu: {base: h100-sxm}`` are the same card; simulator/machine/
    machine/cards.py ``resolve_gpu`` turns either into the GPU the simulator times.
    """

    base: Annotated[str, Bounds(min_length=1)]  # catalog name (simulator/catalog/)
    memory_gib: Annotated[PositiveFloat | None, NUMBER] = None
    memory_bandwidth_gb_per_s: Annotated[Bandwidth | None, NUMBER] = None
    # enforced board power limit (nvidia-smi -pl)
    power_limit_w: Annotated[PositiveFloat | None, NUMBER] = None
    # spec dense 16-bit peak (FP32 accumulate)
    bf16_tflops: Annotated[PositiveFloat | None, NUMBER] = None
    # achieved rate of one large plain GEMM
    matmul_tflops: Annotated[PositiveFloat | None, NUMBER] = None
    sms: Annotated[PositiveInt | None, NUMBER] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """A name is the catalog entry of that name: ``h100-sxm`` reads as ``{base: h100-sxm}``."""
        from pydantic_core import core_schema

        return _around(source, handler, core_schema.no_info_before_validator_function,
                       lambda data: {"base": data} if isinstance(data, str) else data)

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: Any) -> dict[str, Any]:
        """In `stepsim schema`: a name or a mapping, as the check above reads it."""
        return {"anyOf": [{"type": "string", "description": "a catalog name"}, handler(core)]}

    def overrides(self) -> dict[str, float]:
        """The numbers this spec changes, by key."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "base"}
        return {k: v for k, v in values.items() if v is not None}

    def __str__(self) -> str:
        changed = self.overrides()
        if not changed:
            return self.base
        return f"{self.base} ({', '.join(f'{k} {v:g}' for k, v in changed.items())})"


@dataclass(frozen=True, kw_only=True)
class NodeConfig(Frozen):
    """A node: a GPU, a CPU socket (its root complex), a PCIe switch, an NVSwitch or a NIC."""

    id: Annotated[str, Bounds(min_length=1)]
    kind: NodeKind
    # cpu only: achievable host-memory bandwidth of this socket (GB/s), shared by SHM traffic
    memory_bandwidth_gb_per_s: Annotated[Bandwidth | None, NUMBER] = None
    # cpu: CPU family (catalog/cpus.py) or socket link (catalog/links.py SOCKET_LINKS);
    # sets the socket link between CPUs and the vendor NCCL's rules depend on; nic: the NIC
    # catalog's name (catalog/nics.py), its line rate, ports and RDMA
    model: str | None = None
    # cpu only: cores of this socket (the CPU optimizer of offloaded training runs on them)
    cores: Annotated[Annotated[int, Bounds(gt=0, le=MAX_CORES)] | None, NUMBER] = None
    # cpu only: host memory of this socket (offloaded optimizer states and parameters), GiB
    memory_gib: Annotated[Annotated[float, Bounds(gt=0, le=MAX_HOST_GIB)] | None, NUMBER] = None
    # gpu only: this GPU when it differs from the machine's default `gpu` (name or mapping)
    gpu: GpuSpec | None = None
    # nic only (catalog/nics.py gives the defaults of a `model`): line rate per port (Gb/s),
    # ports joined to the network, verbs (RoCE or InfiniBand) or not
    gbps: Annotated[Annotated[float, Bounds(gt=0, le=MAX_NIC_GBPS)] | None, NUMBER] = None
    ports: Annotated[Annotated[int, Bounds(gt=0, le=MAX_PORTS)] | None, NUMBER] = None
    rdma: bool | None = None


@dataclass(frozen=True, kw_only=True)
class LinkConfig(Frozen):
    """A link between two nodes: PCIe, NVLink, a socket link (UPI, xGMI) or a network."""

    a: str
    b: str
    kind: LinkKind
    # pcie (3, 4, 5, 6) or nvlink generation
    gen: Annotated[Annotated[int, Bounds(gt=0, le=16)] | None, NUMBER] = None
    # pcie lanes (x8, x16)
    lanes: Annotated[Annotated[int, Bounds(gt=0, le=MAX_LANES)] | None, NUMBER] = None
    # nvlinks bundled
    count: Annotated[Annotated[int, Bounds(gt=0, le=MAX_NVLINKS)] | None, NUMBER] = None
    model: str | None = None  # upi / xgmi generation name from the catalog
    # per direction; default from the kind
    bandwidth_gb_per_s: Annotated[Bandwidth | None, NUMBER] = None
    latency_us: Annotated[Annotated[float, Bounds(ge=0, le=MAX_LATENCY_US)] | None, NUMBER] = None


@dataclass(frozen=True, kw_only=True)
class FittedValue(Frozen):
    """One physical parameter `stepsim calibrate` fitted (simulator/nccl/wire.py names)."""

    parameter: str
    value: Annotated[float, NUMBER]
    # stepsim's value before the fit (None: none, e.g. no cap)
    default: Annotated[float | None, NUMBER] = None
    source: str  # the logs and sizes it was fitted on
    # fit residual over those rows, fraction
    rms_error: Annotated[Annotated[float, Bounds(ge=0)] | None, NUMBER] = None
    # the physical bounds it was fitted within, and the one it ended on (floor | ceiling):
    # a value on a bound is what the model could not explain, and narrows no range
    low: Annotated[float | None, NUMBER] = None
    high: Annotated[float | None, NUMBER] = None
    at_bound: Literal["floor", "ceiling"] | None = None


@dataclass(frozen=True, kw_only=True)
class UnfittedValue(Frozen):
    """A parameter the logs could not determine, left at stepsim's default."""

    parameter: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ComputeCalibration(Frozen):
    """A measured single-GPU step of one job: its achieved share of stepsim's compute speed."""

    workload: str  # the workload name it holds for
    gpu: str
    # modelled / measured compute time (< 1: slower)
    achieved_fraction: Annotated[PositiveFloat, NUMBER]
    measured_step_s: Annotated[PositiveFloat, NUMBER]
    modelled_step_s: Annotated[PositiveFloat, NUMBER]
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig(Frozen):
    """What `stepsim calibrate` fitted to the user's own measurements, with its provenance."""

    source: str = ""
    # why the logs contradicted this machine when `stepsim calibrate --force` fitted them
    # anyway ("" : they did not); a forced fit narrows no range, and every answer says so
    forced: str = ""
    fitted: list[FittedValue] = field(default_factory=list)
    left_at_default: list[UnfittedValue] = field(default_factory=list)
    compute: list[ComputeCalibration] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class NetworkConfig(Frozen):
    """The network that joins the boxes of a cluster: one non-blocking switch."""

    kind: NetworkKind
    gbps: Annotated[float, Bounds(gt=0, le=MAX_NIC_GBPS), NUMBER]  # a switch port's rate
    # one way, NIC to NIC through the switch; default by kind (catalog/nics.py)
    latency_us: Annotated[Annotated[float, Bounds(ge=0, le=MAX_LATENCY_US)] | None,
                          NUMBER] = None
    # Ethernet MTU, bytes (ethernet, roce); default Linux's 1500
    mtu: Annotated[Annotated[int, Bounds(ge=576, le=9216)] | None, NUMBER] = None
    # what the network costs: to buy (switch, NICs, cables) or per hour when rented
    price_usd: Annotated[Annotated[float, Bounds(ge=0, le=MAX_USD)] | None, NUMBER] = None
    price_usd_per_hour: Annotated[Annotated[float, Bounds(ge=0, le=MAX_USD)] | None,
                                  NUMBER] = None


@dataclass(frozen=True, kw_only=True)
class TopologyConfig(Frozen):
    """A machine: its GPU, its nodes and the links between them."""

    name: str
    description: str = ""
    source: str = ""
    gpu: GpuSpec  # a catalog name, or {base: NAME, ...overrides}
    p2p: bool = False
    # NCCL_P2P_LEVEL: P2P only where the path type is at most this (NCCL default PXB)
    p2p_level: PathLevel = "PXB"
    price_usd_per_hour: Annotated[Annotated[float, Bounds(gt=0, le=MAX_USD)] | None,
                                  NUMBER] = None
    nodes: Annotated[list[NodeConfig], Bounds(min_length=1, max_length=MAX_NODES)]
    links: Annotated[list[LinkConfig], Bounds(max_length=MAX_LINKS)] = field(
        default_factory=list)
    # boxes like this one joined through their NICs by `network` (torchrun's --nnodes)
    nnodes: Annotated[int, Bounds(ge=1, le=MAX_BOXES), NUMBER] = 1
    network: NetworkConfig | None = None
    calibration: CalibrationConfig | None = None  # written by `stepsim calibrate`

    def reference_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-references a field type cannot check, as (key path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        ids: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.id in ids:
                errors.append((("nodes", i, "id"), f"node id {quoted(node.id)} is defined twice"))
            ids.add(node.id)
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                ref = getattr(link, end)
                if ref not in ids:
                    errors.append((("links", i, end), f"link to undefined node {quoted(ref)}"))
        gpus = sum(n.kind == "gpu" for n in self.nodes)
        if not gpus:
            errors.append((("nodes",), "the machine has no GPU node"))
        if gpus > MAX_GPUS:
            errors.append((("nodes",), f"{gpus:,} GPUs; at most {MAX_GPUS:,} are simulated"))
        elif gpus * self.nnodes > MAX_GPUS:
            errors.append((("nnodes",), f"{self.nnodes} boxes of {gpus} GPUs; at most "
                           f"{MAX_GPUS:,} GPUs are simulated"))
        errors += self.network_errors()
        if self.calibration is not None:
            for i, fit in enumerate(self.calibration.fitted):
                if fit.parameter not in CALIBRATION_PARAMETERS:
                    errors.append((("calibration", "fitted", i, "parameter"),
                                   f"unknown parameter {quoted(fit.parameter)}; known: "
                                   f"{', '.join(CALIBRATION_PARAMETERS)}"))
        return errors + self._catalog_errors()

    def network_errors(self, nnodes: int | None = None) -> list[tuple[tuple[str | int, ...], str]]:
        """NIC keys on NIC nodes only; several boxes need a NIC and a network to join them."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        for i, node in enumerate(self.nodes):
            for key in ("gbps", "ports", "rdma"):
                if getattr(node, key) is not None and node.kind != "nic":
                    errors.append((("nodes", i, key), f"{key} is a key of nic nodes, not of a "
                                   f"{node.kind}"))
        boxes = self.nnodes if nnodes is None else nnodes
        for i, node in enumerate(self.nodes):  # a NIC on the network needs its speed
            if boxes > 1 and node.kind == "nic" and node.model is None and node.gbps is None:
                errors.append((("nodes", i), f"{boxes} boxes: nic {quoted(node.id)} needs "
                               "its `model` (simulator/catalog/nics.py) or its `gbps`"))
        if boxes > 1 and not any(n.kind == "nic" for n in self.nodes):
            errors.append((("nodes",), f"{boxes} boxes need a NIC in each: add a node `{{id: "
                           "nic0, kind: nic, model: connectx-6-dx}` and a link `{a: cpu0, b: "
                           "nic0, kind: pcie}` to a switch or root port"))
        if boxes > 1 and self.network is None:
            errors.append((("network",), f"{boxes} boxes need the network that joins them: "
                           "add `network: {kind: ethernet | roce | infiniband, gbps: 100}`"))
        return errors

    def _catalog_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Names that must exist in the catalog (catalog/), and link shapes the model needs."""
        from simulator.catalog import gpus as gpu_catalog
        from simulator.catalog import links as link_catalog
        from simulator.catalog import nics as nic_catalog

        def known(name: str, catalog: dict[str, object]) -> str:
            return f"unknown {quoted(name)}; known: {', '.join(sorted(catalog))}"

        errors: list[tuple[tuple[str | int, ...], str]] = []
        if self.gpu.base not in gpu_catalog.GPUS:
            key: tuple[str, ...] = ("gpu", "base") if self.gpu.overrides() else ("gpu",)
            errors.append((key, known(self.gpu.base, dict(gpu_catalog.GPUS))))
        kinds = {n.id: n.kind for n in self.nodes}
        for i, node in enumerate(self.nodes):
            if node.gpu is not None and node.gpu.base not in gpu_catalog.GPUS:
                errors.append((("nodes", i, "gpu"), known(node.gpu.base, dict(gpu_catalog.GPUS))))
            if node.kind == "nic":
                card = nic_catalog.NICS.get(node.model or "")
                if node.model is not None and card is None:
                    errors.append((("nodes", i, "model"), known(node.model,
                                                                dict(nic_catalog.NICS))))
                if card is not None and (node.ports or 1) > card.ports:
                    errors.append((("nodes", i, "ports"), f"ports {node.ports}: a {card.name} "
                                   f"has {card.ports}"))
            elif node.model is not None and link_catalog.socket_link(node.model) is None:
                from simulator.catalog.cpus import CPUS

                errors.append((("nodes", i, "model"),
                               known(node.model, {**link_catalog.SOCKET_LINKS, **CPUS})))
        pairs: set[frozenset[str]] = set()
        for i, link in enumerate(self.links):
            pair = frozenset((link.a, link.b))
            if link.a == link.b:
                errors.append((("links", i, "b"), f"link from {quoted(link.a)} to itself"))
            elif pair in pairs:
                errors.append((("links", i), f"a second link between {quoted(link.a)} and "
                               f"{quoted(link.b)}; give one link with the total count or "
                               "bandwidth"))
            pairs.add(pair)
            if link.gen is not None and link.kind == "pcie" and \
                    link.gen not in link_catalog.PCIE_RAW_PER_LANE:
                errors.append((("links", i, "gen"), f"unknown PCIe generation {link.gen}; "
                               f"known: {', '.join(map(str, link_catalog.PCIE_RAW_PER_LANE))}"))
            catalog: dict[str, object] = {}
            if link.kind == "nvlink":
                catalog = dict(link_catalog.NVLINK_PER_LINK)
            elif link.kind in ("upi", "xgmi"):
                catalog = dict(link_catalog.SOCKET_LINKS)
                if kinds.get(link.a, "cpu") != "cpu" or kinds.get(link.b, "cpu") != "cpu":
                    errors.append((("links", i, "kind"), f"{link.kind} joins two cpu nodes"))
            if link.model is not None and catalog and link.model not in catalog:
                errors.append((("links", i, "model"), known(link.model, catalog)))
        return errors


Family = Literal["llama", "gpt2", "mpt", "bert", "generic"]


@dataclass(frozen=True, kw_only=True)
class MoeConfig(Frozen):
    """A mixture of experts in place of the MLP (simulator/job/moe.py)."""

    experts: Annotated[int, Bounds(gt=1, le=MAX_EXPERTS), NUMBER]  # routed experts
    experts_per_token: Annotated[int, Bounds(gt=0, le=MAX_EXPERTS), NUMBER]  # top-k
    ffn_hidden: Annotated[int, Bounds(gt=0, le=MAX_FFN), NUMBER]  # each expert's MLP width
    # the shared experts' MLP width (DeepSeek: n_shared_experts x ffn_hidden; Qwen2-MoE:
    # shared_expert_intermediate_size); 0: none
    shared_ffn_hidden: Annotated[int, Bounds(ge=0, le=MAX_FFN), NUMBER] = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate (Linear(hidden, 1)) on it
    # blocks whose MLP stays dense, of ffn_hidden width (DeepSeek first_k_dense_replace,
    # Qwen2-MoE mlp_only_layers)
    dense_layers: Annotated[list[Annotated[int, Bounds(ge=0), NUMBER]],
                            Bounds(max_length=MAX_LAYERS), NUMBER] = field(default_factory=list)
    # module names as transformers 4.x registers them: mixtral (block_sparse_moe, w1/w3/w2),
    # qwen (mlp.gate, mlp.experts.N.gate_proj/up_proj/down_proj, shared_expert), deepseek
    # (mlp.experts, mlp.gate, shared_experts), gpt_oss (GptOssMLP: mlp.router with a bias,
    # mlp.experts' fused gate_up_proj and down_proj with biases, the clamped SwiGLU)
    names: Literal["mixtral", "qwen", "deepseek", "gpt_oss"] = "qwen"


@dataclass(frozen=True, kw_only=True)
class MlaConfig(Frozen):
    """DeepSeek's multi-head latent attention (DeepseekV2Attention): low-rank q and kv."""

    kv_lora_rank: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    qk_nope_head_dim: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    qk_rope_head_dim: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    v_head_dim: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    # None: q_proj straight from the hidden state (DeepSeek-V2-Lite)
    q_lora_rank: Annotated[Annotated[int, Bounds(gt=0, le=MAX_WIDTH)] | None, NUMBER] = None


@dataclass(frozen=True, kw_only=True)
class VisionConfig(Frozen):
    """A vision-language model's ViT image encoder and its projector (simulator/job/vision.py),
    frozen, as LLaVA-style fine-tunes train the projector and the language model."""

    layers: Annotated[int, Bounds(gt=0, le=MAX_LAYERS), NUMBER]
    hidden: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    heads: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    ffn_hidden: Annotated[int, Bounds(gt=0, le=MAX_FFN), NUMBER]
    patch: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]  # patch side, pixels
    image_size: Annotated[int, Bounds(gt=0, le=MAX_TOKENS), NUMBER]  # side, pixels
    channels: Annotated[int, Bounds(gt=0, le=64), NUMBER] = 3
    # clip (LLaVA: class token, pre-LayerNorm, the second-last layer's features, a two-layer
    # projector) or qwen2_vl (3-D patches over 2 frames, 2x2 patch merger)
    layout: Literal["clip", "qwen2_vl"] = "clip"
    projector_hidden: Annotated[int, Bounds(ge=0, le=MAX_FFN), NUMBER] = 0  # 0: the LM's
    images_per_sample: Annotated[int, Bounds(gt=0, le=MAX_BATCH), NUMBER] = 1


@dataclass(frozen=True, kw_only=True)
class ModelConfig(Frozen):
    """A transformer's shape; the keys left out take the family's defaults."""

    family: Family
    layers: Annotated[int, Bounds(gt=0, le=MAX_LAYERS), NUMBER]
    hidden: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    heads: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]
    # grouped-query attention; default = heads
    kv_heads: Annotated[Annotated[int, Bounds(gt=0, le=MAX_WIDTH)] | None, NUMBER] = None
    # default 4 * hidden
    ffn_hidden: Annotated[Annotated[int, Bounds(gt=0, le=MAX_FFN)] | None, NUMBER] = None
    vocab: Annotated[int, Bounds(gt=0, le=MAX_VOCAB), NUMBER]
    tie_embeddings: bool | None = None  # lm_head shares the token embedding; default by family
    norm: Literal["layernorm", "rmsnorm"] | None = None  # default by family
    mlp: Literal["swiglu", "gelu"] | None = None  # default by family
    bias: bool | None = None  # linear-layer biases; default by family
    qkv_bias: bool | None = None  # biases on q/k/v only (Qwen2); default = bias
    positions: Literal["learned", "rotary", "alibi"] | None = None  # default by family
    # learned position table size
    max_positions: Annotated[Annotated[int, Bounds(gt=0, le=MAX_TOKENS)] | None, NUMBER] = None
    # each head's width when it is not hidden / heads (Gemma, Qwen3: q_proj heads x head_dim)
    head_dim: Annotated[Annotated[int, Bounds(gt=0, le=MAX_WIDTH)] | None, NUMBER] = None
    qk_norm: bool = False  # an RMSNorm of head_dim on q and k (Qwen3's q_norm, k_norm)
    moe: MoeConfig | None = None  # a mixture of experts in place of the MLP
    mla: MlaConfig | None = None  # multi-head latent attention in place of q/k/v
    # Phi-3: one qkv_proj and one gate_up_proj (each a single wide linear) for q/k/v and the
    # MLP's two input projections
    fused_projections: bool = False
    # Gemma 2 and 3: a norm after attention and one before and after the MLP as well
    sandwich_norm: bool = False
    # Gemma 2: cap * tanh(x / cap) on the attention scores and on the final logits
    attention_softcap: Annotated[Annotated[float, Bounds(gt=0, le=1e6)] | None, NUMBER] = None
    logit_softcap: Annotated[Annotated[float, Bounds(gt=0, le=1e6)] | None, NUMBER] = None
    # gpt-oss: a learned logit per head (GptOssAttention.sinks) joins each row of scores in
    # the softmax and is dropped after it
    attention_sinks: bool = False
    # local attention: blocks in local_layers attend to the last sliding_window tokens only
    sliding_window: Annotated[Annotated[int, Bounds(gt=0, le=MAX_TOKENS)] | None, NUMBER] = None
    local_layers: Annotated[list[Annotated[int, Bounds(ge=0), NUMBER]],
                            Bounds(max_length=MAX_LAYERS), NUMBER] = field(default_factory=list)
    # a vision-language model's image encoder, before the language model
    vision: VisionConfig | None = None


@dataclass(frozen=True, kw_only=True)
class GenericLayer(Frozen):
    """One layer of a model that is not a transformer (a UNet block, a conv stage)."""

    name: Annotated[str, Bounds(min_length=1)]
    params: Annotated[int, Bounds(ge=0, le=MAX_LAYER_PARAMS), NUMBER]
    forward_flops_per_sample: Annotated[float, Bounds(ge=0, le=MAX_PER_SAMPLE), NUMBER]
    activation_bytes_per_sample: Annotated[float, Bounds(ge=0, le=MAX_PER_SAMPLE), NUMBER]
    # parameter tensors the layer registers (for DDP buckets)
    tensors: Annotated[int, Bounds(gt=0, le=1_000_000), NUMBER] = 1
    # elements of each of those tensors in registration order (DDP closes a bucket at the
    # tensor that fills it); None: the layer's parameters split evenly over them
    tensor_numels: Annotated[Annotated[list[PositiveInt], Bounds(max_length=1_000_000)] | None,
                             NUMBER] = None
    # forward HBM traffic of the layer's memory-bound work (normalisation, activation, residual
    # adds), one sample; timed as a bandwidth-bound kernel next to the layer's compute
    memory_bytes_per_sample: Annotated[float, Bounds(ge=0, le=MAX_PER_SAMPLE), NUMBER] = 0.0
    # the dense work is convolutions: cuDNN runs them in TF32 under fp32 on Ampere and later
    # (torch.backends.cudnn.allow_tf32 defaults True), where a Linear stays on CUDA cores
    convolution: bool = False


MAX_LORA_ALPHA = 1e6  # LoRA's alpha (scale alpha / rank): common values are 8-128
MAX_LORA_TARGETS = 64  # target modules: a transformer block has at most about ten linears
# Linear layers LoRA can target, per family (names as transformers' modules have them, the
# names job/parameters.py gives the parameters).
LORA_TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
              "qkv_proj", "gate_up_proj",  # Phi-3
              # MLA (DeepSeek), a mixture of experts' routers, Mixtral's experts, Qwen2-MoE's
              # shared-expert gate: nn.Linear modules PEFT's all-linear wraps too
              "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "gate", "w1", "w2",
              "w3", "shared_expert_gate"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "mpt": ("Wqkv", "out_proj", "up_proj", "down_proj"),
    "bert": ("query", "key", "value", "dense"),  # PEFT suffix match: "dense" is all three
    # diffusers' LoRA training scripts target to_k, to_q, to_v, to_out.0 (matched as suffixes)
    "unet": ("to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
             "ff.net.2", "conv1", "conv2", "conv_shortcut", "time_emb_proj"),
}


@dataclass(frozen=True, kw_only=True)
class LoraConfig(Frozen):
    """LoRA adapters: their rank, scale (alpha / rank) and the linear layers they wrap."""

    rank: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER] = 16
    alpha: Annotated[Annotated[float, Bounds(gt=0, le=MAX_LORA_ALPHA)] | None, NUMBER] = None
    # PEFT's lora_dropout (default 0.0, peft LoraConfig): above 0 each adapter drops its own
    # copy of the layer's input (nn.Dropout before lora_A), saved with its 1-byte mask
    dropout: Annotated[float, Bounds(ge=0, lt=1), NUMBER] = 0.0
    targets: Annotated[list[str], Bounds(max_length=MAX_LORA_TARGETS)] = field(
        default_factory=lambda: ["q_proj", "v_proj"])


Checkpointing = Literal["none", "selective", "op", "full"]
CHECKPOINTING_MODES: tuple[str, ...] = get_args(Checkpointing)
Kernels = Literal["eager", "compiled", "fused"]
CrossEntropy = Literal["fp32", "chunked", "fused", "fused-linear"]
Precision = Literal["bf16", "fp16", "fp32", "pure-bf16"]
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "sgd"]
Framework = Literal["hf", "torchtune", "torchtitan", "llm-foundry", "megatron"]
Attention = Literal["flash2", "flash", "flash1", "flash3", "sdpa", "triton", "eager"]
VERSION = r"^\d+\.\d+(\.\d+)?([+a-z].*)?$"


@dataclass(frozen=True, kw_only=True)
class SoftwareConfig(Frozen):
    """The software stack a run used (simulator/catalog/software.py reads it)."""

    torch: Annotated[str, Bounds(pattern=VERSION)]  # e.g. "2.1"
    # default: the CUDA of that PyTorch release's default wheel
    cuda: Annotated[str | None, Bounds(pattern=VERSION)] = None
    # default: a release of that PyTorch's time (catalog/software.py LOSS_FUNCTION)
    transformers: Annotated[str | None, Bounds(pattern=VERSION)] = None


# torchtune's recipes raise on this pair (recipes/full_finetune_single_device.py __init__:
# "Gradient accumulation is not supported with optimizer in bwd")
OPTIMIZER_IN_BWD_ACCUM = ("optimizer_in_bwd with grad_accum > 1: torchtune refuses gradient "
                          "accumulation with the optimizer step in backward")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(Frozen):
    """How the job trains: sequence and batch, the recipe, fine-tuning, attention."""

    seq_len: Annotated[int, Bounds(gt=0, le=MAX_TOKENS), NUMBER]
    micro_batch: Annotated[int, Bounds(gt=0, le=MAX_BATCH), NUMBER] = 1
    grad_accum: Annotated[int, Bounds(gt=0, le=MAX_BATCH), NUMBER] = 1
    # the recipe (simulator/job/recipe.py): a framework bundle sets the defaults of the keys
    # below it that the workload leaves out
    framework: Framework = "hf"
    kernels: Kernels = "eager"
    cross_entropy: CrossEntropy = "fp32"
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    activation_checkpointing: Checkpointing = "none"
    # apex amp's opt_level under fp16/bf16 (NVIDIA DeepLearningExamples, Lambda's benchmarks):
    # o1 patches functions as torch.autocast does (fp32 weights and gradients); o2 casts the
    # model to 16 bit, keeps fp32 master weights in the optimizer and 16-bit gradients, and
    # runs no op in fp32 but what the modules ask. Default: torch.autocast (as o1)
    amp: Literal["o1", "o2"] | None = None
    # how the processes were started: torchrun (sets OMP_NUM_THREADS=1 per process when it
    # starts several, torch/distributed/run.py: a CPU optimizer or CPU op then runs on one
    # thread per rank), deepspeed (its launcher leaves it unset) or accelerate (cores /
    # processes threads); default: torchrun for torchtune and torchtitan, else the strategy's
    # own launcher
    launcher: Literal["torchrun", "deepspeed", "accelerate"] | None = None
    # the data-parallel wrapper under -s ddp: torch's DistributedDataParallel, or apex's
    # (apex.parallel.DistributedDataParallel: 1e7-element buckets in arrival order, flattened,
    # all-reduced and copied back on its own stream)
    ddp: Literal["torch", "apex"] = "torch"
    # the training loop holds the model's output (its logits) until after the optimizer step
    # (``output = model(...)``, ``output.loss.backward()``, ``output = None`` at the end, as
    # AnswerDotAI's fsdp_qlora train.py); HF's Trainer, torchtune and torchtitan drop it
    # before backward
    keeps_output: bool = False
    # FSDP (FSDP1) built from rank 0's host copy with sync_module_states=True (fsdp_qlora's
    # low_memory): the memory report replays the wrap through the caching allocator and gives
    # what it leaves reserved before the first step (memory/fsdp_wrap.py)
    sync_module_states: bool = False
    # torchtune's option of the same name: each parameter's optimizer step runs in its
    # post-accumulate-grad hook during backward and frees its gradient (one gradient alive)
    optimizer_in_bwd: bool = False
    finetune: Literal["full", "lora", "qlora"] = "full"
    lora: LoraConfig | None = None
    # the attention implementation (a framework bundle's unless given): flash2 (flash-attn 2;
    # "flash" is the same), flash1 (flash-attn 1.x), flash3 (FlashAttention-3, Hopper; other
    # GPUs run FA2), sdpa
    # (PyTorch's scaled_dot_product_attention: FA1 kernels before torch 2.2, FA2 after), triton
    # (flash-attn's Triton kernel, llm-foundry attn_impl: triton), eager (scores materialised
    # in HBM as the modules compute them, dropout on the probabilities if > 0)
    attention: Attention = "flash2"
    # the batches are padded and carry their attention mask (a tokenizer's padding="max_length",
    # DataCollatorWithPadding) rather than packed or of equal length: transformers then gives
    # scaled_dot_product_attention the mask as a tensor, and sdpa runs its memory-efficient
    # kernel over every query-key pair (flash attention takes no mask); flash-attn's path
    # unpads and is unchanged
    padded: bool = False
    # the software stack: a year (2023) or {torch: "2.1", cuda: "12.1"}; default today's
    # (simulator/catalog/software.py: GEMM and attention rates by library generation)
    software: Annotated[int | SoftwareConfig | None, VERSIONS, NUMBER] = None
    # attention-probability dropout; bert also drops the hidden states at this rate (its
    # BertConfig has hidden_dropout_prob = attention_probs_dropout_prob = 0.1)
    dropout: Annotated[float, Bounds(ge=0, lt=1), NUMBER] = 0.0
    # torchtune's option of the same name: FSDP units of their own for the embeddings and the
    # output projection instead of leaving them in the root (its Llama 3 distributed configs)
    custom_sharded_layers: Annotated[list[Literal["tok_embeddings", "output"]],
                                     Bounds(max_length=2)] = field(default_factory=list)
    # mixture of experts: the busiest expert's tokens over the mean (1: every expert gets
    # top-k x tokens / experts, balanced routing, the default); ranks holding experts wait
    # for the busiest (expert parallelism)
    expert_imbalance: Annotated[float, Bounds(ge=1, le=MAX_EXPERTS), NUMBER] = 1.0
    # how the experts' GEMMs run: loop (one GEMM per expert, as transformers' MoE blocks);
    # grouped (one grouped GEMM for all experts, Megatron's TEGroupedMLP, torchtitan); None:
    # the framework's
    expert_gemms: Literal["loop", "grouped"] | None = None
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the caching allocator grows segments in
    # place instead of caching blocks of fixed sizes: less reserved beyond the tensors); None:
    # the framework's (simulator/memory/allocator.py)
    expandable_segments: bool | None = None
    # the keys the file, a command-line flag or the constructor gave (a framework bundle sets
    # the others); not a key of the file, so not a field: each instance's own
    given: ClassVar[frozenset[str]] = frozenset()

    def __new__(cls, **keys: Any) -> Self:
        made = super().__new__(cls)
        object.__setattr__(made, "given", frozenset(keys))
        return made

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        def note_given(data: Any, check: Any) -> TrainingConfig:
            made: TrainingConfig = check(data)
            if isinstance(data, dict):
                object.__setattr__(made, "given", frozenset(data))
            return made

        return _around(source, handler, core_schema.no_info_wrap_validator_function, note_given)

    def copy(self, **changes: Any) -> Self:
        """The same keys with some changed; those count as given from now on."""
        made = dataclasses.replace(self, **changes)
        object.__setattr__(made, "given", self.given | changes.keys())
        return made


UNetBlock = Literal["DownBlock2D", "CrossAttnDownBlock2D", "UpBlock2D", "CrossAttnUpBlock2D"]


@dataclass(frozen=True, kw_only=True)
class UNetConfig(Frozen):
    """A diffusion UNet as diffusers' UNet2DConditionModel builds it (job/diffusion.py)."""

    block_out_channels: Annotated[list[Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]],
                                  Bounds(min_length=1, max_length=16), NUMBER]
    down_block_types: Annotated[list[UNetBlock], Bounds(min_length=1, max_length=16)]
    up_block_types: Annotated[list[UNetBlock], Bounds(min_length=1, max_length=16)]
    layers_per_block: Annotated[int, Bounds(gt=0, le=64), NUMBER] = 2
    # heads of each block's attention (diffusers' attention_head_dim); one value: every block
    heads: Annotated[list[Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER]],
                     Bounds(min_length=1, max_length=16), NUMBER] = field(
        default_factory=lambda: [8])
    transformer_layers: Annotated[list[Annotated[int, Bounds(gt=0, le=MAX_LAYERS), NUMBER]],
                                  Bounds(min_length=1, max_length=16), NUMBER] = field(
        default_factory=lambda: [1])
    cross_attention_dim: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER] = 768
    in_channels: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER] = 4
    out_channels: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER] = 4
    norm_groups: Annotated[int, Bounds(gt=0, le=MAX_WIDTH), NUMBER] = 32
    linear_projection: bool = False  # proj_in/proj_out as Linear (SDXL), else 1x1 convs
    addition_embed_dim: Annotated[int, Bounds(ge=0, le=MAX_WIDTH), NUMBER] = 0  # SDXL 2816
    image_size: Annotated[int, Bounds(ge=8, le=MAX_TOKENS), NUMBER] = 512  # pixels
    text_tokens: Annotated[int, Bounds(gt=0, le=MAX_TOKENS), NUMBER] = 77


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig(Frozen):
    """A job: a transformer (`model`), generic layers (`layers`) or a diffusion UNet (`unet`),
    and its training."""

    name: str
    description: str = ""
    source: str = ""
    model: ModelConfig | None = None
    # the generic (non-transformer) form
    layers: Annotated[list[GenericLayer], Bounds(min_length=1, max_length=MAX_LAYERS)] | None = None
    unet: UNetConfig | None = None
    training: TrainingConfig

    def with_training(self, **changes: Any) -> WorkloadConfig:
        """The same workload with some training keys changed (command-line overrides)."""
        return self.copy(training=self.training.copy(**changes))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return _around(source, handler, core_schema.no_info_after_validator_function,
                       _one_model)

    def reference_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-field checks a field type cannot express, as (key path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        t = self.training
        if (tokens := t.micro_batch * t.grad_accum * t.seq_len) > MAX_STEP_TOKENS:
            errors.append((("training",), f"micro_batch x grad_accum x seq_len = {tokens:,} "
                           f"tokens per GPU per step; at most {MAX_STEP_TOKENS:,}"))
        if t.optimizer_in_bwd and t.grad_accum > 1:
            errors.append((("training", "optimizer_in_bwd"), OPTIMIZER_IN_BWD_ACCUM))
        errors += self._model_errors()
        if self.training.finetune != "full" and self.model is None and self.unet is None:
            errors.append((("training", "finetune"),
                           f"{self.training.finetune} needs a transformer `model` or a `unet`, "
                           "not `layers`"))
        if self.unet is not None and len(self.unet.down_block_types) != len(
                self.unet.block_out_channels):
            errors.append((("unet", "down_block_types"), "one block type per entry of "
                           "block_out_channels"))
        if self.unet is not None and len(self.unet.up_block_types) != len(
                self.unet.block_out_channels):
            errors.append((("unet", "up_block_types"), "one block type per entry of "
                           "block_out_channels"))
        for i, layer in enumerate(self.layers or []):
            numels = layer.tensor_numels
            if numels is not None and (len(numels) != layer.tensors or sum(numels) != layer.params):
                errors.append((("layers", i, "tensor_numels"),
                               f"{len(numels)} tensors of {sum(numels):,} elements; the layer "
                               f"has tensors {layer.tensors} and params {layer.params:,}"))
        if self.model is not None:
            m = self.model
            if m.family == "generic":
                errors.append((("model", "family"),
                               "family `generic` is the `layers:` form; "
                               "give llama, gpt2, mpt or bert"))
            if m.hidden % m.heads:
                errors.append((("model", "heads"),
                               f"hidden {m.hidden} is not divisible by heads {m.heads}"))
            if m.kv_heads is not None and (m.kv_heads > m.heads or m.heads % m.kv_heads):
                errors.append((("model", "kv_heads"),
                               f"kv_heads {m.kv_heads} must divide heads {m.heads}"))
        return errors

    def _model_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """A mixture of experts' and MLA's keys against the model's other keys."""
        m = self.model
        if m is None:
            return []
        errors: list[tuple[tuple[str | int, ...], str]] = []
        if m.moe is not None:
            if m.moe.experts_per_token > m.moe.experts:
                errors.append((("model", "moe", "experts_per_token"),
                               f"{m.moe.experts_per_token} experts per token of "
                               f"{m.moe.experts}"))
            for i, layer in enumerate(m.moe.dense_layers):
                if layer >= m.layers:
                    errors.append((("model", "moe", "dense_layers", i),
                                   f"block {layer} of a {m.layers}-layer model"))
            if m.family != "llama":
                errors.append((("model", "moe"), "experts are modelled in the llama layout"))
        if m.mla is not None and m.family != "llama":
            errors.append((("model", "mla"), "MLA is modelled in the llama layout"))
        for i, layer in enumerate(m.local_layers):
            if layer >= m.layers:
                errors.append((("model", "local_layers", i),
                               f"block {layer} of a {m.layers}-layer model"))
        if m.local_layers and m.sliding_window is None:
            errors.append((("model", "local_layers"), "local layers need a sliding_window"))
        return errors


def _one_model(workload: WorkloadConfig) -> WorkloadConfig:
    if sum(x is not None for x in (workload.model, workload.layers, workload.unet)) != 1:
        raise ValueError("give exactly one of `model` (a transformer), `layers` (generic) or "
                         "`unet` (a diffusion UNet)")
    return workload
