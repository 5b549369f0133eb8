"""How ``lit-rag data`` samples each file of a paper from its sources (the rules are in
:mod:`lit_rag.data.prepare.command`'s docstring): one permutation per source, test files
first, then val, then train, evaluation questions held out of training."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from lit_rag.data.papers import DataFile, Paper, Take
from lit_rag.data.prepare.sources import Loaded
from lit_rag.types import Example

_PUNCT = re.compile(r"[^\w\s]")


def question_key(question: str) -> str:
    """A question as duplicates are found: lower case, punctuation gone, spaces collapsed.

    >>> question_key("Who wrote  'Hamlet'?")
    'who wrote hamlet'
    """
    return " ".join(_PUNCT.sub(" ", question.lower()).split())


def _keys(example: Example) -> tuple[tuple[str, str], str]:
    return (example.meta["dataset"], str(example.meta["source_id"])), question_key(example.question)


@dataclass
class Plan:
    """What sampling produced: each file's examples and composition, and what it noticed."""

    files: dict[str, list[Example]] = field(default_factory=dict)
    composition: dict[str, dict[str, dict]] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


@dataclass
class _Draws:
    """Where sampling stands across files: each source's permutation and how far it has been
    drawn, the evaluation questions met so far, and which files share each source."""

    orders: dict[str, list[int]]
    tested: set[str]  # the sources of test files
    sharing: dict[str, list[str]]  # source -> the files that sample a count of it
    demand: dict[str, int]  # source -> the records those files ask for together
    cursor: dict[str, int] = field(default_factory=dict)
    # evaluation (dataset, id) keys, question keys
    held: tuple[set, set] = field(default_factory=lambda: (set(), set()))


def sample(spec: Paper, loaded: dict[str, Loaded], files: list[DataFile], seed: int) -> Plan:
    """Each file's examples: test files first, then val, then train (see the module docstring)."""
    plan = Plan()
    sharing, demand = _demand(files)
    draws = _Draws(
        orders={
            name: _permutation(len(item.examples), f"{seed}/{spec.name}/{name}")
            for name, item in loaded.items()
        },
        tested={t.source for f in files if f.role == "test" for t in f.takes},
        sharing=sharing,
        demand=demand,
    )
    for data_file in sorted(files, key=lambda f: ("test", "val", "train").index(f.role)):
        rows: list[Example] = []
        parts: dict[str, dict] = {}
        for take in data_file.takes:
            if take.source not in loaded:
                continue
            chosen = _take(take, data_file, loaded[take.source].examples, draws, plan)
            rows += chosen
            parts[take.source] = {
                "requested": "all" if take.count is None else take.count,
                "written": len(chosen),
                "section": take.cite,
            }
        if data_file.shuffle:
            random.Random(f"{seed}/{spec.name}/{data_file.name}").shuffle(rows)
        if data_file.role != "train":
            for example in rows:
                ident, text = _keys(example)
                draws.held[0].add(ident)
                draws.held[1].add(text)
        plan.files[data_file.name] = rows
        plan.composition[data_file.name] = parts
    return plan


def _take(
    take: Take, data_file: DataFile, pool: list[Example], draws: _Draws, plan: Plan
) -> list[Example]:
    """The records of one take of a file, drawn from its source after the takes before it; a
    shortfall (a line) and the evaluation questions passed over go into ``plan``."""
    # train never holds an evaluation question, nor does a validation sample drawn from
    # a training split (EVO-RAG's and Search-R1's validation questions are test ones)
    exclude = data_file.role == "train" or take.source not in draws.tested
    if take.count is None:
        chosen = [e for e in pool if not (exclude and _held(e, draws.held))]
        skipped = len(pool) - len(chosen)
    else:
        # a source smaller than what its samples ask for together is shared in
        # proportion to their counts (each gets at least one record)
        quota = take.count
        if len(pool) < draws.demand[take.source]:
            quota = max(1, take.count * len(pool) // draws.demand[take.source])
        order = draws.orders[take.source]
        chosen, skipped = _draw(take, quota, pool, order, draws.cursor, draws.held, exclude)
        if len(chosen) < take.count:
            others = [n for n in draws.sharing[take.source] if n != data_file.name]
            plan.lines.append(_short(take, data_file, len(pool), len(chosen), others, skipped))
    if exclude and skipped:
        plan.dropped.setdefault(data_file.name, {})[take.source] = skipped
    return chosen


def _demand(files: list[DataFile]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Per source, the files that sample it and the records they ask for together."""
    sharing: dict[str, list[str]] = {}
    demand: dict[str, int] = {}
    for data_file in files:
        for take in data_file.takes:
            if take.count is not None:
                sharing.setdefault(take.source, []).append(data_file.name)
                demand[take.source] = demand.get(take.source, 0) + take.count
    return sharing, demand


def _permutation(n: int, key: str) -> list[int]:
    order = list(range(n))
    random.Random(key).shuffle(order)
    return order


def _held(example: Example, held: tuple[set, set]) -> bool:
    ident, text = _keys(example)
    return ident in held[0] or text in held[1]


def _draw(take: Take, quota: int, pool, order, cursor, held, exclude) -> tuple[list, int]:
    """Up to ``quota`` records from the source's permutation, from where the last take of it
    stopped; with ``exclude``, evaluation questions are passed over (and counted)."""
    chosen: list[Example] = []
    skipped = 0
    has_level = take.hard and any("level" in e.meta for e in pool)
    i = cursor.get(take.source, 0)
    while i < len(order) and len(chosen) < quota:
        example = pool[order[i]]
        i += 1
        if has_level and example.meta.get("level") != "hard":
            continue
        if exclude and _held(example, held):
            skipped += 1
            continue
        chosen.append(example)
    cursor[take.source] = i
    return chosen, skipped


def _short(
    take: Take, data_file: DataFile, total: int, got: int, others: list[str], skipped: int
) -> str:
    """The line for a source smaller than its count: ``lit-rag data: hotpotqa-train has 100
    records, the paper samples 10,000: took 100``."""
    who = f"{data_file.name} samples" if take.ours else "the paper samples"
    notes = [f"shared with {', '.join(others)}"] if others else []
    if skipped:
        notes.append(f"{skipped:,} passed over as evaluation questions")
    if take.hard:
        notes.append("hard-level records only, where the records carry a level")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return f"{take.source} has {total:,} records{extra}, {who} {take.count:,}: took {got:,}"
