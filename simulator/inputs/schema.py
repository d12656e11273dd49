"""The typed, frozen models of the two input files (topology and workload YAML).

Units are in the key names (``bandwidth_gb_per_s``, ``latency_us``). Everything here is
checked at load; see simulator/inputs/config.py for how errors are reported (file:line:key).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

NodeKind = Literal["gpu", "cpu", "pcie_switch", "nvswitch", "nic"]
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

Bandwidth = Annotated[float, Field(ge=MIN_GB_PER_S, le=MAX_GB_PER_S)]


class Frozen(BaseModel):
    # allow_inf_nan=False: `.inf` FLOPs or a `.nan` bandwidth would stall the simulated clock
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean is not a number: `lanes: true` is refused, not read as an x1 link."""
        if isinstance(value, bool) and info.field_name in _numeric_fields(cls):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


def _numeric_fields(cls: type[BaseModel]) -> frozenset[str]:
    """Fields of ``cls`` that take an int or a float but never a bool (cached per class)."""
    cached = _NUMERIC.get(cls)
    if cached is None:
        leaves = {name: _leaves(f.annotation) for name, f in cls.model_fields.items()}
        cached = frozenset(name for name, types in leaves.items()
                           if types & {int, float} and bool not in types)
        _NUMERIC[cls] = cached
    return cached


def _leaves(tp: Any) -> set[Any]:
    """The plain types inside an annotation (``int | None`` -> {int, NoneType})."""
    args = get_args(tp)
    return set().union(*map(_leaves, args)) if args else {tp}


_NUMERIC: dict[type[BaseModel], frozenset[str]] = {}


class GpuSpec(Frozen):
    """A GPU: a catalog name, or a catalog entry (``base``) with some numbers overridden.

    ``gpu: h100-sxm`` and ``gpu: {base: h100-sxm}`` are the same card; simulator/machine/
    hardware.py ``resolve_gpu`` turns either into the GPU the simulator times.
    """

    base: str = Field(min_length=1)  # catalog name (simulator/machine/hardware.py)
    memory_gib: PositiveFloat | None = None
    memory_bandwidth_gb_per_s: Bandwidth | None = None
    power_limit_w: PositiveFloat | None = None  # enforced board power limit (nvidia-smi -pl)
    bf16_tflops: PositiveFloat | None = None  # spec dense 16-bit peak (FP32 accumulate)
    matmul_tflops: PositiveFloat | None = None  # achieved rate of one large plain GEMM
    sms: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"base": data} if isinstance(data, str) else data

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: Any) -> dict[str, Any]:
        """In `stepsim schema`: a name or a mapping, as ``_from_name`` reads it."""
        return {"anyOf": [{"type": "string", "description": "a catalog name"}, handler(core)]}

    def overrides(self) -> dict[str, float]:
        """The numbers this spec changes, by key."""
        # read field by field: model_dump would build the serializer a read-back preset lacks
        values = {k: getattr(self, k) for k in type(self).model_fields if k != "base"}
        return {k: v for k, v in values.items() if v is not None}

    def __str__(self) -> str:
        changed = self.overrides()
        if not changed:
            return self.base
        return f"{self.base} ({', '.join(f'{k} {v:g}' for k, v in changed.items())})"


class NodeConfig(Frozen):
    id: str = Field(min_length=1)
    kind: NodeKind
    # cpu only: achievable host-memory bandwidth of this socket (GB/s), shared by SHM traffic
    memory_bandwidth_gb_per_s: Bandwidth | None = None
    # cpu only: CPU generation, sets the socket-link default (see hardware.SOCKET_LINKS)
    model: str | None = None
    # cpu only: cores of this socket (the CPU optimizer of offloaded training runs on them)
    cores: PositiveInt | None = Field(default=None, le=MAX_CORES)
    # cpu only: host memory of this socket (offloaded optimizer states and parameters), GiB
    memory_gib: PositiveFloat | None = Field(default=None, le=MAX_HOST_GIB)
    # gpu only: this GPU when it differs from the machine's default `gpu` (name or mapping)
    gpu: GpuSpec | None = None


