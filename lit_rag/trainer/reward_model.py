"""``RewardModelModule``: EVO-RAG's multi-head preference model (evo_rag.txt Section 3.3).

A frozen language model embeds each trajectory prefix (its last hidden state, pooled over the
prefix's tokens); ``K`` parallel linear heads (one per step-reward component, K = 7) score it.
Training minimizes the averaged pairwise logistic loss over preference pairs (x+, x-):

    L_RM = -1/K sum_k log sigmoid(f_k(x+) - f_k(x-))

which is DPO's loss with temperature 1 when the heads are tied: every head learns the overall
preference (x+ is the branch with the higher weighted return). That is the default
(``objective: overall``). ``single_head`` (K = 1) is the baseline "trained on the total reward"
the paper compares against (0.62 vs 0.71 validation loss), on the same objective.

Option, not in the paper: ``objective: per_component`` uses a pair's per-component signs
(``signs[k]`` = +1 when x+ is also better on component k, -1 when worse, 0 when tied): head k
then learns its own component's order and tied heads are left out of the pair's mean.

What the model reads (Section 3.3: it "embeds each trajectory prefix"): the branching state's
prompt and the action taken there (:func:`trajectory_text`, ``view="prefix"``); the older
``view="branch"`` adds the rest of the branch after that action.

Pairs are read from JSONL (``{"chosen": text, "rejected": text, "signs": [..]?}``), written by
:func:`write_pairs` from the policy loop's sibling branches. ``score`` ranks trajectories for
pair selection inside the policy loop (sum of the heads).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lit_rag.models.loading import ModelConfig, load_model, load_tokenizer
from lit_rag.types import Branch, RewardBreakdown, Trajectory

POOLING = ("mean", "last")
OBJECTIVES = ("overall", "per_component")
VIEWS = ("prefix", "branch")


def pairwise_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, signs: torch.Tensor | None = None
) -> torch.Tensor:
    """``-mean_k log sigmoid(s_k * (f_k(x+) - f_k(x-)))`` averaged over pairs; scores ``[P, K]``.

    Heads whose sign is 0 for a pair are left out of that pair's mean.
    """
    diff = chosen - rejected  # [P, K]
    if signs is None:
        return -F.logsigmoid(diff).mean()
    weight = signs.abs()
    per = -F.logsigmoid(diff * signs) * weight
    return (per.sum(-1) / weight.sum(-1).clamp(min=1)).mean()


def read_pairs(path: str | Path) -> list[dict]:
    """Preference pairs from JSONL; a row missing ``chosen`` or ``rejected`` is a one-line error."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:  # a BOM (Windows editors) is not JSON
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("chosen", "rejected") if not isinstance(row.get(k), str)]
            if missing:
                raise ValueError(
                    f"{path}:{line_no}: preference pair lacks {', '.join(missing)} (text fields)"
                )
            rows.append(row)
    return rows


