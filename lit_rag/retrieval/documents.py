"""A folder of plain-text documents as a retrieval corpus: every ``.txt`` and ``.md`` file under
it, cut into passages of at most ``passage_words`` words.

A document is cut at paragraph breaks (blank lines): paragraphs are packed into a passage while
they fit, and a paragraph longer than a passage is cut into windows of ``passage_words`` words.
100 words is the size of the passages of the Wikipedia corpus Search-R1 and FlashRAG search
(DPR's split). Each passage's title is its document's: the first ``# heading`` line of a
Markdown file, else the file name (``lantern-night.txt`` -> ``lantern night``); its id is the
document's path in the folder and the passage's number, ``vask-light.md#2``.

>>> split_passages("One two three.\\n\\nFour five.\\n\\nSix seven eight nine.", 5)
['One two three. Four five.', 'Six seven eight nine.']
"""

from __future__ import annotations

import re
from pathlib import Path

from lit_rag.errors import InputError
from lit_rag.types import Passage

#: the file suffixes read as documents (any case)
DOCUMENT_SUFFIXES = (".txt", ".md")
#: words per passage by default: the 100-word passages of DPR's Wikipedia split
PASSAGE_WORDS = 100

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def document_files(folder: Path) -> list[Path]:
    """The ``.txt`` and ``.md`` files under ``folder``, in path order; hidden files and folders
    (``.git``) are left out."""
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.suffix.lower() in DOCUMENT_SUFFIXES
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )


def split_passages(text: str, passage_words: int = PASSAGE_WORDS) -> list[str]:
    """``text`` in passages of at most ``passage_words`` words, cut at paragraph breaks where
    a paragraph fits; whitespace inside a passage becomes single spaces."""
    passages: list[str] = []
    current: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        words = paragraph.split()
        if current and len(current) + len(words) > passage_words:
            passages.append(" ".join(current))
            current = []
        while len(words) > passage_words:
            passages.append(" ".join(words[:passage_words]))
            words = words[passage_words:]
        current += words
    if current:
        passages.append(" ".join(current))
    return passages


def title_and_body(path: Path, text: str) -> tuple[str, str]:
    """A document's title and the text to cut into passages.

    A Markdown file's first line that is a ``# heading`` is its title (and leaves the body);
    otherwise the title is the file name without its suffix, ``-`` and ``_`` read as spaces.
    Heading marks of later Markdown headings are dropped, their words kept.
    """
    lines = text.splitlines()
    title = re.sub(r"[-_]+", " ", path.stem).strip()
    if path.suffix.lower() == ".md":
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        if first is not None and (match := _HEADING.match(lines[first].strip())):
            title = match.group(1)
            lines = lines[first + 1 :]
        lines = [
            _HEADING.sub(r"\1", line.strip()) if line.startswith("#") else line for line in lines
        ]
    return title, "\n".join(lines)


def read_documents(folder: str | Path, passage_words: int = PASSAGE_WORDS) -> list[Passage]:
    """The passages of every document under ``folder`` (see the module docstring).

    Args:
        folder: A folder of ``.txt`` and ``.md`` files (subfolders included).
        passage_words: Most words a passage holds.

    Returns:
        The passages, document by document in path order, each document's in its order; an
        empty document gives none.

    Raises:
        InputError: ``passage_words`` is under 1, the folder holds no document (or only empty
            ones), or a document is not UTF-8 text.
    """
    folder = Path(folder)
    if passage_words < 1:
        raise InputError(f"--passage-words: got {passage_words}; expected an integer >= 1")
    files = document_files(folder)
    if not files:
        raise InputError(
            f"corpus folder {folder}: no document in it; a corpus folder holds "
            f"{' or '.join(DOCUMENT_SUFFIXES)} files (a corpus file is JSONL)"
        )
    passages: list[Passage] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise InputError(
                f"{path}: not UTF-8 text (byte {err.start}); save the document as UTF-8"
            ) from None
        title, body = title_and_body(path, text)
        name = path.relative_to(folder).as_posix()
        for number, passage in enumerate(split_passages(body, passage_words), 1):
            passages.append(Passage(id=f"{name}#{number}", title=title, text=passage))
    if not passages:
        raise InputError(f"corpus folder {folder}: every document in it is empty")
    return passages
