"""CurriculumCallback: stage switch on a step count and on a plateau, checkpoint reload, final
stop."""

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.callbacks import CurriculumCallback, RewardWeightScheduler
from lit_rag.plugins.rewards.evo_rag import EvoRagReward


class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))
        self.reward = EvoRagReward()
        self.logged = {}

    def log(self, key, value, **kwargs):
        self.logged[key] = value


def trainer(*callbacks):
    return SimpleNamespace(
        callbacks=list(callbacks),
        global_step=0,
        current_epoch=0,
        callback_metrics={},
        sanity_checking=False,
        should_stop=False,
    )


def test_switch_on_step_count_changes_the_weight_anchors():
    module, sched = Module(), RewardWeightScheduler()
    cur = CurriculumCallback(switch_after_steps=3)
    tr = trainer(sched, cur)
    cur.setup(tr, module, "fit")
    assert cur.stages == ["discovery", "refinement"]  # the reward's stages (evo_rag.txt 3.5)
    cur.on_train_start(tr, module)
    assert module.reward.weights_at(0)["answer"] == 0.05  # Discovery starts at Table 1's start
    tr.global_step = 2
    cur.on_train_batch_end(tr, module, None, None, 0)
    assert cur.stage == "discovery" and module.logged["curriculum/stage"] == 0.0
    tr.global_step = 3
    cur.on_train_batch_end(tr, module, None, None, 0)
    assert cur.stage == "refinement" and cur.switches == [(3, "discovery", "refinement")]
    assert (
        module.reward.weights_at(0)["answer"] == 0.10
        and module.reward.weights_at(20)["answer"] == 1.0
    )
    tr.global_step = 10  # no third stage: stays
    cur.on_train_batch_end(tr, module, None, None, 0)
    assert cur.stage == "refinement"


def test_switch_on_plateau_then_stop_on_final_plateau():
    module = Module()
    cur = CurriculumCallback(monitor="val/em", patience=2)
    tr = trainer(cur)
    cur.setup(tr, module, "fit")
    cur.on_train_start(tr, module)
    for value in (0.1, 0.2, 0.2):  # best 0.2, then one stale validation
        tr.callback_metrics = {"val/em": torch.tensor(value)}
        cur.on_validation_end(tr, module)
    assert cur.stage == "discovery" and cur.stale == 1
    tr.callback_metrics = {"val/em": torch.tensor(0.15)}  # second stale: plateau -> switch
    cur.on_validation_end(tr, module)
    assert cur.stage == "refinement" and cur.best is None
    assert module.reward.stage == "refinement"  # no scheduler: the reward itself switches
    for value in (0.3, 0.3, 0.29):
        tr.callback_metrics = {"val/em": torch.tensor(value)}
        cur.on_validation_end(tr, module)
    assert tr.should_stop  # the paper stops when dev EM stalls for two cycles


def _switch_to_the_best(tmp_path, module) -> CurriculumCallback:
    """A stage switch with ``reload_best`` whose best checkpoint holds ``w = [1, 2]``."""
    path = tmp_path / "best.ckpt"
    torch.save({"state_dict": {"w": torch.tensor([1.0, 2.0])}}, path)
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    checkpoint.best_model_path = str(path)
    cur = CurriculumCallback(switch_after_epochs=1, reload_best=True)
    tr = trainer(checkpoint, cur)
    cur.setup(tr, module, "fit")
    cur.on_train_epoch_end(tr, module)
    return cur


def test_switch_reloads_the_best_checkpoint_of_the_finished_stage(tmp_path):
    module = Module()
    cur = _switch_to_the_best(tmp_path, module)
    assert cur.stage == "refinement" and module.w.tolist() == [1.0, 2.0]


class FakeWorkers:
    """Stands in for the module's rollout workers: records the weights it is asked to push."""

    def __init__(self, module) -> None:
        self.module, self.pushed = module, []

    def resync(self) -> None:
        self.pushed.append(self.module.w.tolist())


def test_a_reload_reaches_the_rollout_workers_too(tmp_path):
    module = Module()
    module.workers = FakeWorkers(module)
    module.engine = SimpleNamespace(sync_weights=lambda: pytest.fail("the workers sample"))
    _switch_to_the_best(tmp_path, module)
    assert module.workers.pushed == [[1.0, 2.0]]  # the reloaded weights, pushed once


def test_reload_prefers_the_monitored_checkpoint_over_a_latest_one(tmp_path):
    """The EVO-RAG recipes keep two ModelCheckpoints: one monitoring val/em (the best) and one
    unmonitored that writes last.ckpt every epoch; its best_model_path is only its latest."""
    module = Module()
    for name, value in (("latest.ckpt", [9.0, 9.0]), ("best.ckpt", [1.0, 2.0])):
        torch.save({"state_dict": {"w": torch.tensor(value)}}, tmp_path / name)
    latest = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    latest.best_model_path = str(tmp_path / "latest.ckpt")
    best = ModelCheckpoint(dirpath=tmp_path, monitor="val/em", mode="max")
    best.best_model_path = str(tmp_path / "best.ckpt")
    cur = CurriculumCallback(
        stages=["discovery", "refinement"], switch_after_epochs=1, reload_best=True
    )
    cur.on_train_epoch_end(trainer(latest, best, cur), module)  # the unmonitored one listed first
    assert module.w.tolist() == [1.0, 2.0]


def test_bad_settings():
    with pytest.raises(ValueError, match="needs switch_after_steps"):
        CurriculumCallback()
    with pytest.raises(ValueError, match="mode must be"):
        CurriculumCallback(monitor="val/em", mode="up")


def test_stages_come_from_the_recipe_or_the_reward():
    module = Module()
    module.reward = SimpleNamespace(stages=())  # a reward without a curriculum
    cur = CurriculumCallback(switch_after_steps=1)
    with pytest.raises(ValueError, match="declares none"):
        cur.setup(trainer(cur), module, "fit")
    named = CurriculumCallback(stages=["a", "b"], switch_after_steps=1)
    named.setup(trainer(named), module, "fit")
    assert named.stages == ["a", "b"]
    with pytest.raises(ValueError, match="at least one stage"):
        CurriculumCallback(stages=[], switch_after_steps=1)
