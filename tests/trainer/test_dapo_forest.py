"""DAPO options (dynamic sampling with refill, overlong masking) and R2AG's RR-Forest iterations
through Lightning, driven by a scripted policy (the tiny model only computes log-probs)."""

import json
from types import SimpleNamespace
from typing import ClassVar

import lightning as L
import pytest
import torch

from lit_rag.api import R2AGEpisode, Reward
from lit_rag.callbacks import ProgressiveForest
from lit_rag.contracts.step import StepOutput
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.retrieval_tree import RetrievalTreeEnvironment
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.r2ag import R2AGReward
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

TINY = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))


def traj(example, group, reward_text="", truncated=False):
    ids = torch.tensor([5, 6, 7])
    return Trajectory(
        example,
        group,
        torch.tensor([1, 2]),
        ids,
        torch.ones(3, dtype=torch.long),
        torch.zeros(3),
        reward_text,
        truncated=truncated,
    )


class ByText(Reward):
    """Reward = float(text) (scripted)."""

    weights: ClassVar[dict] = {}

    def __call__(self, trajectories):
        return RewardBreakdown(total=torch.tensor([float(t.text or 0) for t in trajectories]))


def test_prepare_keeps_exactly_the_batch_of_informative_groups():
    ex = Example("a", "?", ["x"])
    rows = [
        traj(ex, g, r)
        for g, rs in enumerate([("1", "1"), ("0", "1"), ("1", "0"), ("0", "1")])
        for r in rs
    ]
    rewards = ByText()(rows)
    algo = GRPO(beta=0.0, drop_zero_variance_groups=True, dynamic_sampling_rounds=2)
    assert algo.informative_groups(rows, rewards) == 3  # group 0 is flat
    batch = algo.prepare(rows, rewards, max_groups=2)
    assert batch.size == 4  # groups 1 and 2, in order; group 0 dropped, group 3 beyond the batch
    # groups 1 and 2 score (0, 1) and (1, 0): mean 0.5, sample std sqrt((0.25 + 0.25) / 1) =
    # 0.70711, A = +-0.5 / (0.70711 + 1e-4) = +-0.70701
    a = 0.5 / (0.5**0.5 + 1e-4)
    assert batch.batch.advantages.tolist() == pytest.approx([-a, a, a, -a], abs=1e-6)
    with pytest.raises(ValueError, match="needs drop_zero_variance_groups"):
        GRPO(dynamic_sampling_rounds=1)


def test_overlong_mask_removes_truncated_outputs_from_the_loss():
    ex = Example("a", "?", ["x"])
    rows = [traj(ex, 0, "1"), traj(ex, 0, "0", truncated=True)]
    batch = GRPO(beta=0.0, overlong="mask").prepare(rows, ByText()(rows))
    assert batch.batch.completion_mask[1].sum() == 0 and batch.batch.token_weights[1].sum() == 0
    assert batch.batch.completion_mask[0].sum() == 3


class Scripted(RolloutEngine):
    """Completion text = the reward the example should get: '1'/'0' alternating for examples
    whose id starts with 'v' (variance), always '1' otherwise (flat groups)."""

    def generate(self, prompts, params):
        out = []
        for i, p in enumerate(prompts):
            text = self.tokenizer.decode(p)
            value = str(i % 2) if "varied" in text else "1"
            ids = torch.tensor(self.tokenizer(value, add_special_tokens=False)["input_ids"])
            out.append(Generation(ids, torch.zeros(len(ids)), value, True))
        return out


def refill_module() -> PolicyModule:
    """A policy module with DAPO's refill (3 rounds) over the scripted engine, G = 2."""
    module = PolicyModule(
        policy=TINY,
        environment=SingleTurnEnvironment(),
        reward=ByText(),
        group_size=2,
        algorithm=GRPO(beta=0.0, drop_zero_variance_groups=True, dynamic_sampling_rounds=3),
        engine=Scripted(),
    )
    module.configure_model()
    return module


