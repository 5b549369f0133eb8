"""Every public path from before the package layout still imports: the names ``lit_rag.api``
re-exported, at the modules they were imported from then; the class paths recipes named; the
entry points lit-rag registers. An old path gives the very object at its new home."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import tomllib

from lit_rag.compat import moved

ROOT = Path(__file__).resolve().parents[2]

#: module -> the names lit_rag.api imported from it before the layout (its public plugin API)
OLD_PUBLIC_PATHS = {
    "lit_rag.algorithm": (
        "AdvantageFn",
        "Algorithm",
        "LossOutput",
        "PolicyLossConfig",
        "PolicyLossFn",
        "Prepared",
        "TokenLoss",
        "TrainBatch",
        "collate",
    ),
    "lit_rag.environment": (
        "CONTEXT_OVERFLOW",
        "ContextLimit",
        "Environment",
        "Prompts",
        "RetrievalEnvironment",
        "chat_prompt",
        "check_context_overflow",
        "encode_prompts",
        "fit_passages",
    ),
    "lit_rag.episodes": (
        "Episode",
        "EpisodeLoop",
        "Generate",
        "Request",
        "Search",
        "Turn",
        "start_episodes",
    ),
    "lit_rag.errors": ("InputError",),
    "lit_rag.guards": ("HEDGING_MODES", "Hedging", "answer_candidates", "hedged", "hedged_text"),
    "lit_rag.kl": ("ESTIMATORS", "get_estimator"),
    "lit_rag.metrics.retrieval": ("average_precision", "full_recall_at_k", "recall_at_k"),
    "lit_rag.models": ("has_adapters", "resolve_path"),
    "lit_rag.modules.loading": ("ModelConfig", "load_model", "load_tokenizer"),
    "lit_rag.plugins.environments.query_rewriter": ("EvoRagBranch",),
    "lit_rag.plugins.environments.retrieval_tree_contracts": (
        "R2AGEpisode",
        "R2AGInference",
        "R2AGTree",
        "TreeVertex",
    ),
    "lit_rag.plugins.environments.search_agent": ("SearchEpisode",),
    "lit_rag.precision": ("resolve_dtype",),
    "lit_rag.retrieval.base": (
        "Hit",
        "IndexedRetriever",
        "Retriever",
        "check_search_args",
        "open_index",
    ),
    "lit_rag.retrieval.corpus": (
        "corpus_fingerprint",
        "read_corpus",
        "split_contents",
        "write_corpus",
    ),
    "lit_rag.retrieval.manifest": (
        "IndexCorruptError",
        "IndexMismatchError",
        "MANIFEST_NAME",
        "Manifest",
        "PASSAGES_NAME",
    ),
    "lit_rag.retrieval.storage": ("atomic_index_dir", "build_missing_index"),
    "lit_rag.reward": ("FunctionReward", "Reward"),
    "lit_rag.rollout.base": ("Generation", "Placement", "RolloutEngine", "SamplingParams"),
    "lit_rag.rollout.weights": ("checkpoint_weights", "is_zero3", "policy_path"),
    "lit_rag.step": ("StepOutput",),
    "lit_rag.text": (
        "PUNCTUATION_MODES",
        "check_punctuation",
        "exact_match",
        "extract_tag",
        "f1_score",
        "final_answer",
        "normalize_answer",
        "policy_text",
        "tag_blocks",
    ),
    "lit_rag.types": (
        "Branch",
        "Contract",
        "Example",
        "Passage",
        "Piece",
        "RewardBreakdown",
        "Step",
        "Trajectory",
    ),
}
#: class paths recipes named before the layout
OLD_RECIPE_PATHS = (
    "lit_rag.modules.reward_model.RewardModelModule",
    "lit_rag.modules.reward_model.PairDataModule",
    "lit_rag.modules.policy.PolicyModule",
    "lit_rag.callbacks.health.HealthMonitor",
    "lit_rag.callbacks.HealthMonitor",
    "lit_rag.retrieval.corpus.pool_examples",
    "lit_rag.precision.resolve_precision",
)


@pytest.mark.parametrize("module", sorted(OLD_PUBLIC_PATHS))
def test_each_name_the_api_exported_imports_from_its_old_module(module: str):
    import lit_rag.api as api

    old = importlib.import_module(module)
    for name in OLD_PUBLIC_PATHS[module]:
        value = getattr(old, name)
        exported = "kl_estimator" if name == "get_estimator" else name
        exported = "KL_ESTIMATORS" if name == "ESTIMATORS" else exported
        assert getattr(api, exported) is value, f"{module}.{name}"


@pytest.mark.parametrize("path", OLD_RECIPE_PATHS)
def test_each_class_path_recipes_named_still_resolves(path: str):
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is not None


def test_an_old_path_is_the_module_at_its_new_home():
    from lit_rag.trainer import policy

    old = importlib.import_module("lit_rag.modules.policy")
    assert old is policy
    assert old.__spec__.name == "lit_rag.trainer.policy"  # the new home's spec, kept
    assert old.PolicyModule.__module__ == "lit_rag.trainer.policy"


def test_every_moved_module_has_a_home_that_imports():
    for old, new in moved.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old


def test_an_unknown_old_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lit_rag.modules.no_such_module")


def test_every_entry_point_lit_rag_registers_loads():
    from lit_rag import registry

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    kinds = {
        "lit_rag.algorithms": "algorithm",
        "lit_rag.rewards": "reward",
        "lit_rag.environments": "environment",
        "lit_rag.retrievers": "retriever",
        "lit_rag.engines": "engine",
        "lit_rag.advantages": "advantage",
        "lit_rag.policy_losses": "policy_loss",
    }
    for group, entries in project["entry-points"].items():
        for name, target in entries.items():
            module, _, attribute = target.partition(":")
            assert getattr(importlib.import_module(module), attribute) is not None, target
            if group in kinds:
                assert registry.load(kinds[group], name) is not None, f"{group}: {name}"
    script = project["scripts"]["lit-rag"]
    module, _, attribute = script.partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    assert callable(importlib.import_module("lit_rag.cli").entry)  # the old script target
