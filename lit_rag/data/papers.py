"""The data of each paper lit-rag reproduces: the sources it reads and the files it writes.

``lit-rag data PAPER`` (:mod:`lit_rag.data.prepare.command`) writes these files; ``lit-rag
evaluate`` finds a paper's test files with :func:`test_files`. Every count names the paper section
it comes from
(``Take.cite``); a count the paper does not give is marked ``ours`` and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lit_rag.errors import InputError

#: the Hugging Face dataset ``--flashrag`` mirrors and ``--hub`` downloads from
FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
_HOTPOTQA = "https://hotpotqa.github.io"
_TWOWIKI = "https://github.com/Alab-NII/2wikimultihop"
_MUSIQUE = "https://github.com/StonyBrookNLP/musique"


@dataclass(frozen=True)
class Source:
    """A dataset split a paper reads.

    Args:
        name: What ``--source NAME=PATH`` calls it (``hotpotqa-train``).
        dataset: The dataset (``hotpotqa``), as test files name it (``test_hotpotqa.jsonl``).
        flashrag: Its file in ``RUC-NLPIR/FlashRAG_datasets``, the layout its dataset card's
            ``configs`` give (``nq/train.jsonl``, ``2wikimultihopqa/dev.jsonl``, ...; Search-R1's
            ``scripts/data_process/qa_search_*_merge.py`` load those configs by these names).
        original: The original-layout file and where it is published ('' when FlashRAG's file
            is all there is: NQ, TriviaQA, PopQA, Bamboogle).
    """

    name: str
    dataset: str
    flashrag: str
    original: str = ""


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("hotpotqa-train", "hotpotqa", "hotpotqa/train.jsonl",
               f"HotpotQA's hotpot_train_v1.1.json, {_HOTPOTQA}"),
        Source("hotpotqa-dev", "hotpotqa", "hotpotqa/dev.jsonl",
               f"HotpotQA's hotpot_dev_distractor_v1.json, {_HOTPOTQA}"),
        Source("2wiki-train", "2wiki", "2wikimultihopqa/train.jsonl",
               f"2WikiMultihopQA's train.json, {_TWOWIKI}"),
        Source("2wiki-dev", "2wiki", "2wikimultihopqa/dev.jsonl",
               f"2WikiMultihopQA's dev.json, {_TWOWIKI}"),
        Source("musique-train", "musique", "musique/train.jsonl",
               f"MuSiQue's musique_ans_v1.0_train.jsonl, {_MUSIQUE}"),
        Source("musique-dev", "musique", "musique/dev.jsonl",
               f"MuSiQue's musique_ans_v1.0_dev.jsonl, {_MUSIQUE}"),
        Source("nq-train", "nq", "nq/train.jsonl"),
        Source("nq-dev", "nq", "nq/dev.jsonl"),
        Source("nq-test", "nq", "nq/test.jsonl"),
        Source("triviaqa-test", "triviaqa", "triviaqa/test.jsonl"),
        Source("popqa-test", "popqa", "popqa/test.jsonl"),
        Source("bamboogle-test", "bamboogle", "bamboogle/test.jsonl"),
        # FlashRAG's retrieval-corpus/wiki18_100w.zip, unzipped (its docs: "download and
        # unzip"); Search-R1 ships the same passages as PeterJinGo/wiki-18-corpus wiki-18.jsonl
        Source("wiki18", "wiki18", "retrieval-corpus/wiki18_100w.jsonl",
               "FlashRAG's retrieval-corpus/wiki18_100w.zip unzipped, or Search-R1's "
               "wiki-18.jsonl (huggingface.co/datasets/PeterJinGo/wiki-18-corpus)"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Take:
    """Records of one source in one file: ``count`` sampled (None: every record, file order).

    ``cite`` is the paper section (or our reason) behind the count; ``ours`` marks a count the
    paper does not give; ``hard`` keeps HotpotQA's ``level == "hard"`` records when they carry
    a level.
    """

    source: str
    count: int | None
    cite: str
    ours: bool = False
    hard: bool = False


@dataclass(frozen=True)
class DataFile:
    """One file ``lit-rag data`` writes: its role (``train``, ``val``, ``test``), the takes it
    joins in order, whether they are shuffled together, and (test files) its dataset."""

    name: str
    role: str
    takes: tuple[Take, ...]
    shuffle: bool = False
    dataset: str = ""


@dataclass(frozen=True)
class Paper:
    """What one paper's recipes train and evaluate on.

    Args:
        name: ``lit-rag data`` name (``search_r1``).
        title: The paper, and the sections that give its data.
        files: The data files, in the order they are listed.
        recipes: The recipes that read them.
        paragraphs: Sources whose paragraphs the paper needs (original layout only).
        corpus: Where the paper says it retrieves from the datasets' own paragraphs: then
            ``corpus.jsonl`` holds the paragraphs of every question of every file ('' for
            none).
        wiki18: Retrieves from the ``wiki18`` source (recorded, never copied).
        question_mark: Search-R1's preprocessing appends ``?`` to a question without one.
        index: The ``lit-rag index build`` command for its corpus (``{corpus}``: the path).
        notes: What the manifest adds about the paper's data (a gap, a departure).
    """

    name: str
    title: str
    files: tuple[DataFile, ...]
    recipes: tuple[str, ...]
    paragraphs: frozenset[str] = frozenset()
    corpus: str = ""
    wiki18: bool = False
    question_mark: bool = False
    index: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every file this paper's run writes, ``manifest.json`` last."""
        extra = ("corpus.jsonl",) if self.corpus else ()
        return (*(f.name for f in self.files), *extra, "manifest.json")

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources it reads, in first use order (``wiki18`` last)."""
        names = dict.fromkeys(t.source for f in self.files for t in f.takes)
        return (*names, *(("wiki18",) if self.wiki18 else ()))


def _tests(cite: str, count: int | None, *pairs: tuple[str, str]) -> tuple[DataFile, ...]:
    return tuple(
        DataFile(f"test_{SOURCES[s].dataset}.jsonl", "test", (Take(s, count, cite.format(n=n)),),
                 dataset=SOURCES[s].dataset)
        for s, n in pairs
    )  # fmt: skip


_ORIGINAL = ("hotpotqa", "2wiki", "musique")
_DEVS = (("hotpotqa-dev", "HotpotQA"), ("2wiki-dev", "2Wiki"), ("musique-dev", "MuSiQue"))
_ARENA = "ARENA Section 4.1 Table 2, Appendix B"
# ARENA names no validation set. Its release validates every 25 steps (configs/grpo.yaml:
# do_eval, eval_steps 25) on 500 records split off its 25,000-record training mix
# (src/grpo.py: train_test_split(test_size=500)), so it trained on 24,500. We keep Table 2's
# 25,000 and draw the 500 beside them, in the mix's 2:2:1 proportion.
_ARENA_VAL = "ours: ARENA's release validates on 500 training-mix records (src/grpo.py)"
_R2AG_B2 = "R2AG B.2 Training Dataset Configuration"
_SR1_TESTS = (
    ("nq-test", "NQ test"), ("triviaqa-test", "TriviaQA test"), ("popqa-test", "PopQA test"),
    ("hotpotqa-dev", "HotpotQA dev"), ("2wiki-dev", "2Wiki dev"), ("musique-dev", "MuSiQue dev"),
    ("bamboogle-test", "Bamboogle test"),
)  # fmt: skip
_E5 = (
    "lit-rag index build --corpus {corpus} --retriever dense --encoder /models/e5-base-v2 "
    '--query-prefix "query: " --passage-prefix "passage: " --faiss-index flat '
    "--out indexes/wiki18-e5"
)

PAPERS: dict[str, Paper] = {
    "arena": Paper(
        "arena",
        f"ARENA ({_ARENA.removeprefix('ARENA ')})",
        (
            *_tests(f"{_ARENA}: 500 random dev examples ({{n}})", 500, *_DEVS),
            DataFile("val.jsonl", "val", (
                Take("hotpotqa-train", 200, _ARENA_VAL, ours=True),
                Take("2wiki-train", 200, _ARENA_VAL, ours=True),
                Take("musique-train", 100, _ARENA_VAL, ours=True),
            )),
            DataFile("train.jsonl", "train", (
                Take("hotpotqa-train", 10_000, f"{_ARENA}: 10,000 HotpotQA train"),
                Take("2wiki-train", 10_000, f"{_ARENA}: 10,000 2Wiki train"),
                Take("musique-train", 5_000, f"{_ARENA}: 5,000 MuSiQue train"),
            ), shuffle=True),
        ),
        ("arena",),
        paragraphs=frozenset(s for s in SOURCES if s.split("-")[0] in _ORIGINAL),
    ),
    "r2ag": Paper(
        "r2ag",
        "R2AG (Appendix B.2, C.1, C.2)",
        (
            # C.1 says HotpotQA's 1,000 hard-level questions come "from the training dataset";
            # C.2 samples every evaluation set from the development sets: C.2 is followed (and
            # HotpotQA's dev set is all hard-level), the training take below names it too
            *_tests("R2AG C.2: 1,000 random {n} dev instances (C.1: HotpotQA's from the training "
                    "set; C.2 followed)", 1_000, _DEVS[0]),
            *_tests("R2AG C.2: 1,000 random {n} dev instances", 1_000, *_DEVS[1:]),
            DataFile("val.jsonl", "val", (
                Take("2wiki-train", 150, f"{_R2AG_B2}: 150 2Wiki train for validation"),
                Take("musique-train", 150, f"{_R2AG_B2}: 150 MuSiQue train for validation"),
            )),
            DataFile("train.jsonl", "train", (
                # C.1 says its HotpotQA questions are hard-level (and, unlike C.2, that they come
                # from the training set); HotpotQA's dev set is all hard-level anyway
                Take("hotpotqa-train", 500, f"{_R2AG_B2}: 500 HotpotQA train; C.1: hard-level",
                     hard=True),
                Take("2wiki-train", 3_000, f"{_R2AG_B2}: 3,000 2Wiki train"),
                Take("musique-train", 1_174, f"{_R2AG_B2}: 1,174 MuSiQue train"),
            )),
        ),
        ("r2ag",),
        paragraphs=frozenset(s for s in SOURCES if s.split("-")[0] in _ORIGINAL),
        corpus='R2AG C.2: "the remaining datasets use their original document collections"',
        index=(
            "lit-rag index build --corpus {corpus} --retriever dense "
            "--encoder /models/multilingual-e5-large-instruct --faiss-index flat "
            "--query-prefix $'Instruct: Given a question, retrieve passages that answer the "
            "question\\nQuery: ' --out indexes/r2ag-e5"
        ),
        notes=("R2AG C.2 also evaluates 1,000 NQ dev questions over the 2021 Wikipedia dump "
               "of Izacard et al.; that corpus is not prepared here",),
    ),
    "search_r1": Paper(
        "search_r1",
        "Search-R1 / Eval-RAR (Section 5.1, Appendix A.4 Table 4)",
        (
            *_tests("Eval-RAR A.4 Table 4: the whole {n} split", None, *_SR1_TESTS),
            # Search-R1's scripts/nq_hotpotqa/data_process.sh merges the seven test splits into
            # test.parquet (qa_search_test_merge.py: 'test', else 'dev'), and
            # v0.2/train_grpo.sh validates on all of it (data.val_files, val_data_num=null)
            # (shuffled here, so that data.num_val=N validates on a mix of the seven)
            DataFile("val.jsonl", "val", tuple(
                Take(s, None, f"Search-R1 train_grpo.sh: validates on every {n} record")
                for s, n in _SR1_TESTS
            ), shuffle=True),
            # qa_search_train_merge.py: FlashRAG's nq then hotpotqa train splits, concatenated
            DataFile("train.jsonl", "train", (
                Take("nq-train", None, "Eval-RAR A.4 Table 4: NQ train, 79,168"),
                Take("hotpotqa-train", None, "Eval-RAR A.4 Table 4: HotpotQA train, 90,447"),
            )),
        ),
        ("eval_rar", "search_r1"),
        wiki18=True,
        question_mark=True,
        index=_E5,
        notes=("Search-R1 kept every train record (169,615); here a train question that is "
               "also a test question is dropped (manifest: dropped_duplicates)",),
    ),
    "evo_rag": Paper(
        "evo_rag",
        "EVO-RAG (Section 4.1, Table 2)",
        (
            # Table 2 prints 7,404 and 12,575; the official files hold 7,405 and 12,576
            *_tests("EVO-RAG Section 4.1: the official {n} validation set (Table 2)", None,
                    *_DEVS, ("bamboogle-test", "Bamboogle")),
            # Section 3.4 stops training when HotpotQA dev EM stalls, and 4.1 evaluates on the
            # same dev set: val.jsonl is a sample of test_hotpotqa.jsonl, as in the paper
            DataFile("val.jsonl", "val", (
                Take("hotpotqa-dev", 500,
                     "ours: recipes/evo_rag.yaml's 500 dev questions per validation", ours=True),
            )),
            DataFile("train.jsonl", "train", (
                Take("hotpotqa-train", 1_000,
                     "EVO-RAG Section 4.1: 1,000 queries sampled from HotpotQA"),
            )),
        ),
        ("evo_rag",),
        paragraphs=frozenset({"hotpotqa-train", "hotpotqa-dev", "2wiki-dev", "musique-dev"}),
        # Section 4.1 names the retriever and the evaluation sets, and no corpus: the pooled
        # paragraphs of the questions are our choice (ARENA's and R2AG's corpora are those)
        corpus=('ours: EVO-RAG Section 4.1 says "paired with RRF-BGE (Chen et al., 2024b) '
                'retriever (fusion of BM25 ... and BGE embeddings)" and "Evaluation is conducted '
                'on official validation sets", and names no corpus; this is the questions\' own '
                "paragraphs, pooled"),
        index=(
            "lit-rag index build --corpus {corpus} --retriever hybrid "
            "--encoder /models/bge-large-en-v1.5 --faiss-index flat --out indexes/hotpot-rrf-bge"
        ),
        notes=("Bamboogle has no paragraphs: its questions are not in corpus.jsonl",),
    ),
}  # fmt: skip
#: other names of a paper
ALIASES = {"eval_rar": "search_r1"}


def paper(name: str) -> Paper:
    """The :class:`Paper` called ``name`` (an alias, or ``-`` for ``_``, also works).

    Raises:
        InputError: An unknown name (the message lists the papers).
    """
    key = name.replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in PAPERS:
        known = ", ".join(f"{p} (alias {a})" if a else p for p, a in paper_names())
        raise InputError(f"data: unknown paper {name!r}; papers: {known}")
    return PAPERS[key]


def paper_names() -> list[tuple[str, str]]:
    """``(paper, alias or '')`` for every paper, in table order."""
    return [(p, next((a for a, t in ALIASES.items() if t == p), "")) for p in PAPERS]


def test_files(paper_name: str, folder: str | Path) -> dict[str, Path]:
    """``dataset -> folder/test_<dataset>.jsonl`` of the test files a paper's run writes
    (present or not), e.g. ``{"hotpotqa": folder / "test_hotpotqa.jsonl", ...}``."""
    return {f.dataset: Path(folder) / f.name for f in paper(paper_name).files if f.role == "test"}


test_files.__test__ = False  # a table lookup, not a pytest test


def listing() -> str:
    """``lit-rag data --list``: each paper, the files it writes and the sources each one joins.

    A missing train source is an error; a missing test source is named and its file skipped.
    """
    lines = []
    for name, alias in paper_names():
        spec = PAPERS[name]
        lines.append(f"{name}{f' (alias {alias})' if alias else ''}: {spec.title}")
        width = max(len(f.name) for f in spec.files)
        for data_file in spec.files:
            takes = ", ".join(
                f"{t.source} {'all' if t.count is None else f'{t.count:,}'}"
                for t in data_file.takes
            )
            lines.append(f"  {data_file.name.ljust(width)}  {takes}")
        if spec.corpus:
            lines.append(f"  {'corpus.jsonl'.ljust(width)}  the paragraphs of every question")
        if spec.wiki18:
            lines.append(
                f"  {'(wiki18)'.ljust(width)}  wiki18: recorded in the manifest, not copied"
            )
        if spec.paragraphs:
            lines.append(f"  original layout only: {', '.join(sorted(spec.paragraphs))}")
    return "\n".join(lines)
