"""QADataModule: batches, splits, reference limits, and an exactly resumable train order."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rag.data import QADataModule, ResumableLoader, limit_references, write_litrag
from lit_rag.types import Example, Passage


def _examples(n: int) -> list[Example]:
    return [Example(id=f"e{i}", question=f"q{i}", answers=["a"]) for i in range(n)]


def _ids(batches: list[list[Example]]) -> list[list[str]]:
    return [[ex.id for ex in batch] for batch in batches]


# --------------------------------------------------------------------------- data module


def test_synthetic_batches_are_lists_of_examples() -> None:
    dm = QADataModule(num_train=20, num_val=6, batch_size=8, val_batch_size=4)
    dm.setup("fit")
    train = list(dm.train_dataloader())
    assert [len(b) for b in train] == [8, 8, 4]  # 20 = 8 + 8 + 4
    assert all(isinstance(ex, Example) for batch in train for ex in batch)
    assert sorted(ex.id for b in train for ex in b) == sorted(ex.id for ex in dm.train_examples())
    val = list(dm.val_dataloader())
    assert [len(b) for b in val] == [4, 2]
    assert [ex.id for b in val for ex in b] == [ex.id for ex in dm.val_examples()]  # file order
    assert {ex.meta["hops"] for ex in dm.train_examples()} == {2, 3}


def test_synthetic_defaults_and_disjoint_splits() -> None:
    dm = QADataModule(test="synthetic")
    dm.setup()
    train, val, test = dm.train_examples(), dm.val_examples(), dm.test_examples()
    assert (len(train), len(val), len(test)) == (2000, 64, 64)
    questions = [{ex.question for ex in split} for split in (train, val, test)]
    assert not questions[0] & questions[1]
    assert not questions[0] & questions[2] and not questions[1] & questions[2]
    assert len({ex.id for ex in train + val + test}) == 2000 + 64 + 64


def test_file_splits_capped_and_no_val(tmp_path: Path) -> None:
    path = write_litrag(_examples(10), tmp_path / "train.jsonl")
    dm = QADataModule(train=str(path), val=None, num_train=7, batch_size=3, shuffle=False)
    dm.setup("fit")
    assert _ids(list(dm.train_dataloader())) == [["e0", "e1", "e2"], ["e3", "e4", "e5"], ["e6"]]
    assert dm.val_examples() == [] and dm.val_dataloader() == []


def test_max_references_keeps_all_gold() -> None:
    dm = QADataModule(num_train=30, val=None, hops=[3], num_distractors=6, max_references=5)
    for ex in dm.train_examples():
        # 3 gold + 6 distractors cut to 5: all 3 gold and the first 2 distractors remain
        assert len(ex.references) == 5
        assert set(ex.gold_ids) <= {p.id for p in ex.references}
    full = QADataModule(num_train=30, val=None, hops=[3], num_distractors=6).train_examples()
    for cut, ex in zip(dm.train_examples(), full, strict=True):
        distractors = [p for p in ex.references if p.id not in ex.gold_ids]
        assert [p for p in cut.references if p.id not in ex.gold_ids] == distractors[:2]
        assert [p.id for p in cut.references] == [
            p.id for p in ex.references if p in cut.references
        ]  # order kept


def test_limit_references_when_gold_exceeds_budget() -> None:
    refs = [Passage(str(i), "", "t") for i in range(4)]
    ex = Example("x", "q", ["a"], references=refs, gold_ids=["1", "3"])
    assert [p.id for p in limit_references(ex, 1).references] == ["1", "3"]
    assert limit_references(ex, None) is ex


@pytest.mark.parametrize("key", ["num_train", "max_references", "batch_size"])
def test_bad_sizes_name_the_key(key: str) -> None:
    with pytest.raises(ValueError, match=f"data.{key} must be >= 1"):
        QADataModule(**{key: 0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"format": "hotpot"},
            "data.format must be one of auto, hotpotqa, 2wiki, musique, flashrag, "
            "litrag; got 'hotpot'",
        ),
        ({"hops": [2, 5]}, "data.hops must be a non-empty list of values in 1..4; got [2, 5]"),
    ],
)
def test_bad_choices_name_the_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        QADataModule(**kwargs)
    assert str(err.value) == message


# --------------------------------------------------------------------------- resumable loader


def test_loader_epochs_differ_and_cover_everything() -> None:
    loader = ResumableLoader(_examples(10), batch_size=4, seed=1)
    assert len(loader) == 3
    first, second = _ids(list(loader)), _ids(list(loader))
    assert first != second
    for epoch in (first, second):
        assert sorted(i for batch in epoch for i in batch) == sorted(f"e{i}" for i in range(10))
    assert loader.state_dict() == {"epoch": 1, "batches_yielded": 3}


def test_loader_probe_iter_does_not_start_an_epoch() -> None:
    loader = ResumableLoader(_examples(10), batch_size=4, seed=1)
    iter(loader)  # Lightning calls iter() once to check the loader is iterable
    fresh = ResumableLoader(_examples(10), batch_size=4, seed=1)
    assert _ids(list(loader)) == _ids(list(fresh))


def test_loader_resumes_mid_epoch() -> None:
    reference = ResumableLoader(_examples(10), batch_size=3, seed=7)
    full = [_ids(list(reference)) for _ in range(3)]  # epochs 0, 1, 2
    loader = ResumableLoader(_examples(10), batch_size=3, seed=7)
    list(loader)
    it = iter(loader)
    seen = [next(it), next(it)]  # two batches of epoch 1
    assert _ids(seen) == full[1][:2]
    state = loader.state_dict()
    assert state == {"epoch": 1, "batches_yielded": 2}
    resumed = ResumableLoader(_examples(10), batch_size=3, seed=7)
    resumed.load_state_dict(state)
    assert _ids(list(resumed)) == full[1][2:]
    assert _ids(list(resumed)) == full[2]


def test_loader_state_saved_at_epoch_end_moves_to_next_epoch() -> None:
    reference = ResumableLoader(_examples(10), batch_size=3, seed=7)
    full = [_ids(list(reference)) for _ in range(2)]
    resumed = ResumableLoader(_examples(10), batch_size=3, seed=7)
    resumed.load_state_dict({"epoch": 0, "batches_yielded": 4})
    assert _ids(list(resumed)) == full[1]


def test_loader_shards_across_ranks() -> None:
    shards = [
        ResumableLoader(_examples(11), batch_size=2, seed=3, num_replicas=2, rank=r) for r in (0, 1)
    ]
    ids = [[i for batch in list(s) for i in [ex.id for ex in batch]] for s in shards]
    assert len(ids[0]) == len(ids[1]) == 5  # 11 examples -> 10 usable, 5 per rank
    assert not set(ids[0]) & set(ids[1])
    assert len(shards[0]) == len(shards[1]) == 3


# --------------------------------------------------------------------------- Lightning resume


class _RecordingModule(L.LightningModule):
    """Manual optimization on one parameter; records the example ids of every step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.automatic_optimization = False
        self.seen: list[list[str]] = []

    def training_step(self, batch: list[Example], batch_idx: int) -> None:
        self.seen.append([ex.id for ex in batch])
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1.0).pow(2).sum())
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(root: Path, max_steps: int, callbacks: list | None = None) -> L.Trainer:
    return L.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks or [],
        enable_checkpointing=bool(callbacks),
        num_sanity_val_steps=0,
    )


