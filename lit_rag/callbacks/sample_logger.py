"""``RolloutSampleLogger``: prompts, completions and reward components to a JSONL file."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from lit_rag.contracts.step import StepOutput
from lit_rag.types import Trajectory


def completion_segments(trajectory: Trajectory, tokenizer) -> list[dict] | None:
    """The completion cut where ``loss_mask`` changes: ``[{"text", "inserted"}, ...]``.

    Each run of equal mask is decoded on its own (``inserted``: mask 0, text the environment
    put in, such as retrieved documents), so a reader can tell the policy's words from the
    documents it was shown. None when every token is the policy's (single-turn) or there is no
    tokenizer; runs that decode to nothing (special tokens only) are left out.

    Args:
        trajectory: The episode.
        tokenizer: The policy's tokenizer (``decode``), or None.
    """
    mask = trajectory.loss_mask
    if tokenizer is None or not bool((mask == 0).any()):
        return None
    ids, flags = trajectory.completion_ids.tolist(), (mask > 0).tolist()
    segments, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or flags[end] != flags[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=True)
            if text:
                segments.append({"text": text, "inserted": not flags[start]})
            start = end
    return segments


class RolloutSampleLogger(Callback):
    """Writes a few rollouts every ``every_n_steps`` training steps (rank zero only).

    One JSON object a line: ``step``, ``example_id``, ``group``, ``completion``, ``answers``,
    ``truncated``, ``reward``, ``components``; ``steps`` for tool-using environments;
    ``segments`` (:func:`completion_segments`) when the environment inserted tokens;
    ``prompt`` with ``include_prompt``. ``lit-rag report`` renders the file.

    Args:
        path: Output JSONL (default: ``<log_dir>/rollouts.jsonl``).
        every_n_steps: How often to write.
        max_per_step: Trajectories written per step (the first ones of the batch).
        include_prompt: Also write the prompt text.
    """

    def __init__(
        self,
        path: str | None = None,
        every_n_steps: int = 1,
        max_per_step: int = 4,
        include_prompt: bool = False,
    ) -> None:
        self.path = path
        self.every_n_steps = max(1, every_n_steps)
        self.max_per_step = max_per_step
        self.include_prompt = include_prompt
        self._calls = 0
        self._target: Path | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Trainer.log_dir is a collective (a broadcast): read here by every rank, never by rank
        # zero alone in on_train_batch_end
        self._target = self._default_target(trainer, trainer.log_dir)

    def _default_target(self, trainer: Trainer, log_dir: str | None = None) -> Path:
        if self.path:
            return Path(self.path)
        return Path(log_dir or trainer.default_root_dir) / "rollouts.jsonl"

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._calls += 1
        step = StepOutput.of(outputs)
        if step is None or not trainer.is_global_zero or (self._calls - 1) % self.every_n_steps:
            return
        trajectories, rewards = step.trajectories, step.rewards
        target = self._target or self._default_target(trainer)  # a step outside fit
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as f:
            for i, t in enumerate(trajectories[: self.max_per_step]):
                row = {
                    "step": trainer.global_step,
                    "example_id": t.example.id,
                    "group": t.group,
                    "completion": t.text,
                    "answers": t.example.answers,
                    "truncated": t.truncated,
                    "reward": float(rewards.total[i].sum()),
                    "components": {k: float(v[i].sum()) for k, v in rewards.components.items()},
                }
                if t.steps:  # tool-using environments: what the policy searched and found
                    row["steps"] = [
                        {"action": s.action, "query": s.query, "passage_ids": s.passage_ids}
                        for s in t.steps
                    ]
                segments = completion_segments(t, getattr(pl_module, "tokenizer", None))
                # multi-turn: inserted documents apart from the policy's text
                if segments is not None:
                    row["segments"] = segments
                if self.include_prompt:
                    row["prompt"] = t.prompt_text
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
