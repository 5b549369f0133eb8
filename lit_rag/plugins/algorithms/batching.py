"""Padding trajectories into one training batch (shared by every algorithm)."""

from __future__ import annotations

import torch

from lit_rag.types import Trajectory


def collate(trajectories: list[Trajectory], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad completions so all completions start at one column.

    Returns:
        ``input_ids`` and ``attention_mask`` ``[N, P + C]``; ``completion_mask`` ``[N, C]``
        (the trajectories' ``loss_mask``, 0 on padding); ``sampling_logprobs`` ``[N, C]``.
    """
    n = len(trajectories)
    prompt_width = max(int(t.prompt_ids.numel()) for t in trajectories)
    completion_width = max(1, max(int(t.completion_ids.numel()) for t in trajectories))
    input_ids = torch.full((n, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((n, completion_width), dtype=torch.float32)
    sampling = torch.zeros((n, completion_width), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        p, c = int(t.prompt_ids.numel()), int(t.completion_ids.numel())
        input_ids[row, prompt_width - p : prompt_width] = t.prompt_ids
        input_ids[row, prompt_width : prompt_width + c] = t.completion_ids
        attention[row, prompt_width - p : prompt_width + c] = 1
        completion_mask[row, :c] = t.loss_mask.float()
        sampling[row, :c] = t.sampling_logprobs.float()
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "completion_mask": completion_mask,
        "sampling_logprobs": sampling,
    }
