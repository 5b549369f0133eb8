"""``lit-rag evaluate``: a model on a paper's benchmark suite, the paper's rows beside it.

    lit-rag data search_r1 --flashrag /data/FlashRAG_datasets --eval-only
    lit-rag evaluate --suite search-r1 --limit 5
    lit-rag evaluate --suite arena --config recipes/arena.yaml untrained \\
        runs/arena/version_0/checkpoints/last.ckpt exported/arena \\
        --judge http://127.0.0.1:8000/v1 --judge-model Qwen2.5-72B-Instruct
    lit-rag evaluate --records runs/evaluate/search-r1/*/record.json

Each model is scored greedily on every dataset of the suite through the recipe's own
environment, retriever and engine (the recipe's validation decoding), and one table prints: a row
per model, a column per dataset and metric (the paper's metric: EM for the Search-R1 suite and
Eval-RAR; ARENA's EM / F1 / LJ; R2AG's Recall / FR / K / mAP; EVO-RAG's EM / F1), then the
paper's published rows, each naming its model, the closest in size first, under the protocol
they were measured with (:mod:`lit_rag.evaluate.suites`).

Models: ``untrained`` (the recipe's policy before training; the default), a lit-rag ``.ckpt``,
or a Hugging Face folder (an exported checkpoint or any model). Untrained and checkpoints share
one process; each folder runs in a child process with the recipe's policy path set to it.

Every model gets ``OUT/<model>/record.json``: the metrics and the full protocol (model and
checkpoint hashes, each dataset file's SHA-256 and question count, the retriever with its
index manifest and corpus fingerprint, top-k, the prompt templates and their hashes, decoding,
engine and library versions, lit-rag's version, ``--limit``), and
``OUT/<model>/predictions_<dataset>.jsonl`` (each question's answer and EM / F1 / LJ). Records
whose protocols differ are never shown as one table without lines naming each difference.

``--limit N`` scores the first N questions of each dataset (the table says so). A dataset whose
test file is missing is named under the table with the command that writes it, never skipped
silently. LJ (ARENA's LLM-as-a-judge, Appendix C.3) asks the judge named by ``--judge`` (any
OpenAI-compatible endpoint: OpenAI, a local ``vllm serve``) with the paper's prompt at temperature
0; without one the column shows '–'. A thinking judge gets room to reason (``--judge-max-tokens``,
1024 by default; the verdict is read after its ``</think>``) or has it turned off
(``--judge-chat-template-kwargs '{"enable_thinking": false}'``); ``--judge-extra-body`` adds
request fields.

Under the table, each setting the paper states (model size, corpus, retriever, top-k, R2AG's
t, turns, decoding, normalization, question counts, judge) is compared with the record, a line
per difference, and a setting the paper leaves unstated is named as such
(:mod:`lit_rag.evaluate.table`). A suite may set environment settings per dataset: the
R2AG suite scores each test set at Table 1's t = M/2 (HotpotQA 1, 2Wiki and MuSiQue 2) unless
an override names ``val_top_t``; each dataset's settings are kept in the record.

This module runs the command, the models and the judge; the protocol is
:mod:`lit_rag.evaluate.protocol`, the record files :mod:`lit_rag.evaluate.records`, the table
:mod:`lit_rag.evaluate.table`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lit_rag.cli.recipe_args import load_recipe
from lit_rag.errors import CommandParser, InputError
from lit_rag.evaluate.protocol import model_entry, protocol
from lit_rag.evaluate.records import (
    UNTRAINED,
    read_predictions,
    read_record,
    short_label,
    slug,
    write_record,
)
from lit_rag.evaluate.suites import ARENA_JUDGE_PROMPT, SUITES, Suite
from lit_rag.evaluate.table import render
from lit_rag.judges import Judge, JudgeCase, Verdict

#: environment settings recorded per dataset (the suite may set them per dataset): R2AG's
#: top-t/x and whether predicted queries retrieve
PER_DATASET = ("val_top_t", "val_predicted_queries")

USAGE = (
    "lit-rag evaluate --suite NAME [--config RECIPE] [MODEL ...] [--data DIR] [--limit N] "
    "[--out DIR] [--judge URL --judge-model NAME] [--recipe overrides]; "
    "lit-rag evaluate --records RECORD.json [RECORD.json ...]"
)


#: ``lit-rag evaluate --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = """\
Score models on a paper's benchmark suite, beside the paper's results.

  lit-rag evaluate --suite search-r1 --limit 5
  lit-rag evaluate --suite arena --config recipes/arena.yaml untrained \\
      runs/arena/version_0/checkpoints/last.ckpt exported/arena \\
      --judge http://127.0.0.1:8000/v1 --judge-model Qwen2.5-72B-Instruct
  lit-rag evaluate --records runs/evaluate/search-r1/*/record.json

Each model answers every test set of the suite greedily, through the recipe's environment,
retriever and engine. One table prints: a row per model, the paper's published rows under
it. Each model's record.json (metrics and the full protocol) and predictions go to --out.
The test sets come from lit-rag data; recipe overrides work as for lit-rag validate."""


def build_parser() -> CommandParser:
    """The parser of ``lit-rag evaluate`` (recipe overrides are what it leaves)."""
    parser = CommandParser(
        "evaluate",
        USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="untrained (the recipe's policy; the default), .ckpt files, model folders",
    )
    parser.add_argument(
        "--suite",
        type=suite_name,
        metavar="NAME",
        help=f"the benchmark suite: {', '.join(SUITES)} (_ for -, as lit-rag data writes them)",
    )
    parser.add_argument(
        "--config", metavar="RECIPE", help="the recipe (default: the suite's recipe)"
    )
    parser.add_argument(
        "--data", metavar="DIR", help="folder of test_<dataset>.jsonl (default data/<paper>)"
    )
    parser.add_argument(
        "--limit", type=int, metavar="N", help="the first N questions of each dataset"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="records and predictions (default runs/evaluate/<suite>)"
    )
    parser.add_argument(
        "--judge", metavar="URL", help="OpenAI-compatible endpoint of the LJ judge (.../v1)"
    )
    parser.add_argument("--judge-model", metavar="NAME", help="the judge's model name there")
    parser.add_argument(
        "--judge-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding the judge's API key (default: OPENAI_API_KEY)",
    )
    add_judge_request_options(parser)
    parser.add_argument(
        "--records", nargs="+", metavar="RECORD", help="print the table of saved record.json files"
    )
    # a child process evaluating one model folder: write the record, print no table
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--record-only", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(args: list[str]) -> None:
    """``lit-rag evaluate``: see the module docstring."""
    options, overrides = build_parser().parse_known_args(args)
    check_options(options, overrides)
    if options.records:
        records = [read_record(path) for path in options.records]
        print(render(SUITES[records[0]["suite"]], records))
        return
    suite = SUITES[options.suite]
    recipe = options.config or default_recipe(suite)
    folder = Path(options.data or f"data/{suite.paper}")
    files, absent = test_files(suite, folder)
    out = Path(options.out or f"runs/evaluate/{suite.name}")
    records = score_models(options, suite, recipe, overrides, files, out)
    if options.judge and any(m.judge for m in suite.metrics):
        judge = judge_settings(options)
        for record in records:
            add_judgements(record, out, judge)
    for record in records:
        record["absent"] = absent
        write_record(record, out)
    if options.record_only:
        return
    print(render(suite, records))


def suite_name(name: str) -> str:
    """The suite ``--suite NAME`` names: ``search_r1`` (as ``lit-rag data`` spells the paper) is
    ``search-r1``."""
    return name.replace("_", "-")


def check_options(options: argparse.Namespace, overrides: list[str]) -> None:
    """Fail in one line on what the parser cannot check: a word that is no option, and (unless
    ``--records`` only prints saved records) no suite, a limit under 1, half a judge."""
    unknown = [word for word in overrides if not word.startswith("--")]
    if unknown:
        raise InputError(f"evaluate: {unknown[0]!r} is not an option (usage: {USAGE})")
    if options.records:
        return
    if options.suite is None:
        raise InputError(f"evaluate: name a suite with --suite ({', '.join(SUITES)})")
    if options.suite not in SUITES:
        spelled = ", ".join(name.replace("-", "_") for name in SUITES if "-" in name)
        raise InputError(
            f"evaluate: unknown suite {options.suite!r}; suites: {', '.join(SUITES)} "
            f"(also written {spelled})"
        )
    if options.config is not None:
        load_recipe(options.config)  # a missing or broken recipe: one line, before any model
    if options.limit is not None and options.limit < 1:
        raise InputError(f"evaluate: --limit must be >= 1, got {options.limit}")
    if bool(options.judge) != bool(options.judge_model):
        raise InputError("evaluate: --judge and --judge-model go together (endpoint and model)")


# ---- what to evaluate ---------------------------------------------------------------------


def default_recipe(suite: Suite) -> str:
    """The suite's paper recipe on a machine with a CUDA GPU, its CPU recipe elsewhere."""
    import torch

    if torch.cuda.is_available():
        recipe = suite.recipe
    else:
        recipe = suite.cpu_recipe
        print(f"lit-rag evaluate: no GPU: {recipe} (the paper recipe: --config {suite.recipe})")
    return recipe


def test_files(suite: Suite, folder: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The suite's test files present in ``folder``, and why each absent one is absent.

    Raises:
        InputError: Not one of them is there.
    """
    from lit_rag.data.papers import test_files as paper_test_files

    written = paper_test_files(suite.paper, folder)  # where lit-rag data writes each
    present, absent = {}, {}
    for name in suite.datasets:
        path = written[name]
        if path.is_file():
            present[name] = path
        else:
            absent[name] = str(path)
    if not present:
        raise InputError(
            f"evaluate: no test file of suite {suite.name} in {folder} (test_<dataset>.jsonl for "
            f"{', '.join(suite.datasets)}): write them with lit-rag data {suite.paper} "
            f"(lit-rag data --list names its sources), or point --data at a folder that has them"
        )
    return present, absent


def classify(model: str) -> tuple[str, str]:
    """``(kind, path)``: ``untrained``, ``checkpoint`` (a ``.ckpt`` file) or ``folder``.

    Raises:
        InputError: Neither ``untrained``, a file nor a folder.
    """
    if model == UNTRAINED:
        return "untrained", UNTRAINED
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").exists() and not list(path.glob("*.gguf")):
            raise InputError(
                f"evaluate: model folder '{model}' has no config.json (a Hugging Face model "
                "folder, e.g. from lit-rag export) and no .gguf file"
            )
        return "folder", str(path)
    if path.is_file():
        from lit_rag.checkpoints.storage import check_checkpoint_file

        check_checkpoint_file(path)
        return "checkpoint", str(path)
    raise InputError(
        f"evaluate: model '{model}' does not exist; a model is 'untrained', a lit-rag .ckpt "
        "file or a Hugging Face model folder"
    )


# ---- running ------------------------------------------------------------------------------


def score_models(
    options: argparse.Namespace,
    suite: Suite,
    recipe: str,
    overrides: list[str],
    files: dict[str, Path],
    out: Path,
) -> list[dict]:
    """One record per model named: the untrained policy and checkpoints first (in this
    process, one policy and engine), then each model folder (in a child process)."""
    models = [classify(m) for m in (options.models or [UNTRAINED])]
    in_process = [m for m in models if m[0] != "folder"]
    children = [path for kind, path in models if kind == "folder"]
    if options.label:  # the child of _evaluate_folder: the recipe's policy is the folder
        in_process, children = [("folder", options.label)], []
    records = []
    if in_process:
        records += evaluate_models(
            suite, recipe, overrides, files, options.limit, in_process, out, options.label
        )
    for path in children:
        records.append(_evaluate_folder(options, recipe, overrides, path, out))
    return records


def evaluate_models(
    suite: Suite,
    recipe: str,
    overrides: list[str],
    files: dict[str, Path],
    limit: int | None,
    models: list[tuple[str, str]],
    out: Path,
    label: str | None = None,
) -> list[dict]:
    """Score the untrained policy and checkpoints of one recipe, dataset by dataset, in this
    process; returns one record per model (metrics, predictions, protocol)."""
    cli, capture = _validation_cli(recipe, overrides)
    trainer, module, data = cli.trainer, cli.model, cli.datamodule
    records = []
    for kind, path in models:
        name = label or path
        record: dict[str, Any] = {
            "suite": suite.name,
            "model": model_entry(kind, path, name, module),
            "metrics": {},
            "questions": {},
            "predictions": {},
        }
        used = {}
        for dataset, file in files.items():
            data.use_val(str(file), limit)
            capture.begin(name, dataset, len(data.val_examples()))
            ckpt = path if kind == "checkpoint" else None
            with dataset_settings(suite, dataset, module.environment, overrides) as used[dataset]:
                (metrics,) = trainer.validate(
                    module, datamodule=data, ckpt_path=ckpt, verbose=False
                )
            record["metrics"][dataset] = {
                m.title: float(metrics[m.key]) for m in suite.metrics if m.key in metrics
            }
            record["questions"][dataset] = len(capture.rows)
            record["predictions"][dataset] = capture.rows
        record["model"]["parameters"] = _parameters(module)
        record["protocol"] = protocol(recipe, overrides, files, limit, cli)
        for dataset, settings in used.items():
            record["protocol"]["datasets"][dataset].update(settings)
        records.append(record)
    return records


@contextmanager
def dataset_settings(suite: Suite, dataset: str, environment, overrides: list[str]):
    """Set the suite's environment settings for ``dataset`` (R2AG's t = M/2 per test set)
    while it is scored, then restore the recipe's; yields what the dataset ran with
    (:data:`PER_DATASET`, e.g. ``{"val_top_t": 1, "val_predicted_queries": True}``).

    A setting a recipe override names (``--model.environment.init_args.val_top_t=4``) is the
    user's choice: it stays for every dataset.
    """
    wanted = {
        key: value
        for key, value in suite.dataset_settings.get(dataset, {}).items()
        if hasattr(environment, key) and not any(f".{key}=" in o for o in overrides)
    }
    saved = {key: getattr(environment, key) for key in wanted}
    for key, value in wanted.items():
        setattr(environment, key, value)
    try:
        yield {k: getattr(environment, k) for k in PER_DATASET if hasattr(environment, k)}
    finally:
        for key, value in saved.items():
            setattr(environment, key, value)


def _validation_cli(recipe: str, overrides: list[str]):
    """The recipe's LightningCLI, built but not run, set up to validate every question of a
    file on one device and to capture the predictions: ``(cli, capture)``.

    Raises:
        InputError: The recipe does not train a policy on QA data.
    """
    from lightning.pytorch.callbacks import ProgressBar
    from lightning.pytorch.cli import SaveConfigCallback

    from lit_rag.cli.fit import build_cli
    from lit_rag.data.datamodule import QADataModule

    # a checkpoint written in another run's folder: true of every model evaluated here
    warnings.filterwarnings("ignore", message="The dirpath has changed")
    cli = build_cli(
        [
            "--config",
            recipe,
            *overrides,
            "--trainer.logger=false",
            "--trainer.devices=1",
            "--trainer.num_nodes=1",
            "--trainer.strategy=auto",
            "--trainer.limit_val_batches=1.0",  # every question: --limit is how to cut
        ],
        run=False,
    )
    trainer, module, data = cli.trainer, cli.model, cli.datamodule
    if not isinstance(data, QADataModule) or not hasattr(module, "val_sampling"):
        raise InputError(f"evaluate: recipe {recipe} does not train a policy on QA data")
    capture = _Capture()
    # no config.yaml in the working directory, and our progress lines instead of a bar per
    # dataset
    trainer.callbacks[:] = [
        c for c in trainer.callbacks if not isinstance(c, (SaveConfigCallback, ProgressBar))
    ] + [capture]
    return cli, capture


def _evaluate_folder(
    options: argparse.Namespace, recipe: str, overrides: list[str], folder: str, out: Path
) -> dict:
    """One model folder in a child ``lit-rag evaluate`` (a fresh policy and engine)."""
    command = [
        sys.executable,
        "-m",
        "lit_rag",
        "evaluate",
        "--suite",
        options.suite,
        "--config",
        recipe,
        "--out",
        str(out),
        "--record-only",
        "--label",
        folder,
        *(["--data", options.data] if options.data else []),
        *(["--limit", str(options.limit)] if options.limit else []),
        UNTRAINED,
        *overrides,
        f"--model.policy.path={folder}",
        "--model.policy.gguf_file=null",
        "--model.policy.tiny=null",
    ]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise InputError(f"evaluate: model folder {folder} failed (exit {done.returncode}) above")
    record = read_record(out / slug(folder) / "record.json")
    for dataset in record["metrics"]:
        record["predictions"][dataset] = read_predictions(out / slug(folder), dataset)
    return record


class _Capture:
    """Collects each validation batch's predictions and shows progress on long datasets."""

    def __new__(cls):
        from lightning.pytorch.callbacks import Callback

        class Capture(Callback):
            def begin(self, model: str, dataset: str, total: int) -> None:
                self.model, self.dataset, self.total = model, dataset, total
                self.rows: list[dict] = []
                self.shown = 0

            def on_validation_batch_end(
                self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
            ) -> None:
                self.rows += (outputs or {}).get("predictions", [])
                step = max(1, self.total // 10)
                if len(self.rows) - self.shown >= step or len(self.rows) == self.total:
                    self.shown = len(self.rows)
                    print(
                        f"lit-rag evaluate: {short_label(self.model)} on {self.dataset}: "
                        f"{len(self.rows)}/{self.total} questions",
                        file=sys.stderr,
                        flush=True,
                    )

        return Capture()


def _parameters(module) -> int:
    model = getattr(module, "model", None)
    return int(sum(p.numel() for p in model.parameters())) if model is not None else 0


# ---- LLM-as-a-judge ------------------------------------------------------------------------


def add_judge_request_options(parser: CommandParser) -> None:
    """``--judge-max-tokens``, ``--judge-chat-template-kwargs``, ``--judge-extra-body``,
    ``--judge-template-opens-think``: what each request to the judge carries
    (:class:`~lit_rag.judges.Judge`'s settings of those names)."""
    parser.add_argument(
        "--judge-max-tokens",
        type=int,
        default=1024,
        metavar="N",
        help="the judge's reply budget, reasoning included (default: 1024)",
    )
    parser.add_argument(
        "--judge-chat-template-kwargs",
        type=json_mapping,
        metavar="JSON",
        help="the judge's chat template arguments, e.g. '{\"enable_thinking\": false}'",
    )
    parser.add_argument(
        "--judge-extra-body",
        type=json_mapping,
        metavar="JSON",
        help="more fields for each request to the judge, e.g. '{\"top_p\": 1.0}'",
    )
    parser.add_argument(
        "--judge-template-opens-think",
        action="store_true",
        help="the judge's chat template opens <think> in the prompt (QwQ, DeepSeek-R1)",
    )


def json_mapping(text: str) -> dict:
    """A JSON object given on the command line (argparse names the flag when it is not one)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


def judge_settings(options: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~lit_rag.judges.Judge` settings the ``--judge*`` options name."""
    return {
        "base_url": options.judge,
        "model": options.judge_model,
        "api_key_env": options.judge_key_env,
        "max_tokens": options.judge_max_tokens,
        "chat_template_kwargs": options.judge_chat_template_kwargs,
        "extra_body": options.judge_extra_body,
        "template_opens_think": options.judge_template_opens_think,
    }


def add_judgements(record: dict, out: Path, judge: dict[str, Any]) -> None:
    """ARENA's LJ (Appendix C.3) on each prediction, and its mean per dataset: the first yes /
    no of the judge's reply after its reasoning (a reply with neither is a no); a failed call
    or a reply cut off inside its reasoning stops with one line. ``judge``: the
    :class:`~lit_rag.judges.Judge` settings of the ``--judge*`` options (:func:`judge_settings`)."""
    url, model = judge["base_url"], judge["model"]
    try:
        lj = Judge(
            **judge,
            # ARENA's prompt in the judge's field names; its text is unchanged
            prompt=ARENA_JUDGE_PROMPT.format(
                correct_answer="{answers}", model_response="{response}"
            ),
            score="yes_no",
            temperature=0.0,
            timeout_s=600.0,  # the openai client's default read timeout
            retries=3,
            max_concurrency=8,
        )
    except InputError as err:  # the openai package is missing, a request setting is wrong
        raise InputError(f"evaluate: --judge: {err}") from None
    for dataset, rows in record["predictions"].items():
        verdicts = lj.scores([JudgeCase("", row["answers"], row["prediction"]) for row in rows])
        failed = next((v for v in verdicts if v.score is None and v.error != "unparsable"), None)
        if failed is not None:
            raise InputError(
                f"evaluate: judge {model} at {url} failed: {judge_failure(failed, lj)}"
            )
        for row, verdict in zip(rows, verdicts, strict=True):
            row["lj"] = verdict.score or 0.0
        if rows:
            record["metrics"][dataset]["LJ"] = sum(row["lj"] for row in rows) / len(rows)
    settings = {k: v for k, v in judge.items() if k != "api_key_env" and v is not None}
    record.setdefault("protocol", {})["judge"] = settings


def judge_failure(verdict: Verdict, judge: Judge) -> str:
    """Why the judge gave ``verdict`` no score, and what to change."""
    if verdict.error.startswith("reasoning not finished"):
        return (
            f"{verdict.error} ({judge.max_tokens}); raise --judge-max-tokens or turn thinking "
            "off: --judge-chat-template-kwargs '{\"enable_thinking\": false}'"
        )
    return f"{verdict.error} after {judge.retries} retries"
