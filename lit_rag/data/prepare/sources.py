"""Where ``lit-rag data`` reads each source from (``--source``, ``--flashrag``, ``--hub``), and
each source read as the paper's examples: ids ``<source>/<id>``, ``meta`` naming the source."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from lit_rag.data.papers import FLASHRAG_REPO, SOURCES, Paper
from lit_rag.data.readers import read_examples
from lit_rag.errors import InputError
from lit_rag.files import sha256_and_lines
from lit_rag.retrieval.corpus import detect_corpus_format
from lit_rag.types import Example


@dataclass
class Loaded:
    """A source read: its file, how it was found and its examples."""

    path: Path
    origin: str  # --source, --flashrag or --hub
    examples: list[Example] = field(default_factory=list)


def hint(name: str, spec: Paper) -> str:
    """How the user gives source ``name`` to ``spec``'s command."""
    src = SOURCES[name]
    if name in spec.paragraphs or name == "wiki18":
        return f"pass --source {name}=PATH ({src.original})"
    return f"pass --source {name}=PATH, --flashrag DIR (with {src.flashrag}) or --hub"


def resolve(
    name: str, spec: Paper, given: dict[str, Path], flashrag: Path | None, hub: bool
) -> tuple[Path, str] | None:
    """Where source ``name`` is read from, and how it was found; None when it is absent.

    Raises:
        InputError: ``--hub`` could not import huggingface_hub or download the file.
    """
    if name in given:
        return given[name], "--source"
    if name in spec.paragraphs:  # lit-rag reads FlashRAG's QA layout without paragraphs
        return None
    candidate = flashrag / SOURCES[name].flashrag if flashrag else None
    if candidate is not None and candidate.is_file():
        return candidate, "--flashrag"
    if hub and name != "wiki18":  # wiki18 is a zip of ~21M passages: fetched by hand
        return _download(name, spec), "--hub"
    return None


def _download(name: str, spec: Paper) -> Path:
    """FlashRAG's file for ``name``, from the Hub's cache (huggingface_hub, imported here)."""
    filename = SOURCES[name].flashrag
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise InputError(
            f"data: --hub needs huggingface_hub for {name}; {hint(name, spec)}"
        ) from None
    try:
        return Path(hf_hub_download(repo_id=FLASHRAG_REPO, repo_type="dataset", filename=filename))
    except Exception as exc:  # offline, not found, ...: the user can still pass the file
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise InputError(
            f"data: --hub could not download {FLASHRAG_REPO}/{filename} for {name} ({reason}); "
            f"pass --source {name}=PATH or --flashrag DIR"
        ) from None


def load(name: str, path: Path, origin: str, spec: Paper) -> Loaded:
    """Read source ``name``: ids ``<source>/<id>``, ``meta`` with ``source`` and ``dataset``.

    Raises:
        InputError: A file this paper needs paragraphs from holds none (FlashRAG's layout).
    """
    src = SOURCES[name]
    examples = read_examples(path)
    if name in spec.paragraphs and examples and not any(e.references for e in examples):
        raise InputError(
            f"data: {name} ({path}) has no paragraphs; {spec.name} needs the original layout: "
            f"{hint(name, spec)}"
        )
    seen: dict[str, int] = {}
    out = []
    for example in examples:
        base = f"{name}/{example.id}"
        seen[base] = seen.get(base, 0) + 1
        question = example.question.strip()
        if spec.question_mark and not question.endswith("?"):
            # Search-R1 scripts/data_process/qa_search_train_merge.py (and _test_merge.py):
            # "if example['question'][-1] != '?': example['question'] += '?'"
            question += "?"
        keep = name in spec.paragraphs  # a search agent retrieves; given paragraphs go unused
        out.append(
            replace(
                example,
                id=base if seen[base] == 1 else f"{base}#{seen[base]}",
                question=question,
                references=list(example.references) if keep else [],
                gold_ids=list(example.gold_ids) if keep else [],
                meta={
                    **example.meta,
                    "source": name,
                    "dataset": src.dataset,
                    "source_id": example.id,
                },
            )
        )
    return Loaded(path, origin, out)


def wiki18_entry(spec: Paper, given: dict[str, Path], flashrag: Path | None) -> dict | None:
    """The wiki18 corpus's path, format, SHA-256 and passage count (it is not copied)."""
    found = resolve("wiki18", spec, given, flashrag, hub=False)
    if found is None:
        return None
    path, origin = found
    fmt = detect_corpus_format(path)
    if fmt not in ("flashrag", "litrag"):
        raise InputError(f"data: wiki18 ({path}) is a {fmt} QA file, not a corpus (id, contents)")
    if path.stat().st_size > 1 << 30:
        print(f"lit-rag data: hashing wiki18 ({path.stat().st_size / 2**30:.1f} GiB) ...")
    digest, lines = sha256_and_lines(path)
    return {
        "path": str(path.resolve()),
        "from": origin,
        "format": fmt,
        "sha256": digest,
        "records": lines,
    }
