"""An LLM judge as the reward: the policy's final answer is right when a judge model says so.

No paper's reward; ARENA's LJ metric (Appendix C.3) made a training signal. Each trajectory's
question (``example.question``), gold answers (``example.answers``) and the policy's final
answer (a tool agent's answer, else the last ``<answer>`` block of what it wrote,
:func:`~lit_rag.api.final_answer`) go to a
:class:`~lit_rag.api.Judge` behind an OpenAI-compatible endpoint (``vllm serve``, OpenAI's API).

What we decide:

- An episode without an answer scores 0 and is not asked (as the exact-match rewards): the
  policy's fault, trained on as any other 0.
- The judge's reply is untrusted text, read by a regular expression after its reasoning block
  (a thinking judge's ``<think>...</think>``). A judge that gives no verdict (a call that fails
  after the client's retries, a reply without a score, a reply cut off inside its reasoning)
  says nothing about the policy: the sample is marked failed (``RewardBreakdown.failed``) and
  leaves the loss and its group's baseline (``model.environment_failures: drop``, the
  default); under ``keep`` it is trained on with ``failure_reward``. The step goes on; one
  stderr line per step says how many failed and the first reason.
- Identical prompts are asked once (a prompt group often repeats an answer) and verdicts are
  cached across steps (``cache_size``).

Components (each logged as ``reward/<name>``, the mean over the step's samples):
``judge`` (the score, ``failure_reward`` on failure; the only one in ``total``), and, as R2AG's
``zeroed`` is, per-sample flags that only measure: ``judge_failures`` (1 where the judge failed:
its mean is the failure share, the count is share x samples), ``judge_at_0`` and ``judge_at_1``
(1 where the judge's score is exactly 0 / 1; 0 for an episode without an answer).
:meth:`LLMJudgeReward.metrics` gives the last step's exact values (the failure count, the mean
and spread of the scores the judge gave).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from lit_rag.api import (
    ANSWER_JUDGE_PROMPT,
    Judge,
    JudgeCase,
    Reward,
    RewardBreakdown,
    ToolEpisode,
    Trajectory,
    Verdict,
    final_answer,
    judge_signals,
)


class LLMJudgeReward(Reward):
    """``total = weight * judge score``; the score is in [0, 1] (``failure_reward`` on failure).

    Example:
        Question "Capital of France?", answers ``["Paris"]``: the policy writes
        ``"<think>..</think><answer>paris, France</answer>"``; the judge gets the default prompt
        with ``Model's answer: paris, France`` and replies ``"Yes."`` -> judge 1.0, total
        1.0 * 1.0 = 1.0; so does ``"<think>Is it no? It names Paris.</think>Yes."``. A reply
        ``"I cannot tell"`` (no yes / no), a timed-out call or a reply cut off inside its
        ``<think>`` -> ``failed`` True, judge = ``failure_reward`` 0.0, ``judge_failures`` 1,
        and one stderr line for the step. No ``<answer>`` -> judge 0.0, ``failed`` False.

    Args:
        base_url: The judge's endpoint (``.../v1``; ``vllm serve`` -> ``http://127.0.0.1:8000/v1``).
        model: The judge model's name at the endpoint.
        api_key_env: Environment variable holding the key (unset: ``EMPTY``, for a local server).
        prompt: Template naming ``{response}`` (the policy's answer) and any of ``{question}``,
            ``{answers}`` (the gold answers, a JSON list).
        score: ``yes_no`` (the first yes / no word: 1 / 0) or ``number`` (the first number, over
            ``max_score``, clipped to [0, 1]).
        max_score: The top of the ``number`` scale.
        max_tokens: The judge's reply budget, its reasoning included (1024 leaves a thinking
            judge room; a reply cut off inside its reasoning has no verdict).
        temperature: The judge's sampling temperature.
        timeout_s: Seconds per request.
        retries: Retries per request (with the openai client's back-off).
        max_concurrency: Requests in flight at once.
        cache_size: Verdicts kept across steps (0: none).
        chat_template_kwargs: Keyword arguments for the judge's chat template, sent as vLLM
            and SGLang take them: ``{enable_thinking: false}`` turns a Qwen3 judge's reasoning
            off.
        extra_body: More request fields, merged into the body (``top_p``, vLLM's
            ``structured_outputs``); not model, messages, max_tokens or temperature.
        template_opens_think: The judge's chat template opens ``<think>`` in the prompt (QwQ,
            DeepSeek-R1, Qwen3 Thinking-2507): a reply without ``</think>`` is unfinished.
        answer_tag: Tag of the final answer; ``None``: the whole of what the policy wrote.
        weight: Multiplies the judge score in ``total``.
        failure_reward: The score of a sample the judge gave no verdict on; it counts only
            under ``model.environment_failures: keep`` (``drop`` leaves the sample out).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        prompt: str = ANSWER_JUDGE_PROMPT,
        score: str = "yes_no",
        max_score: float = 10.0,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        timeout_s: float = 60.0,
        retries: int = 2,
        max_concurrency: int = 8,
        cache_size: int = 4096,
        chat_template_kwargs: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        template_opens_think: bool = False,
        answer_tag: str | None = "answer",
        weight: float = 1.0,
        failure_reward: float = 0.0,
    ) -> None:
        self.judge = Judge(
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            prompt=prompt,
            score=score,
            max_score=max_score,
            max_tokens=max_tokens,
            temperature=temperature,
            timeout_s=timeout_s,
            retries=retries,
            max_concurrency=max_concurrency,
            cache_size=cache_size,
            chat_template_kwargs=chat_template_kwargs,
            extra_body=extra_body,
            template_opens_think=template_opens_think,
        )
        self.answer_tag, self.failure_reward = answer_tag, failure_reward
        self.weights = {"judge": weight}
        self.last_verdicts: list[Verdict] = []

    def answer(self, trajectory: Trajectory) -> str:
        """The policy's final answer ("" without one): a tool agent's (its answer tool's
        argument, :class:`~lit_rag.api.ToolEpisode`), else the ``answer_tag`` block."""
        episode = ToolEpisode.find(trajectory, "reward llm_judge")
        if episode is not None:
            return (episode.answer or "").strip()
        if not self.answer_tag:
            return trajectory.policy_text.strip()
        return (final_answer(trajectory, self.answer_tag) or "").strip()

    def verdicts(self, trajectories: list[Trajectory]) -> list[Verdict | None]:
        """The judge's verdict on each trajectory's answer (``None``: no answer, not asked)."""
        answers = [self.answer(t) for t in trajectories]
        asked = [i for i, a in enumerate(answers) if a]
        cases = [
            JudgeCase(
                trajectories[i].example.question, list(trajectories[i].example.answers), answers[i]
            )
            for i in asked
        ]
        out: list[Verdict | None] = [None] * len(trajectories)
        for i, verdict in zip(asked, self.judge.scores(cases), strict=True):
            out[i] = verdict
        return out

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Ask the judge about each trajectory's answer; a sample without a verdict is
        ``failed`` and pays ``failure_reward``."""
        verdicts = self.verdicts(trajectories)
        self.last_verdicts = [v for v in verdicts if v is not None]
        report_failures(self.last_verdicts, self.judge.model, self.failure_reward)

        def flags(rule) -> torch.Tensor:  # [N]; 0 where the judge was not asked
            return torch.tensor([float(v is not None and rule(v)) for v in verdicts])

        components = {
            "judge": torch.tensor([self.value(v) for v in verdicts], dtype=torch.float32),  # [N]
            "judge_failures": flags(lambda v: v.score is None),
            "judge_at_0": flags(lambda v: v.score == 0.0),
            "judge_at_1": flags(lambda v: v.score == 1.0),
        }
        return RewardBreakdown(
            total=self.weights["judge"] * components["judge"],
            components=components,
            failed=components["judge_failures"].bool(),  # [N]; asked, no verdict
        )

    def value(self, verdict: Verdict | None) -> float:
        """A sample's judge component: 0 without an answer, ``failure_reward`` on failure."""
        if verdict is None:
            return 0.0
        return self.failure_reward if verdict.score is None else verdict.score

    def metrics(self) -> dict[str, torch.Tensor]:
        """The last step's judge signals (:func:`~lit_rag.api.judge_signals`) as ``judge/<name>``:
        ``failures`` (a count), ``score_mean``, ``score_std``, ``score_at_0``, ``score_at_1``
        (over the samples the judge scored; an episode without an answer is not asked)."""
        return {f"judge/{k}": torch.tensor(v) for k, v in judge_signals(self.last_verdicts).items()}


def report_failures(verdicts: list[Verdict], model: str, failure_reward: float) -> None:
    """One stderr line when the judge gave no verdict on some of a step's answers: how many,
    the first reason."""
    failed = [v for v in verdicts if v.score is None]
    if failed:
        print(
            f"lit-rag reward llm_judge: {len(failed)}/{len(verdicts)} judge verdict(s) failed "
            f"(first: {failed[0].error}); judge {model}; marked failed: they leave the loss "
            f"(model.environment_failures: drop) or score failure_reward {failure_reward} (keep)",
            file=sys.stderr,
            flush=True,
        )
