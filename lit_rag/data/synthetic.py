"""A deterministic, seedable synthetic multi-hop world: the bundled quickstart and test data.

The world holds fictional people, organizations, cities and regions with made-up names built
from syllables, plus functional relations between them (every question follows relations that
have exactly one value, so its answer is determined by the world). Each relation fact is one
short paragraph, e.g. ``"Brelan Tosik founded Varmo Works."``. Questions follow chains of 2-4
relations: ``"In which region is the city where the founder of Varmo Works was born?"``.

Everything is drawn from ``random.Random`` instances seeded with ints or strings (string seeds
are hashed with SHA-512 by ``random``, not with ``hash()``), so a seed gives the same world and
the same questions in every process and Python run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lit_rag.types import Example, Passage

_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "st",
    "tr",
)
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "l", "s", "m")
_CITY_SUFFIXES = ("ford", "holm", "by", "ton", "mere", "wick", "stead", "dale", "port", "gate")
_REGION_SUFFIXES = ("ia", "land", "mark", "ora")
_ORG_KINDS = ("Works", "Press", "Guild", "Company", "Mills", "Foundry", "Institute", "Society")
_OCCUPATIONS = (
    "painter",
    "weaver",
    "sailor",
    "potter",
    "baker",
    "scholar",
    "miner",
    "poet",
    "architect",
    "surgeon",
    "merchant",
    "composer",
    "farmer",
    "astronomer",
    "judge",
    "engineer",
    "chemist",
    "sculptor",
)
_PRODUCTS = (
    "clocks",
    "lamps",
    "ropes",
    "boats",
    "maps",
    "glass",
    "paper",
    "bells",
    "bicycles",
    "violins",
    "telescopes",
    "cheese",
    "textiles",
    "engines",
    "radios",
)

# relation -> (subject type, object type, noun phrase of the object, final question)
# "{x}" is the noun phrase of the subject. Object type None means a literal (year, word).
RELATIONS: dict[str, tuple[str, str | None, str, str]] = {
    "born_in": ("person", "city", "the city where {x} was born", "In which city was {x} born?"),
    "mentored_by": ("person", "person", "the mentor of {x}", "Who mentored {x}?"),
    "married_to": ("person", "person", "the spouse of {x}", "Who is {x} married to?"),
    "works_for": ("person", "org", "the employer of {x}", "Which organization does {x} work for?"),
    "founded": (
        "person",
        "org",
        "the organization founded by {x}",
        "Which organization did {x} found?",
    ),
    "occupation": ("person", None, "", "What is the occupation of {x}?"),
    "founded_by": ("org", "person", "the founder of {x}", "Who founded {x}?"),
    "headquartered_in": (
        "org",
        "city",
        "the city where {x} is headquartered",
        "In which city is {x} headquartered?",
    ),
    "founded_in": ("org", None, "", "In which year was {x} founded?"),
    "makes": ("org", None, "", "What does {x} make?"),
    "located_in": ("city", "region", "the region containing {x}", "In which region is {x}?"),
}

# Paragraph templates per fact kind; {s} subject, {o} object, {a} its article. One sentence
# each, and no paragraph mentions a fact other than its own, so the gold set is exact.
_TEXTS: dict[str, tuple[str, ...]] = {
    "born_in": (
        "{s} was born in the city of {o} and spent a quiet childhood there.",
        "{s} was born in {o}, where the family had lived for generations.",
    ),
    "mentored_by": (
        "In the early years of a long career, {s} was mentored by {o}.",
        "{s} learned the trade while being mentored by {o} for several years.",
    ),
    "married_to": (
        "{s} is married to {o}, and the couple met at a winter market.",
        "After a long friendship, {s} married {o} in a small ceremony.",
    ),
    "works_for": (
        "{s} works for {o} and is known there as a careful worker.",
        "For many years, {s} has worked for {o} without missing a day.",
    ),
    "founded": (
        "{s} founded {o} after years of careful planning and saving.",
        "{s} founded {o} with a small loan from an old friend.",
    ),
    "occupation": (
        "{s} works as {a} {o} and is respected by many neighbours.",
        "By profession, {s} is {a} {o} with a long and steady career.",
    ),
    "headquartered_in": (
        "{s} has its headquarters in {o}, near the old market square.",
        "The headquarters of {s} stand in the city of {o}.",
    ),
    "founded_in": (
        "{s} was founded in {o} and has grown steadily ever since.",
        "Records show that {s} was founded in the year {o}.",
    ),
    "makes": (
        "{s} makes {o} for customers in every corner of the land.",
        "Today {s} is best known because it makes fine {o}.",
    ),
    "located_in": (
        "{s} is a city in the region of {o}, close to a wide river.",
        "The city of {s} lies in {o}, surrounded by green hills.",
    ),
}


@dataclass(frozen=True)
class Fact:
    """One relation fact, stored as a paragraph.

    Args:
        relation: Relation kind as stored (``founded``, not its inverse ``founded_by``).
        subject: Subject entity name (the paragraph title).
        object: Object entity name or literal value.
        passage: The paragraph that states it.
    """

    relation: str
    subject: str
    object: str
    passage: Passage


class SyntheticWorld:
    """A fictional world of people, organizations, cities and regions with functional relations.

    Args:
        seed: Seed of the world (names, relations, paragraph wording).
        num_people: Number of people.
        num_organizations: Number of organizations (each has exactly one founder).
        num_places: Number of cities.
        num_regions: Number of regions (cities lie in them).
        mentor_fraction: Share of people who have a mentor.
        married_fraction: Share of people who are married (to one other person).
        employed_fraction: Share of people who work for an organization.

    Example:
        >>> world = SyntheticWorld(seed=0)
        >>> ex = world.examples(1, hops=(2,), seed=0)[0]
        >>> ex.meta["hops"], len(ex.gold_ids)
        (2, 2)
    """

    def __init__(
        self,
        seed: int = 0,
        num_people: int = 240,
        num_organizations: int = 80,
        num_places: int = 60,
        num_regions: int = 12,
        mentor_fraction: float = 0.8,
        married_fraction: float = 0.5,
        employed_fraction: float = 0.8,
    ) -> None:
        if num_people < 4 or num_organizations < 2 or num_places < 2 or num_regions < 1:
            raise ValueError(
                "SyntheticWorld needs num_people >= 4, num_organizations >= 2, num_places >= 2 "
                f"and num_regions >= 1; got {num_people}, {num_organizations}, {num_places}, "
                f"{num_regions}"
            )
        if num_organizations > num_people:
            raise ValueError(
                f"num_organizations ({num_organizations}) must be <= num_people ({num_people}): "
                "every organization has its own founder"
            )
        self.seed = seed
        self._rng = random.Random(f"lit-rag-world-{seed}")
        self._names: set[str] = set()
        self.regions = [self._name(_REGION_SUFFIXES, 2) for _ in range(num_regions)]
        self.cities = [self._name(_CITY_SUFFIXES, 1) for _ in range(num_places)]
        self.orgs = [self._org_name() for _ in range(num_organizations)]
        self.people = [self._person_name() for _ in range(num_people)]
        # forward[relation][subject] -> object; every relation here is a function
        self.forward: dict[str, dict[str, str]] = {name: {} for name in RELATIONS}
        self._facts: list[Fact] = []
        self._fact_of: dict[tuple[str, str], Fact] = {}  # (relation, subject) -> fact
        self._build(mentor_fraction, married_fraction, employed_fraction)

    # ------------------------------------------------------------------ names

    def _syllable(self) -> str:
        rng = self._rng
        return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            if name not in self._names:
                self._names.add(name)
                return name
        raise RuntimeError("could not draw a fresh name; the world is too large for its syllables")

    def _name(self, suffixes: Sequence[str], syllables: int) -> str:
        def make() -> str:
            stem = "".join(self._syllable() for _ in range(syllables))
            return (stem + self._rng.choice(suffixes)).capitalize()

        return self._unique(make)

    def _org_name(self) -> str:
        def make() -> str:
            stem = (self._syllable() + self._syllable()).capitalize()
            return f"{stem} {self._rng.choice(_ORG_KINDS)}"

        return self._unique(make)

    def _person_name(self) -> str:
        def make() -> str:
            first = (self._syllable() + self._syllable()).capitalize()
            last = (self._syllable() + self._syllable()).capitalize()
            return f"{first} {last}"

        return self._unique(make)

    # ------------------------------------------------------------------ relations

    def _build(
        self, mentor_fraction: float, married_fraction: float, employed_fraction: float
    ) -> None:
        rng = self._rng
        for city in self.cities:
            self._add("located_in", city, rng.choice(self.regions))
        for person in self.people:
            self._add("occupation", person, rng.choice(_OCCUPATIONS))
            self._add("born_in", person, rng.choice(self.cities))
        founders = rng.sample(self.people, len(self.orgs))
        for org, founder in zip(self.orgs, founders, strict=True):
            self._add("founded", founder, org)
            self._add("headquartered_in", org, rng.choice(self.cities))
            self._add("founded_in", org, str(rng.randint(1820, 1990)))
            self._add("makes", org, rng.choice(_PRODUCTS))
        # mentors come from earlier in the list: the mentor graph has no cycles
        for i, person in enumerate(self.people[1:], start=1):
            if rng.random() < mentor_fraction:
                self._add("mentored_by", person, self.people[rng.randrange(i)])
        for person in self.people:
            if rng.random() < employed_fraction:
                self._add("works_for", person, rng.choice(self.orgs))
        singles = [p for p in self.people if rng.random() < married_fraction]
        rng.shuffle(singles)
        # an odd one out stays single
        for a, b in zip(singles[0::2], singles[1::2], strict=False):
            self._add("married_to", a, b)

    def _add(self, relation: str, subject: str, obj: str) -> None:
        template = self._rng.choice(_TEXTS[relation])
        article = "an" if obj[:1] in "aeiou" else "a"
        text = template.format(s=subject, o=obj, a=article)
        text = text[0].upper() + text[1:]
        passage = Passage(id=f"w{len(self._facts)}", title=subject, text=text)
        fact = Fact(relation, subject, obj, passage)
        self._facts.append(fact)
        self._fact_of[(relation, subject)] = fact
        self.forward[relation][subject] = obj
        if relation == "founded":
            self.forward["founded_by"][obj] = subject
            self._fact_of[("founded_by", obj)] = fact
        elif relation == "married_to":
            self.forward["married_to"][obj] = subject
            self._fact_of[("married_to", obj)] = fact

    # ------------------------------------------------------------------ public API

    def corpus(self) -> list[Passage]:
        """Every paragraph of the world, in id order (a retrieval corpus)."""
        return [fact.passage for fact in self._facts]

    def facts(self) -> list[Fact]:
        """Every fact of the world, in id order."""
        return list(self._facts)

    def entity_type(self, name: str) -> str | None:
        """``person``, ``org``, ``city``, ``region`` or None for a literal / unknown name."""
        for kind, names in (
            ("person", self.people),
            ("org", self.orgs),
            ("city", self.cities),
            ("region", self.regions),
        ):
            if name in names:
                return kind
        return None

    def examples(
        self,
        n: int,
        hops: Sequence[int] = (2, 3, 4),
        num_distractors: int = 6,
        seed: int = 0,
        exclude_questions: set[str] | None = None,
        id_prefix: str | None = None,
    ) -> list[Example]:
        """Draw ``n`` multi-hop questions with distinct texts.

        Hop counts cycle through ``hops`` (example ``i`` has ``hops[i % len(hops)]`` hops).

        Args:
            n: Number of examples.
            hops: Allowed hop counts, each between 1 and 4.
            num_distractors: Non-gold paragraphs added to each example's references.
            seed: Seed of the question draw (the world keeps its own seed).
            exclude_questions: Question texts that must not be drawn (e.g. a training split).
            id_prefix: Prefix of the example ids; default ``syn-{seed}`` (ids ``syn-{seed}-{i}``).

        Returns:
            ``n`` examples: references are gold plus distractor paragraphs in a seeded order,
            ``meta = {"hops": k, "chain": [relation names]}``.

        Raises:
            ValueError: ``hops`` holds a value outside 1..4, or the world cannot supply ``n``
                distinct questions.
        """
        hops = list(hops)
        if not hops or any(k not in (1, 2, 3, 4) for k in hops):
            raise ValueError(f"hops must be a non-empty list of values in 1..4; got {hops}")
        if num_distractors < 0:
            raise ValueError(f"num_distractors must be >= 0; got {num_distractors}")
        rng = random.Random(f"lit-rag-examples-{self.seed}-{seed}")
        prefix = f"syn-{seed}" if id_prefix is None else id_prefix
        seen = set(exclude_questions or ())
        out: list[Example] = []
        attempts = 0
        while len(out) < n:
            k = hops[len(out) % len(hops)]
            attempts += 1
            if attempts > 200 * n + 1000:
                raise ValueError(
                    f"the world (seed {self.seed}) yields too few distinct {k}-hop questions for "
                    f"n={n}; draw fewer or build a larger SyntheticWorld"
                )
            chain = self._walk(rng, k)
            if chain is None:
                continue
            question = self._question(chain)
            if question in seen:
                continue
            seen.add(question)
            out.append(self._example(f"{prefix}-{len(out)}", question, chain, num_distractors, rng))
        return out

    # ------------------------------------------------------------------ question drawing

    def _walk(self, rng: random.Random, k: int) -> list[tuple[str, str, str]] | None:
        """A random chain of ``k`` relation steps ``(relation, subject, object)`` or None.

        Entities along the chain are distinct (no "the spouse of the spouse of X"); literal
        relations (year, occupation, product) only end a chain.
        """
        kind = rng.choice(("person", "person", "person", "org", "city"))
        pool = {"person": self.people, "org": self.orgs, "city": self.cities}[kind]
        current = rng.choice(pool)
        visited = {current}
        chain: list[tuple[str, str, str]] = []
        for step in range(k):
            last = step == k - 1
            options = [
                rel
                for rel, (subj, obj, _, _) in RELATIONS.items()
                if subj == kind
                and current in self.forward[rel]
                and (last or obj not in (None, "region"))
                and self.forward[rel][current] not in visited
            ]
            if not options:
                return None
            rel = rng.choice(options)
            value = self.forward[rel][current]
            chain.append((rel, current, value))
            visited.add(value)
            kind, current = RELATIONS[rel][1] or "literal", value
        return chain

    @staticmethod
    def _question(chain: list[tuple[str, str, str]]) -> str:
        phrase = chain[0][1]
        for rel, _, _ in chain[:-1]:
            phrase = RELATIONS[rel][2].format(x=phrase)
        return RELATIONS[chain[-1][0]][3].format(x=phrase)

    def _example(
        self,
        example_id: str,
        question: str,
        chain: list[tuple[str, str, str]],
        num_distractors: int,
        rng: random.Random,
    ) -> Example:
        gold = [self._fact_of[(rel, subj)].passage for rel, subj, _ in chain]
        distractors = self._distractors(chain, gold, num_distractors, rng)
        references = gold + distractors
        rng.shuffle(references)
        return Example(
            id=example_id,
            question=question,
            answers=[chain[-1][2]],
            references=references,
            gold_ids=[p.id for p in gold],
            meta={"hops": len(chain), "chain": [rel for rel, _, _ in chain]},
        )

    def _distractors(
        self,
        chain: list[tuple[str, str, str]],
        gold: list[Passage],
        count: int,
        rng: random.Random,
    ) -> list[Passage]:
        """Hard distractors first: paragraphs about chain entities, then same-relation ones.

        A distractor about the same entity (its other relations) or stating the same relation
        for another entity cannot be told apart from gold by topic alone.
        """
        gold_ids = {p.id for p in gold}
        entities = {e for _, subj, obj in chain for e in (subj, obj)}
        relations = {self._fact_of[(rel, subj)].relation for rel, subj, _ in chain}
        near, same_rel, rest = [], [], []
        for fact in self._facts:
            if fact.passage.id in gold_ids:
                continue
            if fact.subject in entities or fact.object in entities:
                near.append(fact.passage)
            elif fact.relation in relations:
                same_rel.append(fact.passage)
            else:
                rest.append(fact.passage)
        picked: list[Passage] = []
        half = (count + 1) // 2
        for group, quota in ((near, half), (same_rel, count), (rest, count)):
            need = min(quota, count - len(picked), len(group))
            picked += rng.sample(group, need)
        return picked


def generate_examples(
    seed: int = 0,
    n: int = 100,
    hops: Sequence[int] = (2, 3, 4),
    num_distractors: int = 6,
) -> list[Example]:
    """Examples from the default-sized :class:`SyntheticWorld` of ``seed``.

    Args:
        seed: Seed of both the world and the question draw.
        n: Number of examples.
        hops: Allowed hop counts (cycled).
        num_distractors: Non-gold paragraphs per example.

    Returns:
        ``n`` examples with ids ``syn-{seed}-{i}``.
    """
    world = SyntheticWorld(seed=seed)
    return world.examples(n, hops=hops, num_distractors=num_distractors, seed=seed)
