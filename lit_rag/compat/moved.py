"""Module paths from before the code was laid out as packages, each still importable.

A recipe's ``class_path``, a third-party plugin's import, or a checkpoint pickled with an old
path keeps working: importing an old path gives the module at its new home (the same module
object, so classes compare equal). ``lit_rag.modules`` is kept as an empty package for the old
``lit_rag.modules.<name>`` paths. Modules that became packages of the same name
(``lit_rag.cli``, ``evaluate``, ``report``, ``health``, ``models``) are packages now;
``lit_rag.models`` re-exports the names :mod:`lit_rag.api` took from it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module path -> its home
MOVED: dict[str, str] = {
    "lit_rag.algorithm": "lit_rag.contracts.algorithm",
    "lit_rag.environment": "lit_rag.contracts.environment",
    "lit_rag.reward": "lit_rag.contracts.reward",
    "lit_rag.episodes": "lit_rag.contracts.episodes",
    "lit_rag.step": "lit_rag.contracts.step",
    "lit_rag.reward_functions": "lit_rag.contracts.function_rewards",
    "lit_rag.plugins.environments.retrieval_tree_contracts": "lit_rag.contracts.methods",
    "lit_rag.cli_help": "lit_rag.cli.help",
    "lit_rag.trainer_cli": "lit_rag.cli.fit",
    "lit_rag.recipe_args": "lit_rag.cli.recipe_args",
    "lit_rag.engine_fallback": "lit_rag.cli.engine_fallback",
    "lit_rag.console": "lit_rag.cli.console",
    "lit_rag.preload": "lit_rag.cli.preload",
    "lit_rag.evaluate_protocol": "lit_rag.evaluate.protocol",
    "lit_rag.evaluate_records": "lit_rag.evaluate.records",
    "lit_rag.evaluate_table": "lit_rag.evaluate.table",
    "lit_rag.suites": "lit_rag.evaluate.suites",
    "lit_rag.compare": "lit_rag.evaluate.compare",
    "lit_rag.prepare": "lit_rag.data.prepare.command",
    "lit_rag.prepare_files": "lit_rag.data.prepare.files",
    "lit_rag.prepare_sampling": "lit_rag.data.prepare.sampling",
    "lit_rag.prepare_sources": "lit_rag.data.prepare.sources",
    "lit_rag.report_health": "lit_rag.report.health",
    "lit_rag.guards": "lit_rag.health.guards",
    "lit_rag.detectors": "lit_rag.health.detectors",
    "lit_rag.callbacks.health": "lit_rag.health.monitor",
    "lit_rag.checkpointing": "lit_rag.checkpoints.storage",
    "lit_rag.export": "lit_rag.cli.export",
    "lit_rag.modules.provenance": "lit_rag.checkpoints.provenance",
    "lit_rag.index_cli": "lit_rag.cli.index",
    "lit_rag.plugins.engines.vllm_ranks": "lit_rag.plugins.engines.vllm.ranks",
    "lit_rag.plugins.engines.vllm_settings": "lit_rag.plugins.engines.vllm.settings",
    "lit_rag.plugins.engines.vllm_support": "lit_rag.plugins.engines.vllm.support",
    "lit_rag.modules.policy": "lit_rag.trainer.policy",
    "lit_rag.modules.update": "lit_rag.trainer.update",
    "lit_rag.modules.state": "lit_rag.trainer.state",
    "lit_rag.modules.ranks": "lit_rag.trainer.ranks",
    "lit_rag.modules.refill": "lit_rag.trainer.refill",
    "lit_rag.modules.schedule": "lit_rag.trainer.schedule",
    "lit_rag.modules.optimizer": "lit_rag.trainer.optimizer",
    "lit_rag.modules.step_metrics": "lit_rag.trainer.phases",
    "lit_rag.modules.logprobs": "lit_rag.trainer.logprobs",
    "lit_rag.modules.reward_model": "lit_rag.trainer.reward_model",
    "lit_rag.kl": "lit_rag.trainer.kl",
    "lit_rag.rollout.worker": "lit_rag.rollout.workers.process",
    "lit_rag.rollout.transport": "lit_rag.rollout.workers.transport",
    "lit_rag.modules.disaggregated": "lit_rag.rollout.workers.scheduler",
    "lit_rag.modules.loading": "lit_rag.models.loading",
    "lit_rag.modules.packing": "lit_rag.models.packing",
    "lit_rag.modules.prefix_attention": "lit_rag.models.attention",
    "lit_rag.modules.strategies": "lit_rag.models.strategies",
    "lit_rag.modules.cpu_strategies": "lit_rag.models.cpu_strategies",
    "lit_rag.modules.activation_checkpointing": "lit_rag.models.activation_checkpointing",
    "lit_rag.modules.tiny": "lit_rag.models.tiny",
    "lit_rag.precision": "lit_rag.models.precision",
    "lit_rag.distributed": "lit_rag.models.distributed",
}
#: old packages with no home of their own: empty packages, so their old submodules resolve
OLD_PACKAGES = frozenset({"lit_rag.modules"})


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in :data:`MOVED` and loads it as the module at its new home."""

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 (the finder protocol)
        if name in MOVED or name in OLD_PACKAGES:
            return importlib.util.spec_from_loader(name, self, is_package=name in OLD_PACKAGES)
        return None

    def create_module(self, spec):
        if spec.name in OLD_PACKAGES:
            return None  # a plain empty module, made a package by exec_module
        module = importlib.import_module(MOVED[spec.name])
        self._spec = module.__spec__  # importlib sets __spec__ to the old name's: put it back
        return module

    def exec_module(self, module) -> None:
        if module.__spec__.name in OLD_PACKAGES:
            module.__path__ = []
            module.__doc__ = "Old package of lit-rag's trainer and model modules (see MOVED)."
            return
        module.__spec__ = self._spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
