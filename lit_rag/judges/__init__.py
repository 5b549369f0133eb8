"""LLM judges: a model behind an OpenAI-compatible endpoint that scores answers, shared by the
``llm_judge`` reward and ``lit-rag evaluate``'s LJ metric (:mod:`lit_rag.judges.client`)."""

from lit_rag.judges.client import (
    ANSWER_JUDGE_PROMPT,
    JUDGE_SCORES,
    PROMPT_FIELDS,
    UNFINISHED,
    Judge,
    JudgeCase,
    Verdict,
    judge_signals,
    parse_number,
    parse_yes_no,
    read_reply,
    strip_reasoning,
)

__all__ = [
    "ANSWER_JUDGE_PROMPT",
    "JUDGE_SCORES",
    "PROMPT_FIELDS",
    "UNFINISHED",
    "Judge",
    "JudgeCase",
    "Verdict",
    "judge_signals",
    "parse_number",
    "parse_yes_no",
    "read_reply",
    "strip_reasoning",
]