def test_refill_samples_more_prompts_until_the_batch_is_informative():
    module = refill_module()
    flat = [Example(f"f{i}", f"flat question {i}", ["x"]) for i in range(2)]
    varied = [Example(f"v{i}", f"varied question {i}", ["x"]) for i in range(4)]
    draws = iter([[flat[0], varied[0]], [varied[1], varied[2]]])
    refill = module.refill()
    refill.draw = lambda n, round_index: next(draws)
    rows = module.rollout(flat, module.sampling, 2)
    rows, rewards, used = refill.run(rows, module.reward(rows), target=2, rounds=3)
    assert used == 2  # after round 1 one informative group, after round 2 three: stop
    assert module.algorithm.informative_groups(rows, rewards) == 3
    assert sorted({t.group for t in rows}) == list(range(6))  # groups renumbered, never merged
    batch = module.algorithm.prepare(rows, rewards, max_groups=2)
    assert batch.size == 4


def _orbel_world(tmp_path, name: str):
    """A three-passage BM25 index at ``tmp_path/index`` and one two-hop question in
    ``tmp_path/<name>.jsonl`` (gold g1 then g2); returns the data file."""
    corpus = [
        Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
        Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
        Passage("n1", "Vell Works", "Vell Works makes boats in Ardun."),
    ]
    retriever = BM25Retriever(stopwords="en")
    retriever.build(corpus)
    retriever.save(tmp_path / "index")
    data = tmp_path / f"{name}.jsonl"
    row = {
        "id": "q1",
        "question": "Where was the founder of Orbel Mills born?",
        "answers": ["Kessa"],
        "gold_ids": ["g1", "g2"],
    }
    data.write_text(json.dumps(row) + "\n")
    return data