class LinkConfig(Frozen):
    a: str
    b: str
    kind: LinkKind
    gen: PositiveInt | None = Field(default=None, le=16)  # pcie (3, 4, 5, 6) or nvlink gen
    lanes: PositiveInt | None = Field(default=None, le=MAX_LANES)  # pcie lanes (x8, x16)
    count: PositiveInt | None = Field(default=None, le=MAX_NVLINKS)  # nvlinks bundled
    model: str | None = None  # upi / xgmi generation name from the catalog
    bandwidth_gb_per_s: Bandwidth | None = None  # per direction; default from the kind
    latency_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US)


class FittedValue(Frozen):
    """One physical parameter `stepsim calibrate` fitted (simulator/machine/wire.py names)."""

    parameter: str
    value: float
    default: float | None = None  # stepsim's value before the fit (None: none, e.g. no cap)
    source: str  # the logs and sizes it was fitted on
    rms_error: float | None = Field(default=None, ge=0)  # fit residual over those rows, fraction


class UnfittedValue(Frozen):
    """A parameter the logs could not determine, left at stepsim's default."""

    parameter: str
    reason: str


class ComputeCalibration(Frozen):
    """A measured single-GPU step of one job: its achieved share of stepsim's compute speed."""

    workload: str  # the workload name it holds for
    gpu: str
    achieved_fraction: PositiveFloat  # modelled / measured compute time (< 1: slower)
    measured_step_s: PositiveFloat
    modelled_step_s: PositiveFloat
    source: str = ""


class CalibrationConfig(Frozen):
    """What `stepsim calibrate` fitted to the user's own measurements, with its provenance."""

    source: str = ""
    fitted: list[FittedValue] = Field(default_factory=list)
    left_at_default: list[UnfittedValue] = Field(default_factory=list)
    compute: list[ComputeCalibration] = Field(default_factory=list)


