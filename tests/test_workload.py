"""Job: Hugging Face parameter order, LoRA counts, ops, FLOPs against the closed form, bad input."""

from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.inputs.config import load_workload
from simulator.inputs.schema import LoraConfig, ModelConfig, TrainingConfig, WorkloadConfig
from simulator.job.modules import NF4_BITS_PER_PARAM
from simulator.job.ops import Phase
from simulator.job.workload import Job


def llama7b(**training: object) -> Job:
    """Llama 2 7B; without checkpointing unless asked (the preset checkpoints fully)."""
    training.setdefault("activation_checkpointing", "none")
    cfg = load_workload("llama2-7b")
    return Job.from_config(cfg.copy(training=cfg.training.copy(**training)))


def test_llama_registration_order() -> None:
    names = [p.name for p in Job.from_config(load_workload("llama2-7b")).params]
    assert names[0] == "model.embed_tokens.weight"
    assert names[1:10] == [f"model.layers.0.{x}.weight" for x in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")]
    assert names[-2:] == ["model.norm.weight", "lm_head.weight"]
    assert len(names) == 1 + 9 * 32 + 2


def test_tied_heads_are_not_registered_twice() -> None:
    for name, last in (("llama3.2-1b", "model.norm.weight"),
                       ("mpt-7b", "transformer.norm_f.weight"),
                       ("gpt2-medium", "transformer.ln_f.bias")):
        params = Job.from_config(load_workload(name)).params
        assert params[-1].name == last
        assert not any("lm_head" in p.name for p in params)


def test_gpt2_and_mpt_block_order() -> None:
    gpt2 = [p.name for p in Job.from_config(load_workload("gpt2-medium")).params]
    assert gpt2[:4] == ["transformer.wte.weight", "transformer.wpe.weight",
                        "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias"]
    assert gpt2[4:8] == ["transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                         "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias"]
    mpt = [p.name for p in Job.from_config(load_workload("mpt-7b")).params]
    assert mpt[1:7] == [f"transformer.blocks.0.{x}.weight" for x in (
        "norm_1", "attn.Wqkv", "attn.out_proj", "norm_2", "ffn.up_proj", "ffn.down_proj")]


def test_qwen2_has_qkv_biases_only() -> None:
    names = [p.name for p in Job.from_config(load_workload("qwen2.5-14b")).params]
    assert names[1:4] == ["model.layers.0.self_attn.q_proj.weight",
                          "model.layers.0.self_attn.q_proj.bias",
                          "model.layers.0.self_attn.k_proj.weight"]
    assert "model.layers.0.self_attn.o_proj.bias" not in names


@pytest.mark.parametrize(("rank", "targets", "trainable"), [
    (8, ["q_proj", "v_proj"], 4_194_304),  # PEFT print_trainable_parameters, Llama-2-7B
    (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
     39_976_960),
])
def test_lora_trainable_counts(rank: int, targets: list[str], trainable: int) -> None:
    job = llama7b(finetune="lora", lora=LoraConfig(rank=rank, targets=targets))
    assert job.n_trainable == trainable
    assert job.n_params == 6_738_415_616 + trainable


def test_peft_names_and_order() -> None:
    job = llama7b(finetune="qlora", lora=LoraConfig(rank=8, targets=["q_proj"]))
    p = job.params
    base = "base_model.model.model.layers.0.self_attn.q_proj"
    assert [x.name for x in p[1:4]] == [f"{base}.base_layer.weight",
                                        f"{base}.lora_A.default.weight",
                                        f"{base}.lora_B.default.weight"]
    assert p[1].quantized and not p[1].trainable
    assert p[2].shape == (8, 4096) and p[3].shape == (4096, 8)
    assert not p[-1].quantized  # lm_head stays 16 bit


@pytest.mark.parametrize("name", ["llama2-7b", "gpt2-medium", "llama2-7b-lora", "mpt-7b"])
def test_backward_completes_every_trainable_gradient_once(name: str) -> None:
    job = Job.from_config(load_workload(name))
    ready = [i for op in job.backward_ops() for i in op.grads]
    assert sorted(ready) == [i for i, p in enumerate(job.params) if p.trainable]


def test_gradients_arrive_block_by_block_in_reverse() -> None:
    job = Job.from_config(load_workload("llama2-7b"))
    ready = [job.params[i].name for op in job.backward_ops() for i in op.grads]
    assert ready[:2] == ["lm_head.weight", "model.norm.weight"]
    layer31 = [n.removeprefix("model.layers.31.") for n in ready[2:11]]
    assert layer31 == [f"{x}.weight" for x in (
        "mlp.down_proj", "mlp.up_proj", "mlp.gate_proj", "post_attention_layernorm",
        "self_attn.o_proj", "self_attn.v_proj", "self_attn.k_proj", "self_attn.q_proj",
        "input_layernorm")]
    assert ready[-1] == "model.embed_tokens.weight"
    blocks = [job.params[i].block for op in job.backward_ops() for i in op.grads]
    assert blocks == sorted(blocks, reverse=True)


def gpt_job(L: int, h: int, heads: int, V: int, s: int, b: int) -> Job:
    cfg = WorkloadConfig(name="gpt", model=ModelConfig(
        family="gpt2", layers=L, hidden=h, heads=heads, vocab=V, max_positions=s),
        training=TrainingConfig(seq_len=s, micro_batch=b))
    return Job.from_config(cfg)


@pytest.mark.parametrize(("L", "h", "heads", "V", "s", "b"), [
    (24, 1024, 16, 50257, 1024, 5), (32, 4096, 32, 50432, 2048, 1), (4, 512, 8, 1000, 4096, 2)])
def test_model_flops_match_the_closed_form(L: int, h: int, heads: int, V: int, s: int,
                                           b: int) -> None:
    job = gpt_job(L, h, heads, V, s, b)
    closed = 72 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert job.model_flops_per_step() == pytest.approx(closed, rel=1e-12)
    # The ops' own FLOPs (forward + backward) against the same form: the flash-attention kernels
    # execute the causal half of the scores and recompute them in backward (2.5x, not 2x), and the
    # ops also count biases, norms, GELU and the softmax of the loss. Put attention back on the
    # model count; the rest is the elementwise work, about 1%.
    ops = job.forward_ops() + job.backward_ops()
    gemm = sum(k.flops for op in ops for k in op.kernels if k.kind == "gemm")
    elementwise = sum(k.flops for op in ops for k in op.kernels if k.kind == "memory")
    attention = 12 * b * s * s * h * L
    assert (gemm + attention) == pytest.approx(closed, rel=0.02)
    assert (gemm + attention + elementwise) == pytest.approx(closed, rel=0.02)


def test_lora_and_qlora_backward() -> None:
    full, lora, qlora = llama7b(), Job.from_config(load_workload("llama2-7b-lora")), \
        Job.from_config(load_workload("llama2-7b-qlora"))
    def flops(j: Job) -> float:  # gradient work only; recompute (checkpointing) counted apart
        return sum(op.flops for op in j.backward_ops() if op.phase == "backward")
    def fwd(j: Job) -> float:
        return sum(op.flops for op in j.forward_ops())
    # frozen weights skip the weight-gradient GEMM: backward ~1x forward instead of ~2x
    assert flops(full) / fwd(full) == pytest.approx(2.0, rel=0.05)
    assert flops(lora) / fwd(lora) < 1.3
    def nbytes(j: Job, phase: Phase) -> float:
        return sum(op.bytes for op in j.ops(phase))
    # QLoRA dequantises every frozen linear weight in forward and again in backward, and
    # PEFT clones each 4-bit layer's output in forward (peft tuners/lora/bnb.py); both presets
    # use full checkpointing, so the recompute forward dequantises and clones once more
    linear = sum(p.numel for p in qlora.params if p.quantized)
    outputs = sum(p.shape[0] for p in qlora.params if p.quantized)  # (out, in) weights
    clone = 2 * qlora.tokens_per_micro_batch * outputs * qlora.activation_bytes
    assert qlora.checkpointing == lora.checkpointing == "full"
    assert nbytes(qlora, "forward") - nbytes(lora, "forward") == \
        pytest.approx((NF4_BITS_PER_PARAM / 8 + 2) * linear + clone)
    assert nbytes(qlora, "backward") - nbytes(lora, "backward") == \
        pytest.approx(2 * (NF4_BITS_PER_PARAM / 8 + 2) * linear + clone)


def test_checkpointing_recomputes() -> None:
    none, full, sel = llama7b(), llama7b(activation_checkpointing="full"), \
        llama7b(activation_checkpointing="selective")
    fwd_blocks = sum(op.flops for op in none.forward_ops() if 0 <= op.block < 32)
    assert sum(op.flops for op in full.ops("recompute")) == pytest.approx(fwd_blocks)
    rec = sel.ops("recompute")
    assert len(rec) == 32 and all(op.name.endswith("attention") for op in rec)
    bwd = full.backward_ops()  # block 31's recompute comes right before its backward
    first = next(i for i, op in enumerate(bwd) if op.phase == "recompute")
    assert bwd[first].block == 31 and bwd[first - 1].block == 32
    assert len(none.backward_ops()) + 32 * 8 == len(bwd)


def test_overrides_and_sizes() -> None:
    job = Job.from_config(load_workload("llama2-7b"), micro_batch=2, seq_len=1024, grad_accum=4)
    assert job.tokens_per_micro_batch == 2048
    assert job.model_flops_per_step() == pytest.approx(4 * Job.from_config(
        load_workload("llama2-7b"), micro_batch=2, seq_len=1024).model_flops_per_step())
    assert job.blocks[0] == -1 and job.blocks[-1] == 32 and job.n_blocks == 32
    assert job.hidden == 4096 and job.vocab == 32000 and job.precision == "bf16"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


TRAIN = "training: {seq_len: 128}\n"


@pytest.mark.parametrize(("text", "key"), [
    ("name: x\nmodel: {family: llama, layers: -2, hidden: 64, heads: 4, vocab: 10}\n" + TRAIN,
     "model.layers"),
    ("name: x\nmodel: {family: t5, layers: 2, hidden: 64, heads: 4, vocab: 10}\n" + TRAIN,
     "model.family"),
    ("name: x\nlayers: [{name: conv, params: 10, forward_flops_per_sample: 1,"
     " activation_bytes_per_sample: 1}]\ntraining: {seq_len: 1, finetune: lora}\n",
     "training.finetune"),
    ("name: x\nmodel: {family: llama, layers: 2, hidden: 64, heads: 5, vocab: 10}\n" + TRAIN,
     "model.heads"),
    ("name: x\nlayers: [{name: conv, params: 10, forward_flops_per_sample: 1,"
     " activation_bytes_per_sample: 1, tensors: 2, tensor_numels: [4, 5]}]\n" + TRAIN,
     "layers[0].tensor_numels"),
])
def test_bad_input_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(InputError) as err:
        load_workload(write(tmp_path, text))
    assert err.value.key == key
    assert err.value.line is not None


def test_unknown_lora_target_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {family: gpt2, layers: 2, hidden: 64, heads: 4,"
                 " vocab: 10}\ntraining: {seq_len: 8, finetune: lora,"
                 " lora: {targets: [q_proj]}}\n")
    with pytest.raises(InputError) as err:
        Job.from_config(load_workload(path))
    assert err.value.key == "training.lora.targets" and "c_attn" in str(err.value)


def test_generic_layers() -> None:
    cfg = WorkloadConfig.from_data({
        "name": "g", "training": {"seq_len": 1, "micro_batch": 4},
        "layers": [{"name": "stem", "params": 9408, "forward_flops_per_sample": 2.36e8,
                    "activation_bytes_per_sample": 1.6e6, "tensors": 2},
                   {"name": "fc", "params": 2049000, "forward_flops_per_sample": 4.1e6,
                    "activation_bytes_per_sample": 8e3, "tensors": 2}]})
    job = Job.from_config(cfg)
    assert job.n_params == 9408 + 2049000 and len(job.params) == 4
    assert [op.name for op in job.forward_ops()] == ["stem", "fc"]
    bwd = job.backward_ops()
    assert bwd[0].grads == (3, 2) and bwd[0].flops == pytest.approx(2 * 4 * 4.1e6)
    assert job.model_flops_per_step() == pytest.approx(3 * 4 * (2.36e8 + 4.1e6))


def bert_large(**training: object) -> Job:
    cfg = load_workload("bert-large-squad")
    return Job.from_config(cfg.with_training(**training) if training else cfg)


def test_bert_matches_hf_bert_for_question_answering() -> None:
    job = bert_large()
    # 31,782,912 embeddings + 24 x 12,596,224 layers + 2,050 QA head (shapes in the YAML source)
    assert job.n_params == 334_094_338
    names = [p.name for p in job.params]
    assert names[:5] == ["bert.embeddings.word_embeddings.weight",
                         "bert.embeddings.position_embeddings.weight",
                         "bert.embeddings.token_type_embeddings.weight",
                         "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"]
    layer = [n.removeprefix("bert.encoder.layer.0.") for n in names[5:21]]
    assert layer == [f"{m}.{w}" for m in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
        "output.dense", "output.LayerNorm") for w in ("weight", "bias")]
    assert names[-2:] == ["qa_outputs.weight", "qa_outputs.bias"]
    assert not any("pooler" in n or "lm_head" in n for n in names)
    assert len(names) == 5 + 24 * 16 + 2


def test_bert_is_post_ln_with_a_qa_head() -> None:
    ops = [op.name for op in bert_large().forward_ops()]
    assert ops[:2] == ["embedding", "embedding_norm"]
    assert ops[2:10] == [f"layers.0.{x}" for x in (
        "qkv", "attention", "attn_out", "attn_norm", "mlp_in", "mlp_act", "mlp_out", "mlp_norm")]
    assert ops[-2:] == ["qa_head", "loss"]


def test_bert_backward_completes_every_gradient_once() -> None:
    job = bert_large()
    done = [i for op in job.backward_ops() for i in op.grads]
    assert sorted(done) == list(range(len(job.params)))
    assert done[:2] == [len(job.params) - 1, len(job.params) - 2]  # qa_outputs bias, weight


@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_encoder_flops_match_the_closed_form(attention: str) -> None:
    """6 N T + 12 b s^2 h L: N the non-embedding parameters, attention not halved (no mask)."""
    job = bert_large(attention=attention)
    A, b, s = job.arch, job.micro_batch, job.seq_len
    assert A is not None
    embeddings = sum(p.numel for p in job.params if p.block == -1)
    n = job.n_params - embeddings
    closed = 6 * n * b * s + 12 * b * s * s * A.hidden * A.layers
    assert job.model_flops_per_step() == pytest.approx(closed, rel=0.02)
    attention_fwd = sum(op.flops for op in job.forward_ops() if op.name.endswith(".attention"))
    assert attention_fwd == pytest.approx(4 * b * s * s * A.hidden * A.layers, rel=0.01)


def test_bert_hidden_dropout_follows_the_dropout_rate() -> None:
    with_dropout = sum(op.bytes for op in bert_large().forward_ops())
    without = sum(op.bytes for op in bert_large(dropout=0.0).forward_ops())
    assert with_dropout > without


def test_bert_eager_attention_scales_and_masks_in_kernels_of_their_own() -> None:
    """modeling_bert.py: QK^T, / sqrt(d), + mask, softmax, dropout, PV: six forward kernels,
    after torch.matmul's reshape copies of the permuted q, k, v and the output's contiguous()."""
    (attn,) = [op for op in bert_large().forward_ops() if op.name == "layers.0.attention"]
    kernels = [k for k in attn.kernels if not k.name.startswith("matmul_reshape_copy")]
    assert [k.kind for k in kernels] == ["gemm"] + ["memory"] * 4 + ["gemm"]
    (no_dropout,) = [op for op in bert_large(dropout=0.0).forward_ops()
                     if op.name == "layers.0.attention"]
    assert len(no_dropout.kernels) == 5 + 4


def test_eager_attention_copies_its_permuted_operands_once_each_way() -> None:
    """torch.matmul folds 4-D batches with reshape (LinearAlgebra.cpp _matmul_impl): q, k, v
    and the permuted output are each read and written once per direction, b*s*h elements."""
    job = bert_large()
    b, s, h, e = job.micro_batch, job.seq_len, 1024, 2
    for ops in (job.forward_ops(), job.backward_ops()):
        (attn,) = [op for op in ops if op.name == "layers.0.attention"]
        copies = [k for k in attn.kernels if k.name.startswith("matmul_reshape_copy")]
        assert len(copies) == 4 and all(k.bytes == 2 * b * s * h * e for k in copies)
    # Megatron's CoreAttention (the fused regime) works on views: no copies
    (fused,) = [op for op in bert_large(kernels="fused").forward_ops()
                if op.name == "layers.0.attention"]
    assert not any(k.name.startswith("matmul_reshape_copy") for k in fused.kernels)


def test_generic_layer_tensor_sizes_as_given() -> None:
    # torchvision resnet50's stem: conv1.weight 64x3x7x7, bn1.weight, bn1.bias
    cfg = WorkloadConfig.from_data({
        "name": "g", "training": {"seq_len": 1, "micro_batch": 4},
        "layers": [{"name": "stem", "params": 9536, "forward_flops_per_sample": 2.36e8,
                    "activation_bytes_per_sample": 1.6e6, "tensors": 3,
                    "tensor_numels": [9408, 64, 64]}]})
    assert [p.numel for p in Job.from_config(cfg).params] == [9408, 64, 64]
    even = cfg.copy(layers=[cfg.layers[0].copy(tensor_numels=None)])  # type: ignore[index]
    assert [p.numel for p in Job.from_config(even).params] == [3179, 3179, 3178]
