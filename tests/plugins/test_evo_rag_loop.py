"""EVO-RAG's loop as Lightning (evo_rag.txt Algorithm 1, Sections 3.3-3.5): policy epochs of DPO
on sibling branches, a reward-model epoch after each, reward-model pair selection, the curriculum
switch, and the reward model's state through a checkpoint. A steering engine stands in for the
policy's sampling (the tiny random model cannot write actions); log-probs and updates are real."""

import json

import lightning as L
import pytest
import torch
from kit import EVO_CORPUS, TINY, Steering, evo_rag_reward
from lightning.pytorch.loggers import CSVLogger

from lit_rag.api import Branch
from lit_rag.callbacks import AlternatingRewardModel, CurriculumCallback, RewardWeightScheduler
from lit_rag.data.datamodule import QADataModule
from lit_rag.plugins.algorithms.dpo import DPO
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.evo_rag import COMPONENTS
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.trainer.reward_model import (
    RewardModelModule,
    read_pairs,
    sibling_pairs,
    trajectory_text,
)
from lit_rag.types import Example, RewardBreakdown, Step, Trajectory


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    retriever = BM25Retriever(stopwords="en")
    retriever.build(EVO_CORPUS)
    retriever.save(tmp_path / "index")
    rows = [
        {
            "id": f"q{i}",
            "question": "Where was the founder of Orbel Mills born?",
            "answers": ["Kessa"],
            "gold_ids": ["g1", "g2"],
        }
        for i in range(8)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _module(tmp_path, selection="reward_model") -> PolicyModule:
    env = QueryRewriterEnvironment(
        BM25Retriever(index=str(tmp_path / "index")), top_k=1, t_max=4, branch_states=2
    )
    return PolicyModule(
        policy=TINY,
        environment=env,
        reward=evo_rag_reward(),
        algorithm=DPO(selection=selection),
        engine=Steering(),
        group_size=3,
        sampling=SamplingParams(max_new_tokens=16),
        micro_batch_size=4,
        optimizer=OptimizerSettings(lr=1e-3),
    )


ACTIONS_TOKEN = {"answer": 1, "refuse": 2, "backtrack": 3}  # one completion token per action


def test_sibling_pairs_threshold_signs_and_text():
    ex = Example(id="q", question="Q?", answers=["a"], gold_ids=["g"])

    def traj(state, action):
        steps = [Step("search", "first", ["n"], ""), Step(action, None, [], "a")]
        return Trajectory(
            example=ex,
            group=0,
            prompt_ids=torch.zeros(1, dtype=torch.long),
            completion_ids=torch.tensor([ACTIONS_TOKEN[action]]),
            loss_mask=torch.ones(1),
            sampling_logprobs=torch.zeros(1),
            text="",
            steps=steps,
            prompt_text="STATE",
            contract=Branch(state=state, step=1),
        )

    trajs = [
        traj("s1", "answer"),
        traj("s1", "refuse"),
        traj("s1", "backtrack"),
        traj("s2", "answer"),
    ]
    # returns 1.0, 0.5, 0.8, -5.0
    total = torch.tensor([[0.0, 1.0], [0.0, 0.5], [0.0, 0.8], [0.0, -5.0]])
    comps = {k: torch.zeros(4, 2) for k in COMPONENTS}
    comps["answer"][0, 1] = 1.0
    comps["refusal"][1, 1] = 1.0
    pairs = sibling_pairs(trajs, RewardBreakdown(total=total, components=comps), threshold=0.3)
    # s1: 1.0 - 0.5 = 0.5 and 0.8 - 0.5 = 0.3 pass; 1.0 - 0.8 = 0.2 does not; s2 has one sibling
    assert sorted(round(p["margin"], 6) for p in pairs) == [0.3, 0.5]
    best = next(p for p in pairs if round(p["margin"], 6) == 0.5)
    signs = dict(zip(COMPONENTS, best["signs"], strict=True))
    assert signs["answer"] == 1.0 and signs["refusal"] == -1.0 and signs["step"] == 0.0
    assert best["chosen"] == "STATE\nanswer: a" and best["rejected"] == "STATE\nrefuse: a"
    assert trajectory_text(trajs[0]).startswith("STATE")


def test_dpo_ranks_by_the_reward_model_once_attached():
    ex = Example(id="q", question="Q?", answers=["a"], gold_ids=[])
    trajs = [
        Trajectory(
            example=ex,
            group=0,
            prompt_ids=torch.tensor([1, 2]),
            completion_ids=torch.tensor([3 + i]),
            loss_mask=torch.ones(1),
            sampling_logprobs=torch.zeros(1),
            text="",
            contract=Branch(state="s"),
        )
        for i in range(3)
    ]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0, 0.5]), components={})
    dpo = DPO(selection="reward_model", margin=0.2)
    batch = dpo.prepare(trajs, rewards)  # no scorer yet: by return, chosen 0 / rejected 1
    assert batch.batch.input_ids[0, -1] == 3 and batch.batch.input_ids[1, -1] == 4
    dpo.scorer = lambda ts: torch.tensor([0.0, 0.1, 2.0])  # the model prefers 2 over 0
    batch = dpo.prepare(trajs, rewards)
    assert batch.batch.input_ids[0, -1] == 5 and batch.batch.input_ids[1, -1] == 3
    assert float(batch.metrics["rm_agreement"]) == 0.0  # return(2) = 0.5 < return(0) = 1.0
    dpo.scorer = lambda ts: torch.tensor([0.0, 0.1, 0.15])  # score gaps under delta: no pair
    assert dpo.prepare(trajs, rewards).size == 0
    with pytest.raises(
        ValueError, match="selection 'rm' is not known; allowed: return, reward_model"
    ):
        DPO(selection="rm")


