"""The synthetic multi-hop world: determinism, consistency of questions, answers and gold."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lit_rag.data import SyntheticWorld, generate_examples
from lit_rag.data.synthetic import RELATIONS


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld(seed=0)


@pytest.fixture(scope="module")
def examples(world: SyntheticWorld) -> list:
    return world.examples(300, hops=(2, 3, 4), num_distractors=6, seed=0)


def test_same_seed_same_world_and_examples(world: SyntheticWorld, examples: list) -> None:
    again = SyntheticWorld(seed=0)
    assert again.corpus() == world.corpus()
    assert again.examples(300, hops=(2, 3, 4), num_distractors=6, seed=0) == examples


def test_identical_in_a_fresh_interpreter() -> None:
    """No hash() or global random state: another process (other hash seed) draws the same."""
    code = (
        "import random; random.seed(99);"
        "from lit_rag.data import generate_examples;"
        "e = generate_examples(seed=3, n=5);"
        "print([x.question for x in e], [p.id for p in e[4].references])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    examples = generate_examples(seed=3, n=5)
    here = f"{[x.question for x in examples]} {[p.id for p in examples[4].references]}\n"
    assert run.stdout == here


def test_different_seeds_differ(world: SyntheticWorld, examples: list) -> None:
    other = SyntheticWorld(seed=1)
    assert [p.text for p in other.corpus()] != [p.text for p in world.corpus()]
    assert other.people != world.people
    redraw = world.examples(300, hops=(2, 3, 4), num_distractors=6, seed=1)
    assert {e.question for e in redraw} != {e.question for e in examples}


def test_gold_in_references_and_corpus(world: SyntheticWorld, examples: list) -> None:
    corpus = {p.id: p for p in world.corpus()}
    for ex in examples:
        ref_ids = [p.id for p in ex.references]
        assert len(set(ref_ids)) == len(ref_ids)
        assert set(ex.gold_ids) <= set(ref_ids)
        assert len(ex.references) == len(ex.gold_ids) + 6
        for passage in ex.references:
            assert corpus[passage.id] == passage


def test_answers_hops_and_last_hop_paragraph(world: SyntheticWorld, examples: list) -> None:
    corpus = {p.id: p for p in world.corpus()}
    for i, ex in enumerate(examples):
        k = (2, 3, 4)[i % 3]
        assert ex.meta == {"hops": k, "chain": ex.meta["chain"]}
        assert len(ex.meta["chain"]) == k and len(ex.gold_ids) == k
        assert all(rel in RELATIONS for rel in ex.meta["chain"])
        assert len(ex.answers) == 1 and ex.answers[0].strip()
        assert ex.answers[0] in corpus[ex.gold_ids[-1]].text
        assert ex.answers[0] not in ex.question
        assert ex.id == f"syn-0-{i}"


def test_question_texts_unique(examples: list) -> None:
    assert len({ex.question for ex in examples}) == len(examples)


def test_answer_follows_the_chain(world: SyntheticWorld, examples: list) -> None:
    """Re-walk each chain through the world's functions from the entity the question names."""
    facts = {f.passage.id: f for f in world.facts()}
    for ex in examples:
        first = facts[ex.gold_ids[0]]  # hop 1 links the named entity to the next one
        value = first.subject if first.subject in ex.question else first.object
        assert value in ex.question
        for rel, gold_id in zip(ex.meta["chain"], ex.gold_ids, strict=True):
            fact = facts[gold_id]
            assert value in (fact.subject, fact.object)  # each gold paragraph states its hop
            value = world.forward[rel][value]
        assert [value] == ex.answers


def test_paragraphs_are_short_single_sentences(world: SyntheticWorld) -> None:
    for passage in world.corpus():
        words = passage.text.split()
        assert 8 <= len(words) <= 25, passage.text
        assert passage.text.endswith(".") and passage.text.count(". ") == 0


def test_world_is_large_enough_for_thousands_of_questions(world: SyntheticWorld) -> None:
    drawn = world.examples(3000, hops=(2, 3), num_distractors=2, seed=5)
    assert len({ex.question for ex in drawn}) == 3000
    assert len(world.people) + len(world.orgs) + len(world.cities) + len(world.regions) >= 300


def test_exclude_questions_and_id_prefix(world: SyntheticWorld, examples: list) -> None:
    taken = {ex.question for ex in examples}
    fresh = world.examples(50, hops=(2, 3, 4), seed=0, exclude_questions=taken, id_prefix="v")
    assert not taken & {ex.question for ex in fresh}
    assert fresh[0].id == "v-0"


def test_distractors_share_entities_or_relations(world: SyntheticWorld, examples: list) -> None:
    """At least half the distractors mention a chain entity or repeat a chain relation."""
    facts = {f.passage.id: f for f in world.facts()}
    for ex in examples[:50]:
        gold = [facts[g] for g in ex.gold_ids]
        entities = {e for f in gold for e in (f.subject, f.object)}
        relations = {f.relation for f in gold}
        hard = [
            f
            for p in ex.references
            if p.id not in ex.gold_ids
            for f in [facts[p.id]]
            if f.subject in entities or f.object in entities or f.relation in relations
        ]
        assert len(hard) >= 3


def test_generate_examples_matches_world() -> None:
    assert generate_examples(seed=2, n=4, hops=(3,), num_distractors=1) == SyntheticWorld(
        seed=2
    ).examples(4, hops=(3,), num_distractors=1, seed=2)


@pytest.mark.parametrize("hops", [(), (5,), (0, 2)])
def test_bad_hops_rejected(world: SyntheticWorld, hops: tuple) -> None:
    with pytest.raises(ValueError, match="hops must be a non-empty list of values in 1..4"):
        world.examples(1, hops=hops)


def test_too_many_questions_for_a_tiny_world() -> None:
    tiny = SyntheticWorld(seed=0, num_people=4, num_organizations=2, num_places=2, num_regions=1)
    with pytest.raises(ValueError, match="too few distinct"):
        tiny.examples(500, hops=(4,))
