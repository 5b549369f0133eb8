"""Every recipe builds (``run=False``) with each strategy its header documents
(``# strategies: ...``), on N devices, as it would on a GPU machine (CUDA is pretended: the
Trainer, the strategy and the plugins are built, nothing runs); the scale flags of the issue
(``--model.engine=vllm``, ``--model.policy.quantization=4bit``) build too."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import pretend_cuda, require_package
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

from lit_rag.cli.commands import build_cli

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
KINDS = {"ddp": DDPStrategy, "fsdp": FSDPStrategy, "deepspeed_stage_2": DeepSpeedStrategy}
NEEDS = {
    "tiny_plugin.yaml": ["lit_rag_length_penalty"],
    "tiny_worked_plugins.yaml": [
        "lit_rag_closed_book",
        "lit_rag_reinforce_loo",
        "lit_rag_lagged_engine",
    ],
}


def documented(recipe: Path) -> list[str]:
    match = re.search(
        r"^# strategies: ([\w, ]+?)\s*(\(|$)", recipe.read_text(encoding="utf-8"), re.M
    )
    return [s.strip() for s in match.group(1).split(",")] if match else []


CASES = [(r, s) for r in RECIPES for s in documented(r)]


def test_every_recipe_documents_its_strategies():
    assert all(documented(r) for r in RECIPES), [r.name for r in RECIPES if not documented(r)]
    assert all(s in KINDS for _, s in CASES)


@pytest.mark.parametrize(("recipe", "strategy"), CASES, ids=[f"{r.stem}-{s}" for r, s in CASES])
def test_recipe_builds_with_each_documented_strategy(recipe: Path, strategy: str):
    for module in NEEDS.get(recipe.name, []):
        require_package(module, "bash scripts/install.sh dev")
    if strategy.startswith("deepspeed"):
        require_package(
            "deepspeed", "pip install --no-build-isolation deepspeed (see scripts/install.sh)"
        )
    with pretend_cuda(devices=4):
        cli = build_cli(
            [
                "--config",
                str(recipe),
                f"--trainer.strategy={strategy}",
                "--trainer.accelerator=gpu",
                "--trainer.devices=4",
                "--trainer.num_nodes=2",
            ],
            run=False,
        )
    assert isinstance(cli.trainer.strategy, KINDS[strategy])
    assert cli.trainer.world_size == 8 and cli.trainer.num_devices == 4


def test_paper_recipes_carry_their_strategies():
    with pretend_cuda(devices=8):
        arena = build_cli(["--config", str(REPO / "recipes/arena.yaml")], run=False).trainer
        r2ag = build_cli(["--config", str(REPO / "recipes/r2ag.yaml")], run=False).trainer
        eval_rar = build_cli(["--config", str(REPO / "recipes/eval_rar.yaml")], run=False)
        search_r1 = build_cli(["--config", str(REPO / "recipes/search_r1.yaml")], run=False)
    assert (
        isinstance(arena.strategy, DeepSpeedStrategy)
        and arena.strategy.config["zero_optimization"]["stage"] == 2
    )
    assert "bf16" in arena.precision
    assert isinstance(r2ag.strategy, FSDPStrategy)
    assert (
        isinstance(eval_rar.trainer.strategy, FSDPStrategy)
        and eval_rar.trainer.strategy.cpu_offload.offload_params
    )
    assert eval_rar.model.policy_config.gradient_checkpointing
    assert (  # Eval-RAR's baseline at equal settings
        isinstance(search_r1.trainer.strategy, FSDPStrategy)
        and search_r1.trainer.strategy.cpu_offload.offload_params
    )
    assert search_r1.model.policy_config.gradient_checkpointing


def test_vllm_engine_and_qlora_flags_build_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # any `import vllm` while building fails
    cli = build_cli(
        [
            "--config",
            str(REPO / "recipes/eval_rar.yaml"),
            "--model.engine=vllm",
            "--model.engine.init_args.gpu_memory_utilization=0.6",
            "--model.engine.init_args.tensor_parallel_size=2",
            "--trainer.strategy=auto",
        ],
        run=False,
    )
    engine = cli.model.engine
    assert type(engine).__name__ == "VLLMEngine" and engine.gpu_memory_utilization == 0.6
    assert engine.tensor_parallel_size == 2
    qlora = build_cli(
        [
            "--config",
            str(REPO / "recipes/quickstart.yaml"),
            "--model.policy.quantization=4bit",
            "--model.engine=vllm",
        ],
        run=False,
    )
    assert (
        qlora.model.policy_config.quantization == "4bit"
        and qlora.model.policy_config.lora is not None
    )
    # building a recipe never imports vllm (that happens at the engine's first generate)


#: paper recipe -> prompts per optimizer step over all processes (the paper's batch)
PAPER_BATCH = {
    "arena.yaml": 256,
    "eval_rar.yaml": 512,
    "search_r1.yaml": 512,
    "r2ag.yaml": 128,
    "evo_rag.yaml": 8,
}


@pytest.mark.parametrize("recipe", sorted(PAPER_BATCH))
def test_paper_recipes_roll_out_with_vllm_on_the_papers_global_batch(recipe):
    """A vLLM on every rank, and the paper's batch whatever the device count: 8 GPUs (4 x 2
    nodes) each take an eighth; one GPU takes it whole."""
    with pretend_cuda(devices=4):
        cli = build_cli(
            [
                "--config",
                str(REPO / "recipes" / recipe),
                "--trainer.accelerator=gpu",
                "--trainer.devices=4",
                "--trainer.num_nodes=2",
            ],
            run=False,
        )
    assert type(cli.model.engine).__name__ == "VLLMEngine"
    assert cli.datamodule.batch_size is None  # counted over all processes, not per process
    assert cli.datamodule.process_batch_size(8) == PAPER_BATCH[recipe] // 8
    assert cli.datamodule.process_batch_size(1) == PAPER_BATCH[recipe]


def test_a_global_batch_that_does_not_split_stops_before_training(capsys):
    """ARENA's 256 prompts on 7 GPUs (the release trained on 7): one line, nothing started."""
    from helpers import one_line_error

    with pretend_cuda(devices=7):
        line = one_line_error(
            [
                "fit",
                "--config",
                str(REPO / "recipes/arena.yaml"),
                "--trainer.accelerator=gpu",
                "--trainer.devices=7",
            ],
            capsys,
        )
    assert line == (
        "lit-rag: error: data.global_batch_size 256 cannot be split over 7 processes (devices x "
        "nodes); process counts that divide it: 1, 2, 4, 8, 16, 32, 64; or set data.batch_size "
        "(per process)"
    )


def test_only_fsdp_with_cpu_offload_accumulates_inside_no_sync():
    """FSDP1 overwrites an offloaded gradient at every backward pass: with ``cpu_offload`` an
    optimizer step's passes but the last run inside ``no_sync()`` (the decision, on CPU; the
    accumulation itself: tests/trainer/test_global_batch.py)."""
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from lit_rag.models.cpu_strategies import CPUFSDP
    from lit_rag.models.strategies import accumulates_unsynced

    assert accumulates_unsynced(FSDPStrategy(cpu_offload=True))
    assert accumulates_unsynced(CPUFSDP(cpu_offload=True))
    assert not accumulates_unsynced(FSDPStrategy())
    assert not accumulates_unsynced(DDPStrategy())
    assert not accumulates_unsynced(None)  # a module built without a trainer
