"""Two memory mechanisms of a fine-tuning loop: PEFT's LoRA dropout (each adapter drops its own
copy of the layer input) and a loop that keeps the model output (its logits) through backward,
fp32 from a Llama-family model under transformers before 4.46."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.catalog import software
from simulator.catalog.gpus import gpu
from simulator.inputs.config import load_workload
from simulator.inputs.peft_config import apply
from simulator.job import checkpointing as ckpt
from simulator.job.workload import Job
from simulator.memory import estimate as memory
from simulator.memory.report import MOMENTS

RTX4090 = gpu("rtx4090")
ADAPTER = Path(__file__).resolve().parent / "fixtures" / "peft" / "adapter_config.json"


def _job(name: str = "llama2-7b-lora", **training: object) -> Job:
    cfg = load_workload(name)
    return Job.from_config(cfg.copy(training=cfg.training.copy(**training)))


def test_transformers_version_of_a_stack() -> None:
    assert software.resolve({"torch": "2.2"}).transformers < software.LOSS_FUNCTION
    assert software.resolve({"torch": "2.7"}).transformers >= software.LOSS_FUNCTION
    assert software.resolve(2024).transformers < software.LOSS_FUNCTION
    assert software.resolve(None).transformers >= software.LOSS_FUNCTION
    given = software.resolve({"torch": "2.7", "transformers": "4.38.2"})
    assert given.transformers == (4, 38, 2) and "transformers 4.38.2" in given.words()
    assert software.parse_flag("torch=2.2,transformers=4.38") == {"torch": "2.2",
                                                                   "transformers": "4.38"}


def _output_line(job: Job) -> float:
    report = memory.estimate(job, RTX4090, "ddp", world=1)
    return sum(x.bytes for x in report.lines if x.phase == "output")


@pytest.mark.parametrize(("stack", "per_logit"), [
    ({"torch": "2.2", "transformers": "4.38"}, 4),  # LlamaForCausalLM: logits.float() in forward
    ({"torch": "2.7", "transformers": "4.46"}, 2),  # ForCausalLMLoss upcasts a local copy
])
def test_a_kept_output_holds_the_logits_in_the_models_dtype(stack: dict[str, str],
                                                           per_logit: int) -> None:
    job = _job(keeps_output=True, software=stack)
    a = job.arch
    assert a is not None
    tokens = job.training.micro_batch * job.seq_len
    assert _output_line(job) == pytest.approx(tokens * a.vocab * per_logit)
    assert _output_line(_job(software=stack)) == 0  # the Trainer drops it before backward
    fused = _job(keeps_output=True, software=stack, cross_entropy="fused-linear")
    assert _output_line(fused) == 0  # Liger's fused loss materialises no logits


def test_a_kept_output_is_alive_at_every_moment() -> None:
    kept = memory.estimate(_job(keeps_output=True), RTX4090, "ddp", world=1)
    dropped = memory.estimate(_job(), RTX4090, "ddp", world=1)
    held = sum(x.bytes for x in kept.lines if x.phase == "output")
    for moment in MOMENTS:
        assert kept.counter_at("allocated", moment) - dropped.counter_at("allocated", moment) \
            == pytest.approx(held, rel=1e-6)


def test_lora_dropout_saves_each_adapters_input_copy_and_mask() -> None:
    plain = _job(activation_checkpointing="none")
    lora = plain.training.lora
    assert lora is not None
    dropped = _job(activation_checkpointing="none", lora=lora.copy(dropout=0.1))
    extra = sum(ckpt.saved_tensors(dropped).get(k, (0.0, False))[0]
                for k in ("LoRA dropout outputs and masks",))
    width = sum(m.in_features for m in plain.modules if m.block == 0 and m.lora)
    assert width > 0 and extra == pytest.approx(width * (plain.activation_bytes + 1))
    assert "LoRA dropout outputs and masks" not in ckpt.saved_tensors(plain)
    names = {k.name for op in dropped.ops("forward") for k in op.kernels}
    assert "lora_dropout" in names and "lora_dropout" not in \
        {k.name for op in plain.ops("forward") for k in op.kernels}


def test_peft_files_lora_dropout_is_read(tmp_path: Path) -> None:
    import json

    data = json.loads(ADAPTER.read_text())
    data["lora_dropout"] = 0.2
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(data))
    workload = apply(load_workload("llama2-7b"), str(path))
    assert workload.training.lora is not None and workload.training.lora.dropout == 0.2
