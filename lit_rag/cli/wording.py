"""The help of ``lit-rag fit`` (validate, test) in lit-rag's words.

LightningCLI builds the options of the trainer commands from the signatures and docstrings of
the Trainer, lit-rag's modules and the Trainer's methods, so as built its help speaks of
Lightning's API: group titles from docstrings ("Runs the full optimization routine"), Sphinx
markup, the model registry, and as "known subclasses" whatever classes Python has imported.
Here the parser of each command is reworded once it is built (:func:`reword`) and printed
through :class:`TrainerHelpFormatter`:

- each group of options gets a title from :data:`~lit_rag.cli.help.TRAINER_GROUPS` and
  :data:`~lit_rag.cli.help.RUN_GROUPS`;
- ``--ckpt_path``, ``--config``, ``--seed_everything``, ``--weights_only`` get lit-rag's texts;
- every text shows without markup (:func:`~lit_rag.cli.help.plain`);
- an option holding a plugin (``--model.reward``) lists the registered names a recipe writes,
  and its ``.help NAME`` takes them (the names are rewritten to class paths with the rest of
  the command line, :mod:`lit_rag.cli.recipe_args`).

The texts themselves are plain strings in :mod:`lit_rag.cli.help`.
"""

from __future__ import annotations

import argparse
import re
import textwrap

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser

from lit_rag import registry
from lit_rag.cli.help import (
    CKPT_PATH_HELP,
    OPTION_HELP,
    OWN_MODEL_GROUPS,
    RUN_GROUPS,
    TRAINER_GROUPS,
    plain,
)
from lit_rag.cli.recipe_args import PLUGIN_KEYS

#: Trainer options hidden from the help: no lit-rag module predicts, and lit-rag reads
#: checkpoints from files, not from Lightning's model registry
HIDDEN = {"trainer.limit_predict_batches", "trainer.model_registry"}

#: jsonargparse's list of the subclasses imported so far, at the end of an option's help
_KNOWN = re.compile(r", known subclasses: ([\w.,\s]+)(?=\)$)")
#: the classes such a list keeps: the libraries' own (a list also holds whatever subclasses this
#: process happens to have imported: lit-rag's internal ones, a test's)
_LISTED = ("lightning.", "torch.")
#: a type as Python prints it: ``<class 'Reward'>``
_CLASS = re.compile(r"<class '([\w.]+)'>")


def plugin_kind(dest: str) -> str | None:
    """The plugin kind an option holds (``model.reward`` -> ``reward``; its ``.help`` too), or
    None."""
    parts = dest.removesuffix(".help").split(".")
    return PLUGIN_KEYS.get(parts[-1])


def _names(kind: str) -> str:
    """The registered names of ``kind``, as ``lit-rag plugins`` lists them."""
    return ", ".join(registry.available(kind)) or "none installed"


def _libraries_classes(match: re.Match) -> str:
    """A list of known subclasses with Lightning's and torch's classes only."""
    kept = [p for p in re.split(r",\s*", match.group(1).strip()) if p.startswith(_LISTED)]
    return f", known subclasses: {', '.join(kept)}" if kept else ""


class TrainerHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help formatter, keeping the line breaks of the commands' descriptions,
    with every text plain and a plugin option's registered names in place of the classes."""

    def _expand_help(self, action: argparse.Action) -> str:
        # jsonargparse expands a help once, then argparse again: each step here is idempotent
        text = _CLASS.sub(r"\1", plain(super()._expand_help(action)))
        kind = plugin_kind(action.dest)
        if kind is None or action.dest.endswith(".help"):
            return _KNOWN.sub(_libraries_classes, text)
        if "registered: " in text:
            return text
        text = _KNOWN.sub("", text)
        names = f"registered: {_names(kind)} (lit-rag plugins)"
        return f"{text[:-1]}, {names})" if text.endswith(")") else f"{text} ({names})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse's, without breaking lines at hyphens ("lit- rag", "transformer- engine")
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False)

    def start_section(self, heading: str | None) -> None:
        super().start_section(plain(heading) if heading else heading)

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))


class TrainerParser(LightningArgumentParser):
    """LightningCLI's parser with :class:`TrainerHelpFormatter` and ``lit-rag`` as its name,
    also for the parser jsonargparse makes to print ``--model.reward.help NAME``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", TrainerHelpFormatter)
        kwargs.setdefault("prog", "lit-rag")
        description = kwargs.get("description")
        if isinstance(description, str) and description.startswith("Help for --"):
            kwargs["description"] = _class_help_description(description)
        super().__init__(*args, **kwargs)


def _class_help_description(text: str) -> str:
    """jsonargparse's "Help for --model.reward.help=a.b.ArenaReward" in lit-rag's words."""
    option, _, path = text.removeprefix("Help for --").partition("=")
    key = option.removesuffix(".help")
    kind = plugin_kind(key)
    name = next(
        (
            info.name
            for info in (registry.available(kind).values() if kind else ())
            if info.target.replace(":", ".") == path
        ),
        path,
    )
    what, leaf = (f"{name} ({path})" if name != path else path), key.rpartition(".")[2]
    if kind is None:  # a group of settings (SamplingParams): its keys sit right under it
        line = f"The options of {path}: under {leaf}: in a recipe, --{key}.OPTION=VALUE."
    else:  # jsonargparse names a nested plugin by its last key: say where its options go
        line = (
            f"The options of the {kind} {what}: in a recipe under {leaf}: init_args:, "
            "on the command line as --KEY.init_args.OPTION=VALUE, KEY being the option that "
            "names it."
        )
    return textwrap.fill(line, width=92, break_on_hyphens=False)


def reword(parser: argparse.ArgumentParser, command: str, policy: bool) -> None:
    """Give the parser of ``command`` (fit, validate, test) lit-rag's group titles and texts;
    ``policy``: its model is lit-rag's policy (else a class the recipe names)."""
    titles = {**TRAINER_GROUPS, command: RUN_GROUPS[command]}
    if not policy:
        titles.update(OWN_MODEL_GROUPS)
    for name, group in parser.groups.items():
        if name in titles:
            group.title = titles[name]
    texts = {**OPTION_HELP, "ckpt_path": CKPT_PATH_HELP[command]}
    for action in parser._actions:
        if action.dest in HIDDEN:
            action.help = argparse.SUPPRESS
        elif action.dest in texts:
            action.help = texts[action.dest]
        elif action.dest.endswith(".help") and plugin_kind(action.dest) is not None:
            kind = plugin_kind(action.dest)
            action.metavar = "NAME"
            action.help = f"Print the options of the {kind} NAME ({_names(kind)}) and exit."
