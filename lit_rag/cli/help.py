"""What the ``lit-rag`` command says about itself: its commands, each with the line ``lit-rag
--help`` gives it, ``lit-rag --help`` itself, and the text above the trainer commands' options.

Plain strings (no imports but ``re``), so ``lit-rag --help`` starts without Lightning or torch.
The trainer commands' help (``lit_rag.cli.wording``) takes its group titles and its texts for
Lightning's options from here, and shows every text through :func:`plain`.
"""

from __future__ import annotations

import re

#: lit-rag's commands in the order ``lit-rag --help`` lists them, each with its line there; a
#: command's own ``--help`` opens with the same line
COMMANDS = {
    "fit": "Train a policy with RL from a YAML recipe.",
    "validate": "Score a policy on the recipe's validation data.",
    "test": "Score a policy on the recipe's test data.",
    "compare": "Validate the untrained policy and each checkpoint, side by side.",
    "evaluate": "Score models on a paper's benchmark suite, beside the paper's results.",
    "report": "Plot a run's curves and sampled rollouts as PNG files and an HTML page.",
    "export": "Save a checkpoint's policy as a Hugging Face model folder.",
    "data": "Prepare a paper recipe's data sets from local or FlashRAG files.",
    "index": "Build, search, score, serve and import retrieval indexes.",
    "size": "Estimate the memory per device a recipe needs and the largest micro-batch that fits.",
    "plugins": "List the installed algorithms, rewards, retrievers and other plugins.",
}

#: the commands LightningCLI runs (Trainer methods). Not ``predict``: no lit-rag module has a
#: ``predict_step`` nor any data module a ``predict_dataloader``, so ``Trainer.predict`` fails.
TRAINER_COMMANDS = ("fit", "validate", "test")

USAGE = "usage: lit-rag COMMAND [options]"

DESCRIPTION = (
    "Train and evaluate retrieval-augmented generation (RAG) policies with reinforcement learning."
)

_EXAMPLES = """\
examples:
  lit-rag fit --config recipes/quickstart.yaml                            ARENA on CPU, small model
  lit-rag fit --config recipes/quickstart.yaml --model.optimizer.lr=5e-4  override a recipe value
  lit-rag COMMAND --help                                                  a command's options
  lit-rag --version                                                       the release (and commit)

The recipes are in recipes/; recipes/README.md lists them. --verbose (or LIT_RAG_VERBOSE=1)
also shows the warnings third-party libraries print on every run."""

#: what ``lit-rag fit --help`` (and validate, test) prints above LightningCLI's options
TRAINER_HELP = {
    "fit": """\
Train a policy with RL from a YAML recipe.

  lit-rag fit --config recipes/quickstart.yaml
  lit-rag fit --config recipes/quickstart.yaml --model.optimizer.lr=5e-4 --trainer.max_steps=48
  lit-rag fit --config recipes/quickstart.yaml --ckpt_path CHECKPOINT

A recipe sets the trainer, the model (policy, environment, reward, algorithm) and the data;
recipes/README.md lists the recipes in recipes/. Every option below overrides the
recipe's value (--model.optimizer.lr=5e-4). Plugins go by their registered names
(--model.reward=f1; lit-rag plugins lists them); --model.reward.help arena prints the options
of one. --ckpt_path resumes a run from one of its checkpoints
(runs/NAME/version_N/checkpoints/last.ckpt, or last: the newest). --verbose also shows the
warnings third-party libraries print.""",
    "validate": """\
Score a policy on the recipe's validation data.

  lit-rag validate --config recipes/quickstart.yaml
  lit-rag validate --config recipes/quickstart.yaml --ckpt_path CHECKPOINT
  lit-rag validate --config recipes/quickstart.yaml --data.val=FILE

Greedy rollouts, their rewards, EM and F1. Without --ckpt_path the recipe's untrained policy
is scored. The options are fit's; lit-rag compare scores several checkpoints in one table.""",
    "test": """\
Score a policy on the recipe's test data.

  lit-rag test --config recipes/quickstart.yaml --data.test=synthetic
  lit-rag test --config RECIPE --data.test=FILE --ckpt_path CHECKPOINT

What validate scores, on data.test. Recipes set no test data: give it with --data.test (a
file or synthetic). Without --ckpt_path the recipe's untrained policy is scored. The options
are fit's; lit-rag evaluate scores a paper's benchmark suite.""",
}


def help_text() -> str:
    """What ``lit-rag --help`` prints: the usage, one line per command, examples."""
    width = max(len(name) for name in COMMANDS) + 3
    commands = "\n".join(f"  {name.ljust(width)}{line}" for name, line in COMMANDS.items())
    return f"{USAGE}\n\n{DESCRIPTION}\n\ncommands:\n{commands}\n\n{_EXAMPLES}"


#: the title of each group of options in ``lit-rag fit --help`` (and validate, test), by the
#: group's key, in place of the first line of the class's docstring Lightning would show
TRAINER_GROUPS = {
    "trainer": (
        "Trainer (lightning.pytorch.Trainer): devices, strategy, precision, steps, "
        "validation, logging, checkpoints"
    ),
    "model": "Model: the policy, environment, reward, algorithm, rollout engine and update",
    "model.policy": "Policy (model.policy): the model trained: weights, dtype, LoRA, quantization",
    "data": "Data: training, validation and test questions, batch sizes",
}