def test_max_pairs_keeps_the_largest_gaps():
    ex = Example(id="q", question="Q?", answers=["a"], gold_ids=[])
    trajs = [
        Trajectory(
            example=ex,
            group=i // 2,
            prompt_ids=torch.tensor([1]),
            completion_ids=torch.tensor([i + 3]),
            loss_mask=torch.ones(1),
            sampling_logprobs=torch.zeros(1),
            text="",
            contract=Branch(state=str(i // 2)),
        )
        for i in range(6)
    ]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0, 3.0, 0.0, 2.0, 0.0]), components={})
    batch = DPO(max_pairs=2).prepare(trajs, rewards)
    assert batch.size == 4 and float(batch.metrics["pairs"]) == 3.0
    assert batch.batch.input_ids[:, -1].tolist() == [5, 6, 7, 8]  # gaps 3 and 2, not 1


def test_policy_and_reward_model_epochs_alternate_through_lightning(setup):
    tmp_path = setup
    module = _module(tmp_path)
    rm = RewardModelModule(encoder=TINY, max_length=128, lr=1e-2)
    alternate = AlternatingRewardModel(rm, threshold=0.3, batch_size=8, val_fraction=0.25)
    curriculum = CurriculumCallback(switch_after_epochs=1, monitor=None)
    trainer = L.Trainer(
        max_epochs=2,
        callbacks=[RewardWeightScheduler(), curriculum, alternate],
        logger=CSVLogger(tmp_path, name="run"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1,
    )
    dm = QADataModule(train=str(tmp_path / "train.jsonl"), val=None, batch_size=4)
    trainer.fit(module, datamodule=dm)
    # one reward-model epoch after each of the two policy epochs, on the pairs gathered so far
    assert alternate.cycles == 2 and len(alternate.history) == 2
    assert (
        alternate.history[1]["reward_model/pairs"] >= alternate.history[0]["reward_model/pairs"] > 0
    )
    assert "reward_model/train_loss" in alternate.history[0]
    # the second policy epoch's pairs were ranked by the trained reward model
    assert module.algorithm.scorer is not None
    assert "rollout/rm_agreement" in trainer.callback_metrics
    # the curriculum moved to Refinement after epoch 0: the reward uses the mid -> end anchors
    assert curriculum.stage == "refinement" and module.reward.early["answer"] == 0.10
    # pairs of each policy epoch are saved in the reward-model recipe's format
    files = sorted((tmp_path / "run").glob("version_*/preference_pairs/epoch*.jsonl"))
    assert [f.name for f in files] == ["epoch0.jsonl", "epoch1.jsonl"]
    rows = read_pairs(files[0])
    assert rows and len(rows[0]["signs"]) == len(COMPONENTS) and rows[0]["margin"] >= 0.3
    # reward-model state goes through the checkpoint
    state = alternate.state_dict()
    fresh = AlternatingRewardModel(RewardModelModule(encoder=TINY))
    fresh.load_state_dict(state)
    fresh.reward_model.configure_model()
    fresh.setup(trainer, module, "fit")
    assert fresh.cycles == 2 and len(fresh.pairs) == len(alternate.pairs)
    for key, value in rm.heads.state_dict().items():
        assert torch.equal(fresh.reward_model.heads.state_dict()[key].cpu(), value.cpu())


def test_reward_model_learns_the_collected_preferences(setup):
    """The heads learn the preferences the loop collects (which actions earn more: a gold search
    over a noise search, an answer over a refusal): above chance on held-out questions' pairs."""
    tmp_path = setup
    rows = [
        {
            "id": f"q{i}",
            "question": f"Where was the founder of Orbel Mills born? ({i})",
            "answers": ["Kessa"],
            "gold_ids": ["g1", "g2"],
        }
        for i in range(24)
    ]  # 24 questions: ~6 held out by question
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    L.seed_everything(0)  # the policy's and the heads' initial weights
    module = _module(tmp_path, selection="return")
    rm = RewardModelModule(encoder=TINY, max_length=128, lr=5e-2)
    alternate = AlternatingRewardModel(rm, threshold=0.3, epochs=8, batch_size=8, val_fraction=0.25)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[alternate],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(
        module, datamodule=QADataModule(train=str(tmp_path / "train.jsonl"), val=None, batch_size=4)
    )
    metrics = alternate.history[-1]
    # 74 pairs over the 24 questions; the questions held out (val_fraction 0.25) gave 23 of
    # them, pairs of questions the heads never trained on
    assert (metrics["reward_model/pairs"], metrics["reward_model/train_pairs"]) == (74, 51), metrics
    # chance is accuracy 0.5 and loss log 2 = 0.693 (untrained heads start near 0 score gaps);
    # this seeded run ranks 17 of the 23 right (0.739): a coin gets >= 17 of 23 right with
    # probability 0.017
    assert metrics["reward_model/val_pair_accuracy"] == pytest.approx(17 / 23), metrics
    # held-out loss of this seeded run, below chance's 0.693
    assert metrics["reward_model/val_loss"] == pytest.approx(0.5518, abs=1e-3)