class TopologyConfig(Frozen):
    name: str
    description: str = ""
    source: str = ""
    gpu: GpuSpec  # a catalog name, or {base: NAME, ...overrides}
    p2p: bool = False
    # NCCL_P2P_LEVEL: P2P only where the path type is at most this (NCCL default PXB)
    p2p_level: PathLevel = "PXB"
    price_usd_per_hour: PositiveFloat | None = Field(default=None, le=MAX_USD)
    nodes: list[NodeConfig] = Field(min_length=1, max_length=MAX_NODES)
    links: list[LinkConfig] = Field(default_factory=list, max_length=MAX_LINKS)
    calibration: CalibrationConfig | None = None  # written by `stepsim calibrate`

    def reference_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-references a field type cannot check, as (key path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        ids: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.id in ids:
                errors.append((("nodes", i, "id"), f"node id {node.id!r} is defined twice"))
            ids.add(node.id)
        for i, link in enumerate(self.links):
            for end in ("a", "b"):
                ref = getattr(link, end)
                if ref not in ids:
                    errors.append((("links", i, end), f"link to undefined node {ref!r}"))
        gpus = sum(n.kind == "gpu" for n in self.nodes)
        if not gpus:
            errors.append((("nodes",), "the machine has no GPU node"))
        if gpus > MAX_GPUS:
            errors.append((("nodes",), f"{gpus:,} GPUs; at most {MAX_GPUS:,} are simulated"))
        if self.calibration is not None:
            from simulator.machine.wire import PARAMETERS

            for i, fit in enumerate(self.calibration.fitted):
                if fit.parameter not in PARAMETERS:
                    errors.append((("calibration", "fitted", i, "parameter"),
                                   f"unknown parameter {fit.parameter!r}; known: "
                                   f"{', '.join(PARAMETERS)}"))
        return errors + self._catalog_errors()

    def _catalog_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Names that must exist in machine/hardware.py, and link shapes the model needs."""
        from simulator.machine import hardware

        def known(name: str, catalog: dict[str, object]) -> str:
            return f"unknown {name!r}; known: {', '.join(sorted(catalog))}"

        errors: list[tuple[tuple[str | int, ...], str]] = []
        if self.gpu.base not in hardware.GPUS:
            key: tuple[str, ...] = ("gpu", "base") if self.gpu.overrides() else ("gpu",)
            errors.append((key, known(self.gpu.base, dict(hardware.GPUS))))
        kinds = {n.id: n.kind for n in self.nodes}
        for i, node in enumerate(self.nodes):
            if node.gpu is not None and node.gpu.base not in hardware.GPUS:
                errors.append((("nodes", i, "gpu"), known(node.gpu.base, dict(hardware.GPUS))))
            if node.model is not None and node.model not in hardware.SOCKET_LINKS:
                errors.append((("nodes", i, "model"),
                               known(node.model, dict(hardware.SOCKET_LINKS))))
        pairs: set[frozenset[str]] = set()
        for i, link in enumerate(self.links):
            pair = frozenset((link.a, link.b))
            if link.a == link.b:
                errors.append((("links", i, "b"), f"link from {link.a!r} to itself"))
            elif pair in pairs:
                errors.append((("links", i), f"a second link between {link.a!r} and {link.b!r}; "
                               "give one link with the total count or bandwidth"))
            pairs.add(pair)
            if link.gen is not None and link.kind == "pcie" and \
                    link.gen not in hardware.PCIE_RAW_PER_LANE:
                errors.append((("links", i, "gen"), f"unknown PCIe generation {link.gen}; "
                               f"known: {', '.join(map(str, hardware.PCIE_RAW_PER_LANE))}"))
            catalog: dict[str, object] = {}
            if link.kind == "nvlink":
                catalog = dict(hardware.NVLINK_PER_LINK)
            elif link.kind in ("upi", "xgmi"):
                catalog = dict(hardware.SOCKET_LINKS)
                if kinds.get(link.a, "cpu") != "cpu" or kinds.get(link.b, "cpu") != "cpu":
                    errors.append((("links", i, "kind"), f"{link.kind} joins two cpu nodes"))
            if link.model is not None and catalog and link.model not in catalog:
                errors.append((("links", i, "model"), known(link.model, catalog)))
        return errors


Family = Literal["llama", "gpt2", "mpt", "bert", "generic"]


class ModelConfig(Frozen):
    family: Family
    layers: PositiveInt = Field(le=MAX_LAYERS)
    hidden: PositiveInt = Field(le=MAX_WIDTH)
    heads: PositiveInt = Field(le=MAX_WIDTH)
    # grouped-query attention; default = heads
    kv_heads: PositiveInt | None = Field(default=None, le=MAX_WIDTH)
    ffn_hidden: PositiveInt | None = Field(default=None, le=MAX_FFN)  # default 4 * hidden
    vocab: PositiveInt = Field(le=MAX_VOCAB)
    tie_embeddings: bool | None = None  # lm_head shares the token embedding; default by family
    norm: Literal["layernorm", "rmsnorm"] | None = None  # default by family
    mlp: Literal["swiglu", "gelu"] | None = None  # default by family
    bias: bool | None = None  # linear-layer biases; default by family
    qkv_bias: bool | None = None  # biases on q/k/v only (Qwen2); default = bias
    positions: Literal["learned", "rotary", "alibi"] | None = None  # default by family
    # learned position table size
    max_positions: PositiveInt | None = Field(default=None, le=MAX_TOKENS)


class GenericLayer(Frozen):
    """One layer of a model that is not a transformer (a UNet block, a conv stage)."""

    name: str = Field(min_length=1)
    params: int = Field(ge=0, le=MAX_LAYER_PARAMS)
    forward_flops_per_sample: float = Field(ge=0, le=MAX_PER_SAMPLE)
    activation_bytes_per_sample: float = Field(ge=0, le=MAX_PER_SAMPLE)
    # parameter tensors the layer registers (for DDP buckets)
    tensors: PositiveInt = Field(default=1, le=1_000_000)
    # elements of each of those tensors in registration order (DDP closes a bucket at the
    # tensor that fills it); None: the layer's parameters split evenly over them
    tensor_numels: list[PositiveInt] | None = Field(default=None, max_length=1_000_000)
    # forward HBM traffic of the layer's memory-bound work (normalisation, activation, residual
    # adds), one sample; timed as a bandwidth-bound kernel next to the layer's compute
    memory_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_PER_SAMPLE)


MAX_LORA_ALPHA = 1e6  # LoRA's alpha (scale alpha / rank): common values are 8-128
MAX_LORA_TARGETS = 64  # target modules: a transformer block has at most about ten linears


class LoraConfig(Frozen):
    rank: PositiveInt = Field(default=16, le=MAX_WIDTH)
    alpha: PositiveFloat | None = Field(default=None, le=MAX_LORA_ALPHA)
    targets: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"],
                               max_length=MAX_LORA_TARGETS)


Checkpointing = Literal["none", "selective", "op", "full"]
CHECKPOINTING_MODES: tuple[str, ...] = get_args(Checkpointing)
Kernels = Literal["eager", "compiled", "fused"]
CrossEntropy = Literal["fp32", "chunked", "fused", "fused-linear"]
Precision = Literal["bf16", "fp16", "fp32", "pure-bf16"]
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw", "sgd"]
Framework = Literal["hf", "torchtune", "torchtitan", "llm-foundry", "megatron"]


# torchtune's recipes raise on this pair (recipes/full_finetune_single_device.py __init__:
# "Gradient accumulation is not supported with optimizer in bwd")
OPTIMIZER_IN_BWD_ACCUM = ("optimizer_in_bwd with grad_accum > 1: torchtune refuses gradient "
                          "accumulation with the optimizer step in backward")


class TrainingConfig(Frozen):
    seq_len: PositiveInt = Field(le=MAX_TOKENS)
    micro_batch: PositiveInt = Field(default=1, le=MAX_BATCH)
    grad_accum: PositiveInt = Field(default=1, le=MAX_BATCH)
    # the recipe (simulator/job/recipe.py): a framework bundle sets the defaults of the keys
    # below it that the workload leaves out
    framework: Framework = "hf"
    kernels: Kernels = "eager"
    cross_entropy: CrossEntropy = "fp32"
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    activation_checkpointing: Checkpointing = "none"
    # torchtune's option of the same name: each parameter's optimizer step runs in its
    # post-accumulate-grad hook during backward and frees its gradient (one gradient alive)
    optimizer_in_bwd: bool = False
    finetune: Literal["full", "lora", "qlora"] = "full"
    lora: LoraConfig | None = None
    # flash: FlashAttention-2 kernels (default; SDPA's flash backend, flash-attn 2); flash3:
    # FlashAttention-3 (Hopper; other GPUs run FA2); eager: scores materialised in HBM
    # (Megatron-LM before flash-attn support, HF "eager"), dropout on the probabilities if > 0;
    # triton: flash-attn's Triton kernel (flash_attn_triton.py, llm-foundry attn_impl: triton)
    attention: Literal["flash", "flash3", "triton", "eager"] = "flash"
    # attention-probability dropout; bert also drops the hidden states at this rate (its
    # BertConfig has hidden_dropout_prob = attention_probs_dropout_prob = 0.1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    # torchtune's option of the same name: FSDP units of their own for the embeddings and the
    # output projection instead of leaving them in the root (its Llama 3 distributed configs)
    custom_sharded_layers: list[Literal["tok_embeddings", "output"]] = Field(
        default_factory=list, max_length=2)


class WorkloadConfig(Frozen):
    name: str
    description: str = ""
    source: str = ""
    model: ModelConfig | None = None
    # the generic (non-transformer) form
    layers: list[GenericLayer] | None = Field(default=None, min_length=1, max_length=MAX_LAYERS)
    training: TrainingConfig

    def with_training(self, **changes: Any) -> WorkloadConfig:
        """The same workload with some training keys changed (command-line overrides)."""
        training = self.training.model_copy(update=changes)
        return self.model_copy(update={"training": training})

    @model_validator(mode="after")
    def _one_model(self) -> WorkloadConfig:
        if (self.model is None) == (self.layers is None):
            raise ValueError("give exactly one of `model` (a transformer) or `layers` (generic)")
        return self

    def reference_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-field checks a field type cannot express, as (key path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        t = self.training
        if (tokens := t.micro_batch * t.grad_accum * t.seq_len) > MAX_STEP_TOKENS:
            errors.append((("training",), f"micro_batch x grad_accum x seq_len = {tokens:,} "
                           f"tokens per GPU per step; at most {MAX_STEP_TOKENS:,}"))
        if t.optimizer_in_bwd and t.grad_accum > 1:
            errors.append((("training", "optimizer_in_bwd"), OPTIMIZER_IN_BWD_ACCUM))
        if self.training.finetune != "full" and self.model is None:
            errors.append((("training", "finetune"),
                           f"{self.training.finetune} needs a transformer `model`, not `layers`"))
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
