"""What the ``lit-rag`` command says about itself: its commands, each with the line ``lit-rag
--help`` gives it, ``lit-rag --help`` itself, and the text above the trainer commands' options.

Plain strings (no imports), so ``lit-rag --help`` starts without Lightning or torch.
"""

from __future__ import annotations

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
(--model.reward=f1; lit-rag plugins lists them). --ckpt_path resumes a run from one of its
checkpoints (runs/NAME/version_N/checkpoints/last.ckpt).""",
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
