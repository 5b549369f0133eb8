"""EVO-RAG's multi-head preference model: the loss against the formula, the reduction to DPO
with tied heads, pair files, and a short fit on a tiny encoder that learns a planted preference."""

import json
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.trainer.reward_model import (
    PairDataModule,
    RewardModelModule,
    pairwise_loss,
    read_pairs,
    write_pairs,
)

TINY = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))


def test_pairwise_loss_is_the_formula():
    chosen = torch.tensor([[1.0, 0.0, 2.0]])
    rejected = torch.tensor([[0.0, 1.0, 2.0]])
    # -(1/3) [log s(1) + log s(-1) + log s(0)]
    expected = (
        -(math.log(1 / (1 + math.exp(-1))) + math.log(1 / (1 + math.exp(1))) + math.log(0.5)) / 3
    )
    assert float(pairwise_loss(chosen, rejected)) == pytest.approx(expected)
    # signs: head 2 says x+ is worse on its component, head 3 is skipped
    signs = torch.tensor([[1.0, -1.0, 0.0]])
    expected = -(math.log(1 / (1 + math.exp(-1))) + math.log(1 / (1 + math.exp(-1)))) / 2
    assert float(pairwise_loss(chosen, rejected, signs)) == pytest.approx(expected)


def test_tied_heads_reduce_to_dpo():
    f_plus, f_minus = torch.tensor([0.7, -0.2]), torch.tensor([0.1, 0.4])
    tied = pairwise_loss(f_plus.unsqueeze(-1).expand(2, 7), f_minus.unsqueeze(-1).expand(2, 7))
    dpo = -F.logsigmoid(1.0 * (f_plus - f_minus)).mean()  # DPO with beta (temperature) 1
    assert float(tied) == pytest.approx(float(dpo))


def test_pair_files_round_trip_and_bad_rows(tmp_path):
    path = write_pairs([{"chosen": "a", "rejected": "b", "signs": [1, 0]}], tmp_path / "p.jsonl")
    assert read_pairs(path) == [{"chosen": "a", "rejected": "b", "signs": [1, 0]}]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"chosen": "a"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: preference pair lacks rejected"):
        read_pairs(tmp_path / "bad.jsonl")


def test_pair_file_with_bom_and_crlf(tmp_path):
    """A pairs file saved by a Windows editor: UTF-8 byte-order mark, CRLF line ends."""
    path = tmp_path / "p.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"chosen": "a", "rejected": "b"}).encode() + b"\r\n"
    )
    assert read_pairs(path) == [{"chosen": "a", "rejected": "b"}]


def trigrams(text: str) -> set[tuple[str, ...]]:
    """Every run of three consecutive words (punctuation dropped)."""
    words = text.replace(":", " ").replace(",", " ").split()
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


@pytest.mark.parametrize("single_head", [False, True])
def test_fit_learns_a_planted_preference(tmp_path, single_head):
    """The planted preference: gold evidence over a refusal. The held-out pairs say it in words
    training never used (no three-word run in common) about entities it never saw; only the
    words "gold" and "refuse" carry over, so a memorised phrase or suffix cannot rank them."""
    torch.manual_seed(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    train_wording = [
        ("search {w} found gold evidence", "search {w} refuse nothing"),
        ("{w}: gold passage retrieved", "{w}: refuse to answer"),
    ]
    held_out_wording = ("the gold document on {w} came back", "no, I refuse {w} now")

    def pair(w: str, wording: tuple[str, str]) -> dict:
        return {"chosen": wording[0].format(w=w), "rejected": wording[1].format(w=w)}

    pairs = [pair(w, t) for w in words[:4] * 4 for t in train_wording]  # four entities
    held_out = [pair(w, held_out_wording) for w in words[4:]]  # two it never saw
    seen = set().union(*(trigrams(p[k]) for p in pairs for k in ("chosen", "rejected")))
    assert not any(trigrams(p[k]) & seen for p in held_out for k in ("chosen", "rejected"))
    train = write_pairs(pairs, tmp_path / "train.jsonl")
    val = write_pairs(held_out, tmp_path / "val.jsonl")
    module = RewardModelModule(encoder=TINY, single_head=single_head, lr=5e-2)
    trainer = L.Trainer(
        max_epochs=15,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=PairDataModule(str(train), str(val), batch_size=8))
    assert module.heads.out_features == (1 if single_head else 7)
    metrics = trainer.callback_metrics
    assert float(metrics["val/pair_accuracy"]) == 1.0 and float(metrics["val/loss"]) < math.log(2)
    scores = module.score([held_out[0]["chosen"], held_out[0]["rejected"]])
    assert scores[0] > scores[1]
