"""No collective inside code that only some ranks run.

A collective (Lightning's ``Trainer.log_dir``, ``strategy.broadcast``, ``barrier``, ``reduce``,
a ``sync_dist`` log, any ``torch.distributed`` call) returns only when every rank joins it; called
from rank-zero-only code it waits forever (every two-process ``lit-rag fit`` once hung at its
start: the run header read ``log_dir`` under ``@rank_zero_only``). This test reads lit-rag's
source and finds the rank-zero-only regions:

- functions decorated ``@rank_zero_only``;
- the body of ``if <...is_global_zero...>:`` / ``if <...global_rank == 0...>:``;
- the rest of a function after ``if <...not ...is_global_zero...>: return``;

and fails on any collective inside them, called directly or through a lit-rag function that
calls one (by name, transitively). The two-process CLI tests
(tests/cli/test_multiprocess_cli.py) run the real command; this one covers every callback, hook and
CLI
step, including those no recipe of those tests uses.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lit_rag"

#: attribute or function names that are collectives (or Lightning properties that run one)
COLLECTIVES = {
    "log_dir",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "gather_object",
    "reduce_scatter",
    "reduce_boolean_decision",
    "save_checkpoint",
    "new_group",
}


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


#: receivers whose calls are not collectives of the training ranks: a weight link's own
#: two-process group with one rollout worker (lit_rag/rollout/workers/transport.py; ``group``
#: where the link is being set up), which no other training rank joins
LINK_GROUPS = {"self.group", "group"}


def _on_link_group(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in COLLECTIVES
        and ast.unparse(node.value) in LINK_GROUPS
    )


def _names(node: ast.AST) -> set[str]:
    """The names a node calls (``a.b.c()`` gives c, ``f()`` gives f), the collectives it reads
    as attributes (``trainer.log_dir``), and ``sync_dist`` when set to anything but False."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if _on_link_group(sub) or (isinstance(sub, ast.Call) and _on_link_group(sub.func)):
            continue
        if isinstance(sub, ast.Attribute) and sub.attr in COLLECTIVES:
            found.add(sub.attr)
        elif isinstance(sub, ast.Call) and isinstance(sub.func, (ast.Name, ast.Attribute)):
            found.add(sub.func.id if isinstance(sub.func, ast.Name) else sub.func.attr)
        elif isinstance(sub, ast.keyword) and sub.arg == "sync_dist":
            if not (isinstance(sub.value, ast.Constant) and sub.value.value is False):
                found.add("sync_dist")
    return found


def collective_functions(trees: list[ast.AST]) -> set[str]:
    """Names of lit-rag functions that run a collective, directly or through another."""
    bodies = {}
    for tree in trees:
        for fn in _functions(tree):
            bodies.setdefault(fn.name, set()).update(_names(fn))
    tainted = COLLECTIVES | {"sync_dist"}
    while True:
        new = {name for name, used in bodies.items() if used & tainted} - tainted
        if not new:
            return tainted
        tainted |= new


def _mentions_zero(test: ast.AST) -> bool:
    text = ast.unparse(test)
    return "is_global_zero" in text or "global_rank == 0" in text or "rank == 0" in text


def rank_zero_regions(fn: ast.FunctionDef) -> list[ast.AST]:
    """The statements of ``fn`` that only rank zero runs."""
    decorators = {ast.unparse(d) for d in fn.decorator_list}
    if any("rank_zero_only" in d for d in decorators):
        return list(fn.body)
    regions: list[ast.AST] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _mentions_zero(node.test):
            negated = "not " in ast.unparse(node.test) or "!= 0" in ast.unparse(node.test)
            regions.extend(node.orelse if negated else node.body)
    body = fn.body
    for i, stmt in enumerate(body):
        if (
            isinstance(stmt, ast.If)
            and _mentions_zero(stmt.test)
            and "not " in ast.unparse(stmt.test)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], ast.Return)
        ):
            regions.extend(body[i + 1 :])
    return regions


def violations(sources: dict[str, str]) -> list[str]:
    trees = {path: ast.parse(text) for path, text in sources.items()}
    tainted = collective_functions(list(trees.values()))
    found = []
    for path, tree in trees.items():
        for fn in _functions(tree):
            for stmt in rank_zero_regions(fn):
                calls = _names(stmt) & tainted
                if calls:
                    found.append(f"{path}:{stmt.lineno} {fn.name}: {', '.join(sorted(calls))}")
    return found


def package_sources() -> dict[str, str]:
    return {
        str(p.relative_to(PACKAGE.parent)): p.read_text(encoding="utf-8")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_collective_in_rank_zero_only_code():
    assert violations(package_sources()) == []


#: the run header as it was when every two-process fit hung at its start (shortened)
HANGING_HEADER = """
from lightning.pytorch.utilities import rank_zero_only

def checkpoint_dir(trainer):
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"

class RunHeader(Callback):
    @staticmethod
    def lines(trainer, pl_module):
        return [f"logs: {trainer.default_root_dir}   checkpoints: {checkpoint_dir(trainer)}"]

    @rank_zero_only
    def on_fit_start(self, trainer, pl_module):
        for line in self.lines(trainer, pl_module):
            print(line)
"""

#: a step logger that reads ``log_dir`` after rank zero's early return
HANGING_LOGGER = """
class SampleLogger(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if outputs is None or not trainer.is_global_zero:
            return
        target = Path(trainer.log_dir) / "rollouts.jsonl"
        target.write_text("...")

    def on_fit_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.log("done", 1.0, sync_dist=True)
"""


def test_the_check_finds_the_defects_it_guards_against():
    found = violations({"header.py": HANGING_HEADER, "logger.py": HANGING_LOGGER})
    assert [line.split(" ", 1)[1] for line in found] == [
        "on_fit_start: lines",  # -> checkpoint_dir -> log_dir, through two lit-rag functions
        "on_train_batch_end: log_dir",
        "on_fit_end: sync_dist",
    ]


def test_every_rank_may_call_a_collective_outside_rank_zero_regions():
    every_rank = """
class Header(Callback):
    def on_fit_start(self, trainer, pl_module):
        log_dir = trainer.log_dir  # every rank
        if trainer.is_global_zero:
            print(log_dir)
"""
    assert violations({"ok.py": every_rank}) == []