def write_pairs(pairs: list[dict], path: str | Path) -> Path:
    """Write pairs (``chosen``, ``rejected`` texts, optional ``signs``, ``margin``) as JSONL."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in pairs:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _step_text(step) -> str:
    return f"{step.action}: {step.query or step.text or ''}"


def trajectory_text(trajectory: Trajectory, view: str = "prefix") -> str:
    """What the reward model reads (Section 3.3, "embeds each trajectory prefix").

    ``prefix``: the branching state's prompt (the question, the kept sub-queries and their
    documents) and the action taken at that state, ``x = (s_t, a_t)``: what siblings differ in.
    ``branch``: the same, then every later step of the branch (its outcome; not the paper's).
    """
    branch = Branch.find(trajectory, "the EVO-RAG reward model")
    start = 0 if branch is None else branch.step
    steps = trajectory.steps[start : start + 1] if view == "prefix" else trajectory.steps[start:]
    return f"{trajectory.prompt_text}\n" + "\n".join(_step_text(s) for s in steps)


def sibling_pairs(
    trajectories: list[Trajectory],
    rewards: RewardBreakdown,
    threshold: float = 0.3,
    view: str = "prefix",
) -> list[dict]:
    """Reward-model pairs (Section 3.3): every ordered pair of siblings at one state (the same
    :class:`~lit_rag.types.Branch` state, else the same prompt group) that took different
    actions there and whose weighted returns differ by at least ``threshold`` (Delta = 0.3).

    Each row has ``chosen`` / ``rejected`` texts (:func:`trajectory_text` with ``view``),
    ``margin`` (the return gap), ``signs`` (per component, +1 when the chosen branch's summed
    component is higher, -1 lower, 0 equal; the order of ``rewards.components``; read only by
    the ``per_component`` objective) and ``question``.
    """
    total = rewards.total.float()
    returns = total.sum(-1) if total.dim() == 2 else total
    per_component = [
        v.float().sum(-1) if v.dim() == 2 else v.float() for v in rewards.components.values()
    ]
    states: dict[tuple[str, object], list[int]] = {}
    for i, t in enumerate(trajectories):
        branch = Branch.find(t, "the EVO-RAG reward model")
        states.setdefault((t.example.id, t.group if branch is None else branch.state), []).append(i)
    rows = []
    for members in states.values():
        for a in members:
            for b in members:
                gap = float(returns[a] - returns[b])
                if (
                    a != b
                    and gap >= threshold
                    and not trajectories[a].same_completion(trajectories[b])
                ):
                    rows.append(
                        {
                            "chosen": trajectory_text(trajectories[a], view),
                            "rejected": trajectory_text(trajectories[b], view),
                            "margin": gap,
                            "signs": [float(torch.sign(c[a] - c[b])) for c in per_component],
                            "question": trajectories[a].example.id,
                        }
                    )
    return rows


class PairDataModule(L.LightningDataModule):
    """Preference pairs from JSONL files.

    Args:
        train: Training pairs (JSONL).
        val: Validation pairs (JSONL), or None.
        batch_size: Pairs per batch.
    """

    def __init__(self, train: str, val: str | None = None, batch_size: int = 16) -> None:
        super().__init__()
        self.train, self.val, self.batch_size = train, val, batch_size

    def _loader(self, path: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            read_pairs(path),
            batch_size=self.batch_size,
            shuffle=shuffle,  # type: ignore[arg-type]
            collate_fn=lambda rows: rows,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train, shuffle=True)

    def val_dataloader(self):
        return self._loader(self.val, shuffle=False) if self.val else []


class RewardModelModule(L.LightningModule):
    """Frozen encoder with ``heads`` linear heads trained on preference pairs.

    Args:
        encoder: The frozen language model (any local causal LM; its last hidden state).
        heads: Number of heads (7: one per EVO-RAG reward component).
        single_head: One head (the total-reward baseline); overrides ``heads``.
        objective: ``overall`` (every head learns the overall preference: the paper's L_RM) or
            ``per_component`` (head k learns component k's order from the pair's signs).
        pooling: ``mean`` over the prefix's tokens or the ``last`` token.
        max_length: Tokens kept from the end of each trajectory prefix.
        lr: AdamW learning rate of the heads.
    """

    def __init__(
        self,
        encoder: ModelConfig,
        heads: int = 7,
        single_head: bool = False,
        objective: str = "overall",
        pooling: str = "mean",
        max_length: int = 512,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(
                f"reward model pooling '{pooling}' is not known; allowed: {', '.join(POOLING)}"
            )
        if objective not in OBJECTIVES:
            raise ValueError(
                f"reward model objective '{objective}' is not known; "
                f"allowed: {', '.join(OBJECTIVES)}"
            )
        self.objective = objective
        self.encoder_config = encoder
        self.num_heads = 1 if single_head else heads
        self.pooling, self.max_length, self.lr = pooling, max_length, lr
        self._encoder: list[torch.nn.Module] = []  # frozen: outside the module tree and checkpoints
        self.tokenizer = None
        self.heads: torch.nn.Linear | None = None
        self.strict_loading = False

    def configure_model(self) -> None:
        if self.heads is not None:
            return
        self.tokenizer = load_tokenizer(self.encoder_config)
        self.tokenizer.truncation_side = "left"  # keep the end of the prefix
        encoder = load_model(self.encoder_config).eval()
        encoder.requires_grad_(False)
        self._encoder = [encoder]
        hidden = encoder.config.hidden_size
        self.heads = torch.nn.Linear(hidden, self.num_heads)

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """``[N, H]`` pooled last hidden states of the frozen encoder."""
        encoder = self._encoder[0]
        if self.heads is not None and next(encoder.parameters()).device != self.heads.weight.device:
            encoder.to(self.heads.weight.device)
        device = next(encoder.parameters()).device
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        )
        ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        hidden = (
            encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            .hidden_states[-1]
            .float()
        )
        if self.pooling == "last":  # left padding: the last column is every row's last token
            return hidden[:, -1]
        m = mask.unsqueeze(-1).float()
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)

    def forward(self, texts: list[str]) -> torch.Tensor:
        """``[N, K]`` head scores."""
        return self.heads(self.embed(texts).to(self.heads.weight.device))

    def score(self, texts: list[str]) -> torch.Tensor:
        """``[N]`` preference score (sum of the heads) for ranking trajectories."""
        with torch.no_grad():
            return self(texts).sum(-1)

    def _pair_step(self, batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = self([row["chosen"] for row in batch])
        rejected = self([row["rejected"] for row in batch])
        signs = None
        if self.objective == "per_component" and self.num_heads > 1:
            missing = sum("signs" not in row for row in batch)
            if missing:
                raise ValueError(
                    "reward model objective per_component needs 'signs' in every pair; "
                    f"{missing} lack it"
                )
            signs = torch.tensor(
                [row["signs"] for row in batch], dtype=torch.float32, device=chosen.device
            )
        loss = pairwise_loss(chosen, rejected, signs)
        accuracy = ((chosen.sum(-1) - rejected.sum(-1)) > 0).float().mean()
        return loss, accuracy

    def training_step(self, batch: list[dict], batch_idx: int) -> torch.Tensor:
        loss, accuracy = self._pair_step(batch)
        self.log("train/loss", loss, batch_size=len(batch), prog_bar=True)
        self.log("train/pair_accuracy", accuracy, batch_size=len(batch))
        return loss

    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        loss, accuracy = self._pair_step(batch)
        self.log("val/loss", loss, batch_size=len(batch), on_epoch=True, prog_bar=True)
        self.log("val/pair_accuracy", accuracy, batch_size=len(batch), on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.heads.parameters(), lr=self.lr)

    # heads only: the encoder reloads from its path
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if k.startswith("heads.")
        }