def test_forest_iterations_through_lightning(tmp_path, monkeypatch):
    """Epoch 0 expands the root; its pruned trees (gold found so far as evidence) are epoch 1's
    pool; the steering output reads the evidence; complete trees leave the forest."""
    monkeypatch.chdir(tmp_path)
    data = _orbel_world(tmp_path, "train")
    seen: list[str] = []

    class Steering(RolloutEngine):
        def generate(self, prompts, params):
            out = []
            for i, p in enumerate(prompts):
                text = self.tokenizer.decode(p)
                seen.append(text)
                if "Mira Tolvan is an engineer" in text:
                    reply = "<think>done</think><base-Q>stop retrieval</base-Q>"
                elif "Orbel Mills is a paper company" in text:
                    reply = "<think>hop 2</think><base-Q>Mira Tolvan born engineer</base-Q>"
                else:  # the root: half the samples find g1, half find noise
                    reply = (
                        "<think>hop 1</think><base-Q>Orbel Mills paper company</base-Q>"
                        if i % 2 == 0
                        else "<think>?</think><base-Q>boats Ardun</base-Q>"
                    )
                ids = torch.tensor(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
                out.append(Generation(ids, torch.zeros(len(ids)), reply, True))
            return out

    module = PolicyModule(
        policy=TINY,
        environment=RetrievalTreeEnvironment(BM25Retriever(index=str(tmp_path / "index"))),
        reward=R2AGReward(),
        algorithm=GRPO(beta=0.0),
        engine=Steering(),
        group_size=2,
        sampling=SamplingParams(max_new_tokens=32),
        optimizer=OptimizerSettings(lr=1e-3),
    )
    dm = QADataModule(train=str(data), val=None, batch_size=1, forest=True)
    forest = ProgressiveForest()
    trainer = L.Trainer(
        max_epochs=5,
        reload_dataloaders_every_n_epochs=1,
        callbacks=[forest],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    # epoch 0: the root (2 samples: g1 / noise) -> two pruned trees: {g1} and root-only {}
    # epoch 1: {g1} finds g2; root-only finds g1 again (and noise) -> {g1, g2} and {g1} (+ {})
    # epoch 2: {g1, g2} stops (complete, leaves); {g1} finds g2 -> {g1, g2}; {} -> ...
    assert trainer.current_epoch >= 2
    assert any("[1] Orbel Mills: Orbel Mills is a paper company" in s for s in seen)
    assert any("Mira Tolvan is an engineer" in s and "Orbel Mills is a paper" in s for s in seen)
    state = dm.state_dict()
    assert (
        state["iteration"] == trainer.current_epoch - 1
        or state["iteration"] == trainer.current_epoch
    )
    assert forest.added >= 2


def test_refilled_prompts_stay_out_of_the_next_forest():
    """Algorithm 1 expands each tree of RR-Forest^j once and only filters flat groups; DAPO's
    refill draws extra prompts. Batch = [a] (group 0, two samples); the refill drew b (group 1,
    numbered after the batch by the refill). Gold: a {ga1, ga2}, b {gb1, gb2}."""
    a = Example("a", "question a", ["x"], gold_ids=["ga1", "ga2"])
    b = Example("b", "question b", ["y"], gold_ids=["gb1", "gb2"])

    def sample(example, group, found):
        empty = torch.zeros(0, dtype=torch.long)
        return Trajectory(
            example,
            group,
            empty,
            empty,
            empty,
            empty.float(),
            "",
            steps=[Step("base", "q", [found])],
            contract=R2AGEpisode(depth=0, prior=[], think=True, stop=False, segments=1),
        )

    rows = [sample(a, 0, "ga1"), sample(a, 0, "noise"), sample(b, 1, "gb1"), sample(b, 1, "noise")]
    # a's samples prune to {ga1} and {} (root only): 2 trees; b's (the refill) to {gb1} and {}:
    # 2 more
    env = RetrievalTreeEnvironment(retriever=None)
    for include, expected in (
        (False, {("a", ("ga1",)), ("a", ())}),
        (True, {("a", ("ga1",)), ("a", ()), ("b", ("gb1",)), ("b", ())}),
    ):
        dm = QADataModule(train="synthetic", val=None, forest=True)
        module = SimpleNamespace(environment=env, log=lambda *a, **k: None)
        outputs = StepOutput(
            rows, RewardBreakdown(total=torch.zeros(len(rows))), batch_size=1
        ).as_outputs()
        forest = ProgressiveForest(include_refills=include)
        forest.on_train_batch_end(SimpleNamespace(datamodule=dm), module, outputs, [a], 0)
        assert set(dm.next) == expected and forest.added == len(expected)
    with pytest.raises(ValueError, match="max_iterations must be >= 1 or null; got 0"):
        ProgressiveForest(max_iterations=0)


@pytest.mark.parametrize(
    ("top_t", "predicted", "k", "mean_ap"),
    [
        # every branch: b1 -> g1, b2 -> n1, p1 -> g2: K = 3, mAP = (1/1 + 2/3) / 2 = 5/6
        (None, True, 3.0, 5 / 6),
        # top-1 of each kind: b1 -> g1, p1 -> g2: K = 2, mAP = (1/1 + 2/2) / 2 = 1.0
        (1, True, 2.0, 1.0),
        # R2AG_base, top-1: b1 -> g1: K = 1, mAP = (1/1) / 2 = 0.5
        (1, False, 1.0, 0.5),
    ],
)
def test_validate_logs_k_and_map_of_the_top_t_tree(
    tmp_path, monkeypatch, top_t, predicted, k, mean_ap
):
    """What ``lit-rag validate`` runs (Trainer.validate) logs Table 1's K and mAP."""
    monkeypatch.chdir(tmp_path)
    data = _orbel_world(tmp_path, "val")

    class Steering(RolloutEngine):
        def generate(self, prompts, params):
            out = []
            for p in prompts:
                if "Evidences:\nnone" in self.tokenizer.decode(p):  # the root: 2 base, 1 predicted
                    reply = (
                        "<think>a</think><base-Q>Orbel Mills paper company</base-Q>"
                        "<base-Q>boats Ardun</base-Q>"
                        "<predicted-Q>Mira Tolvan born engineer</predicted-Q>"
                    )
                else:
                    reply = "<think>b</think><base-Q>stop retrieval</base-Q>"
                ids = torch.tensor(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
                out.append(Generation(ids, torch.zeros(len(ids)), reply, True))
            return out

    env = RetrievalTreeEnvironment(
        BM25Retriever(index=str(tmp_path / "index")),
        val_top_t=top_t,
        val_predicted_queries=predicted,
        reader_prompt="",
    )
    module = PolicyModule(
        policy=TINY,
        environment=env,
        reward=R2AGReward(),
        algorithm=GRPO(beta=0.0),
        engine=Steering(),
        group_size=2,
        val_sampling=SamplingParams(max_new_tokens=64),
    )
    trainer = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    (logged,) = trainer.validate(module, datamodule=QADataModule(train=str(data), val=str(data)))
    assert logged["val/avg_k"] == pytest.approx(k) and logged["val/map"] == pytest.approx(mean_ap)
