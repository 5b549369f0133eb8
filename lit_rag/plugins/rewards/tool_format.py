"""A shaping reward for tool agents: well-formed calls and an answer given through the answer tool.

Not a paper's reward. A small model that writes no well-formed call earns no outcome reward and
its groups carry no gradient (docs/agents-with-tools.md); this pays the form of the episode, so
a CPU recipe can learn the interface first. It reads the tool agent's :class:`ToolEpisode`:

- ``calls_ok``: 1 when the episode ran at least one call and every call it wrote was
  well-formed (none ``malformed``, ``unknown_tool`` or ``bad_arguments``);
- ``answered``: 1 when it ended through the answer tool.

``total = calls_ok_weight * calls_ok + answered_weight * answered``.
"""

from __future__ import annotations

import torch

from lit_rag.api import Reward, RewardBreakdown, ToolEpisode, Trajectory

#: the failures that mean the model wrote a call wrong (not the tool's own failures)
MALFORMED = ("malformed", "unknown_tool", "bad_arguments")


class ToolFormatReward(Reward):
    """Pays well-formed calls and an answer through the answer tool (module doc).

    Args:
        calls_ok_weight: Weight of ``calls_ok``.
        answered_weight: Weight of ``answered``.
    """

    def __init__(self, calls_ok_weight: float = 0.5, answered_weight: float = 0.5) -> None:
        self.weights = {"calls_ok": calls_ok_weight, "answered": answered_weight}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        episodes = [ToolEpisode.of(t, consumer="reward tool_format") for t in trajectories]
        calls_ok = torch.tensor(
            [
                float(sum(e.calls.values()) > 0 and not any(e.errors.get(k) for k in MALFORMED))
                for e in episodes
            ]
        )
        answered = torch.tensor([float(e.stop_reason == "answer") for e in episodes])
        total = self.weights["calls_ok"] * calls_ok + self.weights["answered"] * answered
        return RewardBreakdown(total=total, components={"calls_ok": calls_ok, "answered": answered})
