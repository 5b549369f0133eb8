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
they were measured with (:mod:`lit_rag.suites`).

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
0; without one the column shows '–'.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from lit_rag.errors import CommandParser, InputError
from lit_rag.suites import ARENA_JUDGE_PROMPT, DATASET_TITLES, SUITES, Suite

USAGE = (
    "lit-rag evaluate --suite NAME [--config RECIPE] [MODEL ...] [--data DIR] [--limit N] "
    "[--out DIR] [--judge URL --judge-model NAME] [--recipe overrides]; "
    "lit-rag evaluate --records RECORD.json [RECORD.json ...]"
)
UNTRAINED = "untrained"
DASH = "–"
#: weight files hashed for a model folder's fingerprint
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


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
    parser.add_argument("--suite", choices=list(SUITES), help="the benchmark suite")
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
    unknown = [word for word in overrides if not word.startswith("--")]
    if unknown:
        raise InputError(f"evaluate: {unknown[0]!r} is not an option (usage: {USAGE})")
    if options.records:
        records = [read_record(path) for path in options.records]
        print(render(SUITES[records[0]["suite"]], records))
        return
    if options.suite is None:
        raise InputError(f"evaluate: name a suite with --suite ({', '.join(SUITES)})")
    if options.limit is not None and options.limit < 1:
        raise InputError(f"evaluate: --limit must be >= 1, got {options.limit}")
    if bool(options.judge) != bool(options.judge_model):
        raise InputError("evaluate: --judge and --judge-model go together (endpoint and model)")
    suite = SUITES[options.suite]
    recipe = options.config or default_recipe(suite)
    folder = Path(options.data or f"data/{suite.paper}")
    files, absent = test_files(suite, folder)
    out = Path(options.out or f"runs/evaluate/{suite.name}")
    models = [classify(m) for m in (options.models or [UNTRAINED])]
    judge = (options.judge, options.judge_model, options.judge_key_env) if options.judge else None
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
    if judge is not None and any(m.judge for m in suite.metrics):
        for record in records:
            add_judgements(record, out, judge)
    for record in records:
        record["absent"] = absent
        write_record(record, out)
    if options.record_only:
        return
    print(render(suite, records))


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
        from lit_rag.checkpointing import check_checkpoint_file

        check_checkpoint_file(path)
        return "checkpoint", str(path)
    raise InputError(
        f"evaluate: model '{model}' does not exist; a model is 'untrained', a lit-rag .ckpt "
        "file or a Hugging Face model folder"
    )


# ---- running ------------------------------------------------------------------------------


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
    from lightning.pytorch.callbacks import ProgressBar
    from lightning.pytorch.cli import SaveConfigCallback

    from lit_rag.cli import build_cli
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
    records = []
    for kind, path in models:
        name = label or path
        record: dict[str, Any] = {
            "suite": suite.name,
            "model": _model_entry(kind, path, name, module),
            "metrics": {},
            "questions": {},
            "predictions": {},
        }
        for dataset, file in files.items():
            data.use_val(str(file), limit)
            capture.begin(name, dataset, len(data.val_examples()))
            ckpt = path if kind == "checkpoint" else None
            (metrics,) = trainer.validate(module, datamodule=data, ckpt_path=ckpt, verbose=False)
            record["metrics"][dataset] = {
                m.title: float(metrics[m.key]) for m in suite.metrics if m.key in metrics
            }
            record["questions"][dataset] = len(capture.rows)
            record["predictions"][dataset] = capture.rows
        record["model"]["parameters"] = _parameters(module)
        record["protocol"] = protocol(recipe, overrides, files, limit, cli)
        records.append(record)
    return records


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
                        f"lit-rag evaluate: {_short(self.model)} on {self.dataset}: "
                        f"{len(self.rows)}/{self.total} questions",
                        file=sys.stderr,
                        flush=True,
                    )

        return Capture()


def _parameters(module) -> int:
    model = getattr(module, "model", None)
    return int(sum(p.numel() for p in model.parameters())) if model is not None else 0