#: the titles of the groups of a recipe whose model names its own class (``model:
#: class_path:``, EVO-RAG's reward model), which configures its optimizer through the recipe
OWN_MODEL_GROUPS = {
    "model": "Model: the LightningModule the recipe names (model.class_path) and its options",
    "optimizer": "Optimizer (torch.optim) of that model",
    "lr_scheduler": "Learning-rate schedule (torch.optim.lr_scheduler) of that model",
}

#: the title of the group of each command's own options (Lightning's: the Trainer method's
#: docstring, "Runs the full optimization routine")
RUN_GROUPS = {
    "fit": "Run: where training starts",
    "validate": "Run: the weights scored",
    "test": "Run: the weights tested",
}

_LAST = (
    "last: the newest checkpoint of the recipe's runs (in runs/NAME/*/checkpoints: the logger's "
    "save_dir and name, or the checkpoint callback's dirpath)"
)

#: the help of ``--ckpt_path`` per command, in place of Lightning's (its model registry)
CKPT_PATH_HELP = {
    "fit": (
        "Resume training from a checkpoint: a .ckpt file of a run of this recipe "
        f"(runs/NAME/version_N/checkpoints/last.ckpt), or {_LAST}; with last and no checkpoint "
        "yet, training starts from the beginning, so a job that requeues itself can always pass "
        "it. The weights, optimizer and step continue; settings come from the recipe and the "
        "command line, never from the checkpoint."
    ),
    "validate": (
        "The weights to score: a .ckpt file (runs/NAME/version_N/checkpoints/last.ckpt), or "
        f"{_LAST}. Without it, the recipe's untrained policy is scored."
    ),
    "test": (
        "The weights to test: a .ckpt file (runs/NAME/version_N/checkpoints/last.ckpt), or "
        f"{_LAST}. Without it, the recipe's untrained policy is tested."
    ),
}

#: lit-rag's help for options of Lightning's whose own text is about Lightning's API
OPTION_HELP = {
    "config": (
        "The recipe: a YAML file (recipes/README.md lists the recipes). Given twice, the second "
        "one's values override the first one's."
    ),
    "print_config": (
        "Print the settings this command line would run with (the recipe, the overrides, the "
        "defaults; plugins by class path) and exit; =skip_default leaves out the defaults."
    ),
    "seed_everything": (
        "Seed of torch, Python and NumPy, set before anything is built: an int, true (a random "
        "seed, written to the run's config.yaml) or false (no seeding)."
    ),
    "trainer.precision": (
        "auto (the recipes' choice): bf16-mixed where the device computes bf16 natively (GPUs "
        "that do, CPUs with AVX-512 BF16 or AMX), else 32-true (lit_rag/models/precision.py); "
        "or Lightning's 32-true, bf16-mixed, bf16-true, 16-mixed, 64-true."
    ),
    "trainer.callbacks": (
        "Callbacks, each a class_path with its init_args: lit-rag's (lit_rag.callbacks."
        "HealthMonitor, KLMonitor, RolloutSampleLogger, CurriculumCallback, "
        "RewardWeightScheduler, ProgressiveForest, AlternatingRewardModel) and Lightning's "
        "(lightning.pytorch.callbacks.ModelCheckpoint, ...). Every run also gets "
        "PreemptionCheckpoint, RunHeader and HealthMonitor unless the recipe lists its own."
    ),
    "weights_only": (
        "How the checkpoint is read: true or null (the default) read tensors and plain values "
        "only (torch.load(weights_only=True)), all a lit-rag checkpoint holds; false also "
        "unpickles any object: only for a checkpoint from a source you trust."
    ),
}

#: Sphinx and reStructuredText markup in docstrings, in the order :func:`plain` removes it
_LINK = re.compile(r"`([^`<]+?)\s*<([^<>`]+)>`_{1,2}")  # `text <https://...>`_
_ROLE = re.compile(r":(?:[\w-]+:)+`(~?)([^`]*)`")  # :class:`~a.b.C`, :paramref:`a.b`
_LITERAL = re.compile(r"``(.+?)``")  # ``value``
_TICKS = re.compile(r"`([^`]+)`")  # `value`


def _role(match: re.Match) -> str:
    """A role's text: ``text`` of ``text <target>``, the last part of ``~a.b.C``, else all."""
    short, body = match.groups()
    named = re.fullmatch(r"(.+?)\s*<[^<>]+>", body)
    if named:
        return named.group(1)
    return body.rpartition(".")[2] if short else body


def plain(text: str) -> str:
    """``text`` with its Sphinx and reStructuredText markup removed, as help shows it.

    >>> plain("Uses :class:`~lightning.pytorch.Trainer` (``'auto'``), see `docs <https://x.y>`_.")
    "Uses Trainer ('auto'), see docs (https://x.y)."
    """
    text = _LINK.sub(r"\1 (\2)", text)
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"\1", text)
    return _TICKS.sub(r"\1", text)