@pytest.mark.parametrize(
    ("stop", "state"),
    [(7, {"epoch": 1, "batches_yielded": 2}), (5, {"epoch": 0, "batches_yielded": 5})],
)
def test_trainer_resume_sees_the_same_batches(tmp_path: Path, stop: int, state: dict) -> None:
    """20 examples / batch 4 = 5 steps an epoch; stop at step 7 (epoch 1 after 2 batches) or at
    step 5 (the end of epoch 0), resume with ``ckpt_path`` and run to step 12."""

    def datamodule() -> QADataModule:
        return QADataModule(num_train=20, val=None, batch_size=4, seed=5)

    full = _RecordingModule()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=stop, save_top_k=-1)
    _trainer(tmp_path / "a", max_steps=12, callbacks=[checkpoint]).fit(full, datamodule())
    assert len(full.seen) == 12
    assert full.seen[:5] != full.seen[5:10]  # a new permutation in epoch 1
    ckpt = next((tmp_path / "ckpt").glob(f"*step={stop}.ckpt"))
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    assert saved["combined_loader"] == [state]

    resumed = _RecordingModule()
    _trainer(tmp_path / "b", max_steps=12).fit(resumed, datamodule(), ckpt_path=ckpt)
    assert resumed.seen == full.seen[stop:]