# ---- the protocol --------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_fingerprint(path: Path) -> str:
    """SHA-256 of a weights file, or over a folder's weight files (names and contents)."""
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES):
        digest.update(f"{file.name}:{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def _model_entry(kind: str, path: str, name: str, module) -> dict:
    from lit_rag.models import resolve_path

    config = module.policy_config
    entry: dict[str, Any] = {"label": name, "kind": kind}
    if kind == "checkpoint":
        entry["checkpoint"] = path
        entry["checkpoint_sha256"] = sha256_file(Path(path))
    if config.tiny is not None:
        entry["base"] = {"tiny": dataclasses.asdict(config.tiny)}
    else:
        resolved = resolve_path(config.path)
        base: dict[str, Any] = {"path": config.path}
        if isinstance(resolved, Path) and resolved.exists():
            base["weights_sha256"] = weights_fingerprint(resolved)
        entry["base"] = base
    entry["base"].update(
        dtype=config.dtype,
        lora=dataclasses.asdict(config.lora) if config.lora is not None else None,
        quantization=config.quantization,
    )
    return entry


def protocol(
    recipe: str, overrides: list[str], files: dict[str, Path], limit: int | None, cli
) -> dict:
    """Everything besides the model that decides a score (compared between records)."""
    import torch
    import transformers

    import lit_rag

    module, data = cli.model, cli.datamodule
    environment = module.environment
    engine = module.engine
    engine_info = {"class": _class_path(engine), "transformers": transformers.__version__}
    if "vllm" in sys.modules:
        engine_info["vllm"] = getattr(sys.modules["vllm"], "__version__", "?")
    return {
        "lit_rag": lit_rag.__version__,
        "recipe": {"path": recipe, "sha256": sha256_file(Path(recipe))},
        "overrides": list(overrides),
        "datasets": {
            name: {"file": str(path), "sha256": sha256_file(path), "limit": limit}
            for name, path in files.items()
        },
        "environment": _class_path(environment),
        "retriever": _retriever(getattr(environment, "retriever", None)),
        "top_k": {
            key: getattr(environment, key)
            for key in ("top_k", "val_top_k", "max_turns", "t_max")
            if isinstance(getattr(environment, key, None), int)
        },
        "prompts": _prompts(environment),
        "max_references": data.max_references,
        "decoding": dataclasses.asdict(module.val_sampling),
        "answer_punctuation": module.val_em.punctuation,
        "engine": engine_info,
        "torch": torch.__version__,
    }


def _class_path(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _retriever(retriever: Any) -> dict | None:
    if retriever is None:
        return None
    entry: dict[str, Any] = {"class": _class_path(retriever)}
    for key in ("index", "corpus"):
        value = getattr(retriever, key, None)
        if isinstance(value, (str, Path)):
            entry[key] = str(value)
    manifest = getattr(retriever, "manifest", None)
    if manifest is not None and dataclasses.is_dataclass(manifest):
        entry["manifest"] = json.loads(json.dumps(dataclasses.asdict(manifest), default=str))
        entry["corpus_fingerprint"] = getattr(manifest, "corpus_fingerprint", None)
    parts = retriever.parts() if hasattr(retriever, "parts") else []
    if parts and parts != [retriever]:
        entry["parts"] = [_retriever(p) for p in parts]
    return entry


def _prompts(environment: Any) -> dict:
    """The environment's prompt texts (attributes named ``*prompt*`` / ``*template*``)."""
    out = {}
    for key, value in sorted(vars(environment).items()):
        if isinstance(value, str) and ("prompt" in key or "template" in key):
            out[key] = {"sha256": hashlib.sha256(value.encode()).hexdigest(), "text": value}
    return out


def protocol_differences(records: list[dict]) -> list[str]:
    """One line per protocol field whose value is not the same in every record."""
    flat = [_flatten(r.get("protocol", {})) for r in records]
    keys = sorted(set().union(*flat))
    lines = []
    for key in keys:
        values = [f.get(key, "(absent)") for f in flat]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            shown = " vs ".join(_clip(v) for v in values)
            lines.append(f"protocol differs in {key}: {shown}")
    for dataset in sorted({d for r in records for d in r.get("questions", {})}):
        counts = [r.get("questions", {}).get(dataset) for r in records]
        if len(set(counts)) > 1:
            lines.append(f"questions differ on {dataset}: {' vs '.join(map(str, counts))}")
    return lines


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "text":  # a prompt's text: its hash beside it says the same
                continue
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _clip(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


# ---- LLM-as-a-judge ------------------------------------------------------------------------


def add_judgements(record: dict, out: Path, judge: tuple[str, str, str]) -> None:
    """ARENA's LJ (Appendix C.3) on each prediction, and its mean per dataset."""
    from concurrent.futures import ThreadPoolExecutor

    url, model, key_env = judge
    try:
        from openai import OpenAI, OpenAIError
    except ImportError:
        raise InputError(
            "evaluate: --judge needs the openai package: pip install 'lit-rag[judge]'"
        ) from None
    client = OpenAI(base_url=url, api_key=os.environ.get(key_env) or "EMPTY", max_retries=3)

    def ask(row: dict) -> bool:
        text = ARENA_JUDGE_PROMPT.format(
            correct_answer=json.dumps(row["answers"], ensure_ascii=False),
            model_response=row["prediction"],
        )
        try:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                max_tokens=4,
                temperature=0.0,
            )
        except OpenAIError as err:
            raise InputError(
                f"evaluate: judge {model} at {url} failed: {type(err).__name__}: {err}"
            ) from None
        content = (reply.choices[0].message.content or "") if reply.choices else ""
        return judge_verdict(content)

    for dataset, rows in record["predictions"].items():
        with ThreadPoolExecutor(max_workers=8) as pool:
            verdicts = list(pool.map(ask, rows))
        for row, verdict in zip(rows, verdicts):
            row["lj"] = float(verdict)
        if rows:
            record["metrics"][dataset]["LJ"] = sum(verdicts) / len(verdicts)
    record.setdefault("protocol", {})["judge"] = {"base_url": url, "model": model}


def judge_verdict(reply: str) -> bool:
    """True when the first yes / no word of a judge's reply is yes; never raises."""
    match = re.search(r"\b(yes|no)\b", reply or "", re.IGNORECASE)
    return bool(match) and match.group(1).lower() == "yes"


# ---- records -------------------------------------------------------------------------------


def slug(label: str) -> str:
    """A folder name for a model: ``untrained``, or its path's last parts."""
    if label == UNTRAINED:
        return label
    parts = [p for p in Path(label).parts[-4:] if p not in ("checkpoints", "/", "..", ".")]
    text = "_".join(parts[-3:]) or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)


def write_record(record: dict, out: Path) -> Path:
    """``OUT/<model>/record.json`` and one predictions file per dataset."""
    folder = out / slug(record["model"]["label"])
    folder.mkdir(parents=True, exist_ok=True)
    for dataset, rows in record.get("predictions", {}).items():
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        _write(folder / f"predictions_{dataset}.jsonl", lines)
    saved = {k: v for k, v in record.items() if k != "predictions"}
    saved["predictions"] = {d: f"predictions_{d}.jsonl" for d in record.get("predictions", {})}
    _write(folder / "record.json", json.dumps(saved, indent=2, default=str) + "\n")
    return folder / "record.json"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def read_record(path: str | Path) -> dict:
    """A record written by ``lit-rag evaluate``.

    Raises:
        InputError: Missing, not JSON, or not a record of a known suite.
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"evaluate: record '{path}' does not exist")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"evaluate: record '{path}' is not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("suite") not in SUITES:
        raise InputError(
            f"evaluate: '{path}' is not a lit-rag evaluate record (it needs a 'suite' of "
            f"{', '.join(SUITES)})"
        )
    if not isinstance(record.get("metrics"), dict) or not isinstance(record.get("model"), dict):
        raise InputError(f"evaluate: record '{path}' lacks its 'metrics' or 'model'")
    return record


def read_predictions(folder: Path, dataset: str) -> list[dict]:
    path = folder / f"predictions_{dataset}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


# ---- the table -----------------------------------------------------------------------------


def render(suite: Suite, records: list[dict]) -> str:
    """The table: our rows, the paper's rows, and notes (limit, absent data, protocol)."""
    other = [r["suite"] for r in records if r["suite"] != suite.name]
    if other:
        raise InputError(
            f"evaluate: records of different suites ({suite.name}, {other[0]}) in one table"
        )
    columns = [(d, m) for d in suite.datasets for m in suite.metrics]
    titles = [
        DATASET_TITLES[d] if len(suite.metrics) == 1 else f"{DATASET_TITLES[d]} {m.title}"
        for d, m in columns
    ]
    if suite.average:
        titles.append("Avg")
    header = ["model", *titles]
    rows = [header]
    for record in records:
        cells = []
        for dataset, metric in columns:
            values = record["metrics"].get(dataset)
            if values is None:
                cells.append("absent")
            elif metric.title in values:
                cells.append(_number(values[metric.title], metric.title))
            else:
                cells.append(DASH)
        if suite.average:
            cells.append(_average(record, suite))
        rows.append([_row_title(record), *cells])
    published = suite.published
    params = max((r["model"].get("parameters", 0) for r in records), default=0)
    ordered = sorted(
        published.rows,
        key=lambda row: abs(math.log(row.params_b * 1e9) - math.log(params)) if params else 0,
    )
    separator = len(rows)
    for row in ordered:
        cells = [
            DASH
            if row.values.get((d, m.title)) is None
            else _number(row.values[(d, m.title)], m.title)
            for d, m in columns
        ]
        if suite.average:
            values = [row.values.get((d, suite.metrics[0].title)) for d in suite.datasets]
            cells.append(
                DASH if None in values else f"{sum(values) / len(values):.3f}"  # type: ignore[arg-type]
            )
        rows.append([row.name, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    metric_names = "/".join(m.title for m in suite.metrics)
    out = [f"suite {suite.name}: {suite.description} ({metric_names})", ""]
    out += [line(rows[0]), *(line(r) for r in rows[1:separator])]
    out += ["", f"published: {published.citation}: {published.protocol}"]
    out += [line(r) for r in rows[separator:]]
    out += [""] + notes(suite, records)
    return "\n".join(out)


def notes(suite: Suite, records: list[dict]) -> list[str]:
    """What a reader must know to compare the rows: limits, absent data, protocol."""
    lines = []
    limits = sorted(
        {
            d.get("limit")
            for r in records
            for d in r.get("protocol", {}).get("datasets", {}).values()
            if d.get("limit")
        }
    )
    if limits:
        counts = ", ".join(
            f"{DATASET_TITLES[d]} {n}" for d, n in records[0].get("questions", {}).items()
        )
        lines.append(
            f"cut: the first {'/'.join(map(str, limits))} questions of each dataset (--limit; "
            f"scored: {counts}); the published rows score {published_questions(suite)}"
        )
    absent = sorted({d for r in records for d in r.get("absent", {})})
    if absent:
        paths = records[0].get("absent", {})
        lines.append(
            f"absent: {', '.join(DATASET_TITLES[d] for d in absent)} "
            f"(no {', '.join(paths.get(d, d) for d in absent)}): "
            f"write them with lit-rag data {suite.paper} (lit-rag data --list names the sources)"
        )
    if any(m.judge for m in suite.metrics) and not any(
        "LJ" in v for r in records for v in r["metrics"].values()
    ):
        lines.append(
            f"{DASH} under LJ: no judge; name one with --judge URL --judge-model NAME "
            "(any OpenAI-compatible endpoint, e.g. a local vllm serve)"
        )
    if records:
        lines.append("this run: " + protocol_summary(records[0]))
    lines += protocol_differences(records) if len(records) > 1 else []
    return lines


def published_questions(suite: Suite) -> str:
    return suite.published.settings.get("questions", "the paper's splits")


def protocol_summary(record: dict) -> str:
    """Model-independent protocol in a line: retriever, corpus, top-k, engine, recipe."""
    p = record.get("protocol", {})
    retriever = p.get("retriever") or {}
    parts = [f"recipe {p.get('recipe', {}).get('path', '?')}"]
    if retriever:
        name = (retriever.get("class") or "?").rsplit(".", 1)[-1]
        corpus = retriever.get("corpus") or retriever.get("index") or "?"
        fingerprint = retriever.get("corpus_fingerprint")
        parts.append(
            f"retriever {name} over {corpus}"
            + (f" (corpus {fingerprint[:12]})" if fingerprint else "")
        )
    else:
        parts.append("no retriever (the references in the prompt)")
    for key, value in (p.get("top_k") or {}).items():
        parts.append(f"{key} {value}")
    engine = p.get("engine") or {}
    if engine:
        name = (engine.get("class") or "?").rsplit(".", 1)[-1]
        version = engine.get("vllm") or engine.get("transformers")
        parts.append(f"engine {name} {version}")
    decoding = p.get("decoding") or {}
    if decoding:
        temperature, budget = decoding.get("temperature"), decoding.get("max_new_tokens")
        parts.append(f"temperature {temperature}, {budget} new tokens")
    return "; ".join(parts)


def _average(record: dict, suite: Suite) -> str:
    title = suite.metrics[0].title
    values = [record["metrics"].get(d, {}).get(title) for d in suite.datasets]
    have = [v for v in values if v is not None]
    if not have:
        return DASH
    mean = f"{sum(have) / len(have):.3f}"
    return mean if len(have) == len(values) else f"{mean} ({len(have)}/{len(values)})"


def _number(value: float, title: str) -> str:
    return f"{value:.2f}" if title == "K" else f"{value:.3f}"


def _row_title(record: dict) -> str:
    """``untrained (<base model file>)`` or the checkpoint's / folder's last path parts."""
    model = record["model"]
    if model["label"] != UNTRAINED:
        return _short(model["label"])
    base = model.get("base", {})
    name = Path(base["path"]).name if base.get("path") else "tiny random"
    return f"untrained ({name})"


def _short(label: str) -> str:
    if label == UNTRAINED:
        return label
    parts = [p for p in Path(label).parts[-4:] if p != "checkpoints"]
    return "/".join(parts[-3:])
