"""The benchmark suites ``lit-rag evaluate`` scores a model on, and the papers' published rows.

A suite is the datasets a paper's table reports, the metric of each column, where
``lit-rag data`` writes the test files (``data/<paper>/test_<dataset>.jsonl``), the recipes that
evaluate through the paper's environment and retriever, and the paper's own rows with the protocol
they were measured under (model, retriever, corpus, question counts), each cited. The numbers are
copied from the papers in ``shared/seeds`` as printed there; percentages are written as fractions
so they sit beside ours.

Suites:

- ``search-r1``: the seven QA datasets Search-R1 and its successors report (NQ, TriviaQA, PopQA
  test; HotpotQA, 2Wiki, MuSiQue dev; Bamboogle test), exact match, e5 top-3 over the 2018
  Wikipedia dump. Rows: Eval-RAR Table 1 (which quotes Search-R1's and AutoRefine's numbers).
- ``eval-rar``: the same datasets; rows: Eval-RAR Tables 1 and 2 (the evaluation-reward ablation).
- ``arena``: HotpotQA, 2Wiki, MuSiQue, 500 dev questions each with their own paragraphs; EM, F1
  and LJ (an LLM judge); rows: ARENA Table 3.
- ``r2ag``: HotpotQA, 2Wiki, MuSiQue, 1,000 dev questions each over the datasets' own paragraphs;
  Recall, Full-Recall, documents retrieved (K) and mAP; rows: R2AG Table 1.
- ``evo-rag``: HotpotQA, 2Wiki, MuSiQue, Bamboogle, the official dev sets; EM / F1; rows: EVO-RAG
  Table 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Column titles of the datasets.
DATASET_TITLES = {
    "nq": "NQ",
    "triviaqa": "TriviaQA",
    "popqa": "PopQA",
    "hotpotqa": "HotpotQA",
    "2wiki": "2Wiki",
    "musique": "MuSiQue",
    "bamboogle": "Bamboogle",
}


@dataclass(frozen=True)
class Metric:
    """One column per dataset: its title and where its value comes from.

    ``key`` is the validation metric the recipe's module logs (``val/em``); ``judge`` marks the
    LLM-as-a-judge column, which ``lit-rag evaluate`` computes from the answers when a judge is
    named.
    """

    title: str
    key: str | None = None
    judge: bool = False


@dataclass(frozen=True)
class PublishedRow:
    """A row of a paper's table: the model it names, its size (billions of parameters, for
    ordering rows by closeness to the evaluated model) and its values, ``(dataset, metric
    title) -> value`` (a fraction; None where the paper prints '-')."""

    name: str
    params_b: float
    values: dict[tuple[str, str], float | None]


@dataclass(frozen=True)
class Setting:
    """One protocol field of a paper's runs: what the paper states, and where.

    ``lit-rag evaluate`` compares it with the same field of a run's record
    (:mod:`lit_rag.evaluate.table`) and prints a line when they differ, or when the paper
    is silent.

    Args:
        title: The field as a line names it (``top-k``).
        stated: What the paper states, as a reader sees it; None where it states nothing.
        cite: The section or table that states it; where the paper is silent, that it is, and
            whose setting a value one might assume is (``greedy is Search-R1's setting``).
        expect: What a record's value must be for the run to match: a tuple of allowed values,
            or a ``dataset -> value`` dict; None where the record has nothing to compare.
    """

    title: str
    stated: str | None
    cite: str
    expect: tuple | dict[str, Any] | None = None


@dataclass(frozen=True)
class Published:
    """A paper's table: where it is, and the protocol its rows were measured under."""

    citation: str
    protocol: str
    #: protocol fields of the paper's runs (``model``, ``corpus``, ``corpus_size``,
    #: ``retriever``, ``encoder``, ``top_k``, ``top_t``, ``max_turns``, ``decoding``,
    #: ``normalization``, ``questions``, ``judge``), compared with a record's to say what differs
    settings: dict[str, Setting]
    rows: tuple[PublishedRow, ...]


@dataclass(frozen=True)
class Suite:
    """What ``lit-rag evaluate --suite NAME`` runs and prints."""

    name: str
    description: str
    paper: str  #: the ``lit-rag data`` paper whose folder holds the test files
    datasets: tuple[str, ...]
    metrics: tuple[Metric, ...]
    recipe: str  #: the paper recipe (GPUs)
    cpu_recipe: str  #: the CPU recipe of the same method (the real small model)
    published: Published
    average: bool = False  #: an average column over the datasets, as the paper's table has
    extra: dict[str, str] = field(default_factory=dict)
    #: environment settings per dataset, the paper's (R2AG's t = M/2): set before the dataset
    #: is scored unless a recipe override names them
    dataset_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: datasets whose column is not comparable with the paper's, and why (one line each)
    not_comparable: dict[str, str] = field(default_factory=dict)


def _rows(
    datasets: tuple[str, ...], metric: str, table: list[tuple[str, float, list[float | None]]]
) -> tuple[PublishedRow, ...]:
    """Rows of a one-metric table, values listed in dataset order."""
    return tuple(
        PublishedRow(name, size, {(d, metric): v for d, v in zip(datasets, values, strict=True)})
        for name, size, values in table
    )


def _grid(
    datasets: tuple[str, ...],
    metrics: tuple[str, ...],
    table: list[tuple[str, float, list[float | None]]],
    scale: float = 1.0,
) -> tuple[PublishedRow, ...]:
    """Rows of a table whose values run dataset by dataset, metric by metric inside each."""
    rows = []
    for name, size, values in table:
        cells = {}
        for i, dataset in enumerate(datasets):
            for j, metric in enumerate(metrics):
                value = values[i * len(metrics) + j]
                cells[(dataset, metric)] = None if value is None else value / scale
        rows.append(PublishedRow(name, size, cells))
    return tuple(rows)


SEARCH_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")

# Eval-RAR (shared/seeds/eval_rar.md) Table 1, "Main results": Qwen2.5-3B Base / Instruct,
# E5-base-v2 over the December 2018 Wikipedia dump, top-3 (Section 5.1), EM on the full test
# splits of NQ, TriviaQA, PopQA, Bamboogle and dev splits of HotpotQA, 2Wiki, MuSiQue (A.4,
# Table 4). "All baseline results are taken from Search-R1 and AutoRefine" (Section 5.1).
_EVAL_RAR_TABLE_1 = [
    ("Direct Inference (Qwen2.5-3B)", 3.0, [0.106, 0.288, 0.108, 0.149, 0.244, 0.020, 0.024]),
    ("Naive RAG (Qwen2.5-3B)", 3.0, [0.348, 0.544, 0.387, 0.255, 0.226, 0.047, 0.080]),
    ("IRCoT (Qwen2.5-3B)", 3.0, [0.111, 0.312, 0.200, 0.164, 0.171, 0.067, 0.240]),
    ("Search-o1 (Qwen2.5-3B)", 3.0, [0.238, 0.472, 0.262, 0.221, 0.218, 0.054, 0.320]),
    ("Search-R1-Base (Qwen2.5-3B)", 3.0, [0.421, 0.583, 0.413, 0.297, 0.274, 0.066, 0.128]),
    ("Search-R1-Instruct (Qwen2.5-3B)", 3.0, [0.397, 0.565, 0.391, 0.331, 0.310, 0.124, 0.232]),
    ("AutoRefine-Base (Qwen2.5-3B)", 3.0, [0.467, 0.620, 0.450, 0.405, 0.393, 0.157, 0.344]),
    ("AutoRefine-Instruct (Qwen2.5-3B)", 3.0, [0.436, 0.597, 0.447, 0.404, 0.380, 0.169, 0.336]),
    ("Eval-RAR-Base (Qwen2.5-3B)", 3.0, [0.471, 0.629, 0.453, 0.412, 0.394, 0.161, 0.368]),
    ("Eval-RAR-Instruct (Qwen2.5-3B)", 3.0, [0.462, 0.611, 0.448, 0.403, 0.383, 0.171, 0.352]),
]
# Eval-RAR Table 2, the ablation "w/o evaluation reward" (trained on the outcome reward alone).
_EVAL_RAR_TABLE_2 = [
    (
        "Eval-RAR-Base w/o evaluation reward (Qwen2.5-3B)",
        3.0,
        [0.427, 0.591, 0.434, 0.331, 0.348, 0.123, 0.264],
    ),
    (
        "Eval-RAR-Instruct w/o evaluation reward (Qwen2.5-3B)",
        3.0,
        [0.423, 0.583, 0.429, 0.341, 0.336, 0.111, 0.248],
    ),
]
# What Eval-RAR states of its runs (Section 5.1 "Implementation details", A.1, A.4), and what it
# leaves to Search-R1 ("Following the settings in Search-R1"): those are named as not stated.
_SEARCH_SETTINGS = {
    "model": Setting("model", "Qwen2.5-3B Base and Instruct", "Eval-RAR Section 5.1", (3.0,)),
    "corpus": Setting(
        "corpus",
        "the December 2018 Wikipedia dump (Karpukhin et al., 2020)",
        "Eval-RAR Section 5.1",
        ("wiki18",),
    ),
    "corpus_size": Setting(
        "corpus size", None, "not stated in Eval-RAR (it cites Karpukhin et al., 2020 for the dump)"
    ),
    "retriever": Setting("retriever", "dense (E5-base-v2)", "Eval-RAR Section 5.1", ("dense",)),
    "encoder": Setting("encoder", "E5-base-v2", "Eval-RAR Section 5.1", ("e5-base-v2",)),
    "top_k": Setting("top-k", "3", "Eval-RAR Section 5.1 and the A.1 prompt", (3,)),
    "max_turns": Setting(
        "max turns",
        None,
        "not stated in Eval-RAR (Algorithm 1's limit N has no value; 4 is Search-R1's script)",
    ),
    "decoding": Setting(
        "decoding", None, "not stated in Eval-RAR (greedy is Search-R1's setting, not Eval-RAR's)"
    ),
    "normalization": Setting(
        "answer normalization",
        None,
        "not stated in Eval-RAR, which names EM only (SQuAD's, punctuation deleted, is "
        "Search-R1's qa_em.py)",
    ),
    "questions": Setting(
        "questions",
        "the full test / dev splits",
        "Eval-RAR A.4 Table 4",
        {
            "nq": 3_610,
            "triviaqa": 11_313,
            "popqa": 14_267,
            "hotpotqa": 7_405,
            "2wiki": 12_576,
            "musique": 2_417,
            "bamboogle": 125,
        },
    ),
}
_SEARCH_PROTOCOL = (
    "Qwen2.5-3B, E5-base-v2 top-3 over the 2018 Wikipedia dump, full test/dev splits, EM"
)
_SEARCH_R1_ROWS = {
    "Direct Inference (Qwen2.5-3B)",
    "Naive RAG (Qwen2.5-3B)",
    "Search-R1-Base (Qwen2.5-3B)",
    "Search-R1-Instruct (Qwen2.5-3B)",
    "Eval-RAR-Base (Qwen2.5-3B)",
    "Eval-RAR-Instruct (Qwen2.5-3B)",
}

ARENA_DATASETS = ("hotpotqa", "2wiki", "musique")
# ARENA (shared/seeds/arena.txt) Table 3: 500 dev questions per dataset with the dataset's own
# 10-20 paragraphs in order (Section 4.1, Appendix B); EM, F1 (Appendix C.1-C.2), LJ by GPT-4o
# 2024-11-20 (C.3).
_ARENA_TABLE_3 = [
    (
        "Qwen2.5-7B-Instruct (original)",
        7.6,
        [0.484, 0.628, 0.660, 0.334, 0.424, 0.412, 0.252, 0.354, 0.306],
    ),
    ("ARENA-Qwen-7B", 7.6, [0.628, 0.762, 0.812, 0.660, 0.752, 0.786, 0.400, 0.520, 0.508]),
    ("Naive-GRPO (7B)", 7.6, [0.534, 0.662, 0.732, 0.620, 0.684, 0.720, 0.332, 0.435, 0.420]),
    (
        "Qwen-7B-SFT-direct",
        7.6,
        [0.498, 0.628, 0.662, 0.540, 0.609, 0.620, 0.168, 0.254, 0.214],
    ),
    (
        "DeepSeek-R1-Distill-Qwen-7B",
        7.6,
        [0.332, 0.487, 0.712, 0.290, 0.407, 0.658, 0.116, 0.184, 0.278],
    ),
    (
        "Llama3.1-8B-Instruct (original)",
        8.0,
        [0.528, 0.676, 0.738, 0.398, 0.478, 0.484, 0.248, 0.370, 0.324],
    ),
    ("ARENA-Llama-8B", 8.0, [0.552, 0.703, 0.780, 0.622, 0.710, 0.735, 0.358, 0.445, 0.466]),
    ("Qwen3-8B", 8.2, [0.582, 0.719, 0.768, 0.652, 0.727, 0.784, 0.336, 0.397, 0.394]),
]

# What ARENA states of its evaluation (Sections 4.1-4.4, Appendices B, C).
_ARENA_SETTINGS = {
    "model": Setting(
        "model", "Qwen2.5-7B-Instruct, Llama3.1-8B-Instruct", "ARENA Section 4.4", (7.6, 8.0)
    ),
    "corpus": Setting(
        "corpus",
        "no retrieval: each question's own 10 (HotpotQA, 2Wiki) or 20 (MuSiQue) paragraphs, "
        "in the prompt in their original order",
        "ARENA Section 4.1, Table 2, Section 4.4",
        ("prompt",),
    ),
    "retriever": Setting(
        "retriever", "none (the paragraphs are in the prompt)", "ARENA Section 4.4", ("none",)
    ),
    "decoding": Setting(
        "decoding",
        None,
        "not stated in ARENA (its temperatures are 0.9 for training rollouts, Appendix E, and "
        "0.0 for the judge, C.3)",
    ),
    "normalization": Setting(
        "answer normalization",
        "lowercase; punctuation and articles removed; underscores to spaces (the release "
        "replaces punctuation with a space)",
        "ARENA Appendix C.1",
        ("space",),
    ),
    "questions": Setting(
        "questions",
        "500 dev questions per dataset",
        "ARENA Table 2, Appendix B",
        dict.fromkeys(("hotpotqa", "2wiki", "musique"), 500),
    ),
    "judge": Setting(
        "judge",
        "GPT-4o (2024-11-20), temperature 0.0",
        "ARENA Section 4.2, Appendix C.3",
        ("gpt-4o-2024-11-20",),
    ),
}

R2AG_DATASETS = ("hotpotqa", "2wiki", "musique")
# R2AG (shared/seeds/r2ag.md) Table 1, "Overall retrieval performance" (percentages; @K is a
# count): multilingual-e5-large-instruct (0.56B) over each dataset's own paragraphs (C.2), the
# steering model Qwen3-8B, 1,000 dev questions per dataset (C.2), t = M/2 (Table 1's rows are
# Table A.6's t = M/2 ones), temperature 0.6, top-p 0.9 (C.2).
_R2AG_TABLE_1 = [
    (
        "R2AG-0.56B@8B base @top-1 (Qwen3-8B)",
        8.2,
        [90.8, 84.2, 3.171, 80.19, 97.58, 94.1, 4.477, 94.86, 69.15, 46.8, 4.902, 57.23],
    ),
    (
        "R2AG-0.56B@8B @top-1 (Qwen3-8B)",
        8.2,
        [92.4, 87.1, 3.873, 79.39, 97.32, 94.1, 5.779, 84.78, 71.91, 51.3, 6.108, 57.3],
    ),
    (
        "R2AG-0.56B@8B base @top-2 (Qwen3-8B)",
        8.2,
        [96.2, 93.6, 6.832, 73.15, 98.48, 95.9, 8.11, 73.01, 73.37, 51.6, 6.529, 55.71],
    ),
    (
        "R2AG-0.56B@8B @top-2 (Qwen3-8B)",
        8.2,
        [97.2, 94.9, 8.698, 71.79, 98.4, 96.0, 10.993, 64.97, 75.79, 54.6, 8.654, 54.23],
    ),
    (
        "SR-0.56B@5 (single-step retrieval, no LLM)",
        0.56,
        [85.11, 71.63, 5, 76.96, 52.13, 0.2, 5, 50.58, 36.95, 10.09, 5, 36.59],
    ),
    (
        "SR-0.56B@10 (single-step retrieval, no LLM)",
        0.56,
        [91.11, 82.52, 10, 78.63, 53.97, 0.5, 10, 51.45, 42.55, 15.58, 10, 39.62],
    ),
]


#: M, each dataset's maximum reasoning hops: "HotPotQA (2 hop) ..., 2WikiMultihopQA (4 hop) ...,
#: MuSiQue (2~4 hop)" (R2AG Section 3.1)
R2AG_HOPS = {"hotpotqa": 2, "2wiki": 4, "musique": 4}
#: Table 1's top-t/x: t = M/2 (C.2 evaluates t = M and t = M/2; Table 1's 2Wiki values are Table
#: A.6's t = M/2 rows), so HotpotQA 1, 2Wiki 2, MuSiQue 2
R2AG_TOP_T = {dataset: hops // 2 for dataset, hops in R2AG_HOPS.items()}
# What R2AG states of Table 1's runs (Section 3.1, 3.2, Appendices B.2, C.1, C.2).
_R2AG_SETTINGS = {
    "model": Setting("model", "Qwen3-8B (the steering model)", "R2AG Section 3.2, Table 1", (8.2,)),
    "corpus": Setting(
        "corpus",
        "each dataset's original document collection",
        "R2AG Appendix C.2",
        ("paragraphs",),
    ),
    "corpus_size": Setting(
        "corpus size",
        None,
        "not stated in R2AG (C.1: each HotpotQA question has 10 passages)",
    ),
    "retriever": Setting(
        "retriever", "dense (multilingual-e5-large-instruct)", "R2AG Section 3.2", ("dense",)
    ),
    "encoder": Setting(
        "encoder",
        "multilingual-e5-large-instruct (0.56B)",
        "R2AG Section 3.2",
        ("multilingual-e5-large-instruct",),
    ),
    "top_k": Setting(
        "top-k", "1 and 2 per query (a row each)", "R2AG Section 3.2, Table 1", (1, 2)
    ),
    "top_t": Setting(
        "top-t",
        "t = M/2: HotpotQA 1, 2Wiki 2, MuSiQue 2 (M = 2, 4, 4 hops)",
        "R2AG Appendix C.2, Section 3.1, Table A.6",
        R2AG_TOP_T,
    ),
    "max_turns": Setting("max iterations", "5 (L_MAX-I)", "R2AG Section 3.2, B.2", (5,)),
    "decoding": Setting(
        "decoding", "temperature 0.6, top-p 0.9", "R2AG Appendix C.2", ((0.6, 0.9),)
    ),
    "questions": Setting(
        "questions",
        "1,000 random dev questions per dataset",
        "R2AG Appendix C.2",
        dict.fromkeys(R2AG_DATASETS, 1_000),
    ),
}


def _r2ag_rows() -> tuple[PublishedRow, ...]:
    # Recall, FR and mAP are percentages in the paper, @K a count: scale each on its own
    rows = []
    for name, size, values in _R2AG_TABLE_1:
        cells = {}
        for i, dataset in enumerate(R2AG_DATASETS):
            recall, fr, k, ap = values[4 * i : 4 * i + 4]
            cells.update(
                {
                    (dataset, "Recall"): recall / 100,
                    (dataset, "FR"): fr / 100,
                    (dataset, "K"): float(k),
                    (dataset, "mAP"): ap / 100,
                }
            )
        rows.append(PublishedRow(name, size, cells))
    return tuple(rows)


EVO_RAG_DATASETS = ("hotpotqa", "2wiki", "musique", "bamboogle")
# EVO-RAG (shared/seeds/evo_rag.txt) Table 3: EM / F1 in percent, averaged over 3 seeds, on the
# official validation sets (Section 4, Table 2: HotpotQA 7,404, 2Wiki 12,575, MuSiQue 2,417,
# Bamboogle 125); RRF of BM25 and BGE (4.1).
_EVO_RAG_TABLE_3 = [
    ("EVO-RAG (Qwen3-8B)", 8.2, [57.6, 71.5, 53.2, 67.1, 52.2, 64.0, 46.0, 59.0]),
    ("EVO-RAG (LLaMA-3.1-8B)", 8.0, [57.4, 71.2, 53.0, 66.9, 52.5, 64.4, 45.7, 58.6]),
    ("EVO-RAG (DeepSeek-8B)", 8.0, [57.8, 71.4, 52.6, 66.4, 51.8, 63.7, 45.3, 58.2]),
    ("RAG-Gym ReSearch + PRM (LLaMA-3.1-8B)", 8.0, [44.1, 56.8, 50.2, 57.9, 48, 60, 51.2, 63.1]),
    ("IRCoT (Flan-T5-XXL)", 11.0, [45.0, 56.2, 45.4, 56.8, 19.9, 24.9, 44.0, 55.0]),
]

# What EVO-RAG states of its evaluation (Section 3.6, Section 4.1, Table 2): Section 4.1 names
# the retriever and "official validation sets", and no corpus, k, decoding or normalization.
_EVO_RAG_SETTINGS = {
    "model": Setting(
        "model",
        "Llama-3.1-8B-Instruct, Qwen3-8B, DeepSeek-R1-distill-llama3-8B",
        "EVO-RAG Section 4.1",
        (8.0, 8.2),
    ),
    "corpus": Setting(
        "corpus", None, "not stated in EVO-RAG (Section 4.1 names a retriever, no corpus)"
    ),
    "corpus_size": Setting("corpus size", None, "not stated in EVO-RAG"),
    "retriever": Setting(
        "retriever",
        "RRF-BGE: fusion of BM25 and BGE embeddings",
        "EVO-RAG Section 4.1",
        ("hybrid",),
    ),
    "encoder": Setting("encoder", "BGE (no model named)", "EVO-RAG Section 4.1", ("bge",)),
    "top_k": Setting("top-k", None, "not stated in EVO-RAG"),
    "max_turns": Setting("max steps", "T_max = 20", "EVO-RAG Section 3.6", (20,)),
    "decoding": Setting(
        "decoding", None, "not stated in EVO-RAG (its one temperature is DPO's, Section 3.3)"
    ),
    "normalization": Setting(
        "answer normalization", None, "not stated in EVO-RAG, which names EM and F1 (Section 4.1)"
    ),
    "questions": Setting(
        "questions",
        "the official validation sets",
        "EVO-RAG Section 4.1, Table 2",
        {"hotpotqa": 7_404, "2wiki": 12_575, "musique": 2_417, "bamboogle": 125},
    ),
}

EM = Metric("EM", "val/em")
F1 = Metric("F1", "val/f1")

SUITES: dict[str, Suite] = {
    "search-r1": Suite(
        name="search-r1",
        description="the seven QA benchmarks of Search-R1 and its successors, exact match",
        paper="search_r1",
        datasets=SEARCH_DATASETS,
        metrics=(EM,),
        recipe="recipes/search_r1.yaml",
        cpu_recipe="recipes/search_r1_hotpotqa_cpu.yaml",
        published=Published(
            citation="Eval-RAR Table 1 (Search-R1's and AutoRefine's numbers as quoted there)",
            protocol=_SEARCH_PROTOCOL,
            settings=_SEARCH_SETTINGS,
            rows=tuple(
                r
                for r in _rows(SEARCH_DATASETS, "EM", _EVAL_RAR_TABLE_1)
                if r.name in _SEARCH_R1_ROWS
            ),
        ),
        average=True,
    ),
    "eval-rar": Suite(
        name="eval-rar",
        description="Eval-RAR's Tables 1-2: the seven QA benchmarks, exact match",
        paper="search_r1",
        datasets=SEARCH_DATASETS,
        metrics=(EM,),
        recipe="recipes/eval_rar.yaml",
        cpu_recipe="recipes/eval_rar_hotpotqa_cpu.yaml",
        published=Published(
            citation="Eval-RAR Tables 1 and 2",
            protocol=_SEARCH_PROTOCOL,
            settings=_SEARCH_SETTINGS,
            rows=_rows(SEARCH_DATASETS, "EM", _EVAL_RAR_TABLE_1 + _EVAL_RAR_TABLE_2),
        ),
        average=True,
    ),
    "arena": Suite(
        name="arena",
        description="ARENA's Table 3: HotpotQA, 2Wiki, MuSiQue with their own paragraphs",
        paper="arena",
        datasets=ARENA_DATASETS,
        metrics=(EM, F1, Metric("LJ", judge=True)),
        recipe="recipes/arena.yaml",
        cpu_recipe="recipes/arena_hotpotqa_cpu.yaml",
        published=Published(
            citation="ARENA Table 3",
            protocol=(
                "7-8B models, 500 dev questions per dataset with their own 10-20 paragraphs, "
                "LJ by GPT-4o (2024-11-20)"
            ),
            settings=_ARENA_SETTINGS,
            rows=_grid(ARENA_DATASETS, ("EM", "F1", "LJ"), _ARENA_TABLE_3),
        ),
    ),
    "r2ag": Suite(
        name="r2ag",
        description="R2AG's Table 1: retrieval over each dataset's own paragraphs",
        paper="r2ag",
        datasets=R2AG_DATASETS,
        metrics=(
            Metric("Recall", "val/recall"),
            Metric("FR", "val/full_recall"),
            Metric("K", "val/avg_k"),
            Metric("mAP", "val/map"),
        ),
        recipe="recipes/r2ag.yaml",
        cpu_recipe="recipes/r2ag_hotpotqa_cpu.yaml",
        published=Published(
            citation="R2AG Table 1 (percentages written as fractions; K is a count)",
            protocol=(
                "steering model Qwen3-8B, multilingual-e5-large-instruct over each dataset's "
                "paragraphs, 1,000 dev questions per dataset, t = M/2, temperature 0.6, top-p 0.9"
            ),
            settings=_R2AG_SETTINGS,
            rows=_r2ag_rows(),
        ),
        dataset_settings={d: {"val_top_t": t} for d, t in R2AG_TOP_T.items()},
    ),
    "evo-rag": Suite(
        name="evo-rag",
        description="EVO-RAG's Table 3: four multi-hop benchmarks, EM / F1",
        paper="evo_rag",
        datasets=EVO_RAG_DATASETS,
        metrics=(EM, F1),
        recipe="recipes/evo_rag.yaml",
        cpu_recipe="recipes/evo_rag_hotpotqa_cpu.yaml",
        published=Published(
            citation="EVO-RAG Table 3 (percentages written as fractions; mean of 3 seeds)",
            protocol=(
                "8B models trained on 1,000 HotpotQA questions, RRF of BM25 and BGE, the "
                "official dev sets in full"
            ),
            settings=_EVO_RAG_SETTINGS,
            rows=_grid(EVO_RAG_DATASETS, ("EM", "F1"), _EVO_RAG_TABLE_3, scale=100.0),
        ),
        not_comparable={
            "bamboogle": "Bamboogle ships no paragraphs, so its questions search a corpus "
            "without their evidence (EVO-RAG names no corpus, Section 4.1)",
        },
    ),
}

#: ARENA's judge prompt (Appendix C.3, Table 8), asked with temperature 0.
ARENA_JUDGE_PROMPT = (
    "*************Consider a knowledge Q&A RAG task to test the capability of a testing model, "
    "the correct answer list is:*************\n{correct_answer}\n"
    "*************Here is the model's response:*************\n{model_response}\n"
    "*************Please check if the model's answer is correct. As long as the model's answer "
    "hits any item (or synonym) in the correct answer list, it can be considered correct. You "
    'only need to answer "yes" or "no".*************'
)


def suite(name: str) -> Suite:
    """The suite called ``name``.

    Raises:
        KeyError: No such suite (the message lists the known ones).
    """
    if name not in SUITES:
        raise KeyError(f"suite '{name}' is not known; allowed: {', '.join(SUITES)}")
    return SUITES[name]
