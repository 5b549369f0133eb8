"""``QADataModule``: batches of :class:`~lit_rag.types.Example` for every recipe.

A batch is a plain ``list[Example]``: environments build prompts from examples, so no tensors
are made here. The train loader is a :class:`ResumableLoader`, whose position (epoch and batches
already yielded) is saved in Lightning checkpoints and restored on ``fit(ckpt_path=...)``, so a
resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rag.data.readers import FORMATS, DatasetFormatError, read_examples
from lit_rag.data.synthetic import SyntheticWorld
from lit_rag.errors import InputError
from lit_rag.types import Contract, Example, Passage

SYNTHETIC = "synthetic"
DEFAULT_BATCH = 8  # examples per process when neither batch size is set


def collate_examples(batch: list[Example]) -> list[Example]:
    """Collate function that keeps a batch as the list of examples it is."""
    return batch


class ResumableLoader:
    """Shuffled batches of examples whose position survives a checkpoint.

    Epoch ``e`` visits the examples in the order of a permutation drawn from
    ``random.Random(f"{seed}-{e}")``. The epoch counter starts at ``epoch`` and moves on each
    time a new pass starts; ``state_dict()`` records the epoch and the number of batches
    yielded in it, and after ``load_state_dict()`` the next pass replays the same permutation
    without the batches already yielded. Lightning saves and restores the state of any train
    loader with ``state_dict`` / ``load_state_dict`` (``CombinedLoader._state_dicts``), so this
    needs no ``DataLoader`` base class.

    With several processes (``num_replicas`` > 1), each rank takes every ``num_replicas``-th
    example of the permutation after dropping the tail that does not divide evenly, so all
    ranks run the same number of batches.

    Args:
        examples: The examples to serve.
        batch_size: Examples per batch; the last batch of an epoch may be smaller.
        shuffle: Draw a new permutation each epoch; False keeps file order.
        seed: Seed of the permutations.
        epoch: Epoch of the first pass.
        num_replicas: Number of data-parallel processes.
        rank: This process's rank among them.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}); got {rank}")
        self.examples = list(examples)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self._epoch = epoch
        self._batches_yielded = 0
        self._started = False  # has a pass of ``self._epoch`` begun?
        self._resume = False  # set by load_state_dict: the next pass continues ``self._epoch``

    def __len__(self) -> int:
        per_rank = len(self.examples) // self.num_replicas
        return -(-per_rank // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch of the current (or, before any pass, the first) pass."""
        return self._epoch

    def indices(self, epoch: int) -> list[int]:
        """This rank's example indices for ``epoch``, in the order they are served."""
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        usable = len(order) - len(order) % self.num_replicas
        return order[:usable][self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[list[Example]]:
        # A generator: the bookkeeping runs on the first ``next()``, so a probing ``iter()``
        # (Lightning checks that loaders are iterable) does not start an epoch.
        if self._resume:
            self._resume = False
            if self._batches_yielded >= len(self):  # saved at the very end of an epoch
                self._epoch += 1
                self._batches_yielded = 0
        else:
            if self._started:
                self._epoch += 1
            self._batches_yielded = 0
        self._started = True
        epoch = self._epoch
        order = self.indices(epoch)
        for start in range(self._batches_yielded * self.batch_size, len(order), self.batch_size):
            batch = [self.examples[i] for i in order[start : start + self.batch_size]]
            self._batches_yielded += 1
            yield batch

    def batch_at(self, epoch: int, index: int) -> list[Example] | None:
        """Batch ``index`` of ``epoch`` as a pass serves it (None past the epoch's end): what
        rollout workers start on ahead of the step that trains it."""
        order = self.indices(epoch)
        start = index * self.batch_size
        if index < 0 or start >= len(order):
            return None
        return [self.examples[i] for i in order[start : start + self.batch_size]]

    def state_dict(self) -> dict[str, int]:
        """Position in the data: ``{"epoch": e, "batches_yielded": b}``."""
        return {"epoch": self._epoch, "batches_yielded": self._batches_yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass resumes that epoch's permutation."""
        missing = {"epoch", "batches_yielded"} - set(state)
        if missing:
            raise KeyError(
                f"ResumableLoader state lacks {sorted(missing)}; got keys {sorted(state)}"
            )
        self._epoch = int(state["epoch"])
        self._batches_yielded = int(state["batches_yielded"])
        self._started = True
        self._resume = True


def _example_to_dict(example: Example) -> dict[str, Any]:
    """Plain types for a checkpoint; an environment's context keeps its type (``to_dict``)."""
    contract = None if example.contract is None else example.contract.to_dict()
    return {**asdict(example), "contract": contract}


def _example_from_dict(row: dict[str, Any]) -> Example:
    contract = row.get("contract")
    return Example(
        **{
            **row,
            "references": [Passage(**p) for p in row.get("references", [])],
            "contract": None if contract is None else Contract.from_dict(contract),
        }
    )


def limit_references(example: Example, max_references: int | None) -> Example:
    """Keep every gold reference and the first non-gold ones, in order, up to ``max_references``.

    Distractors are dropped from the end; when the gold references alone exceed the budget,
    all of them are kept anyway (the answer must stay reachable).
    """
    if max_references is None or len(example.references) <= max_references:
        return example
    gold = set(example.gold_ids)
    budget = max(0, max_references - sum(p.id in gold for p in example.references))
    kept = []
    for passage in example.references:
        if passage.id in gold:
            kept.append(passage)
        elif budget > 0:
            kept.append(passage)
            budget -= 1
    return Example(
        id=example.id,
        question=example.question,
        answers=list(example.answers),
        references=kept,
        gold_ids=list(example.gold_ids),
        meta=dict(example.meta),
    )


class QADataModule(L.LightningDataModule):
    """Question-answering data for every recipe: dataset files or the synthetic world.

    Args:
        train: Training data: a dataset file path, ``"synthetic"``, or
            ``"verifiers:<env-id>"`` (an installed verifiers environment's tasks).
        val: Validation data: a file path, ``"synthetic"``, or None for no validation.
        test: Test data: a file path, ``"synthetic"``, or None.
        format: File format for every path: ``auto``, ``hotpotqa``, ``2wiki``, ``musique``,
            ``flashrag`` or ``litrag``.
        synthetic_seed: Seed of the synthetic world and its question draws.
        num_train: Number of training examples: a cap on a file (the first ones), or how many
            to generate (default 2000 for synthetic).
        num_val: Same for validation and test (default 64 for synthetic).
        hops: Hop counts of synthetic questions (cycled).
        num_distractors: Non-gold paragraphs in each synthetic example's references.
        max_references: Keep at most this many references per example: all gold ones, then
            the first distractors (None keeps all).
        batch_size: Examples per training batch in each process (default 8). With N processes
            a step trains on N x batch_size examples.
        global_batch_size: Examples per training batch over all processes, the batch a paper
            states: each of N processes takes global_batch_size / N (N must divide it). Set
            this or batch_size, not both.
        val_batch_size: Examples per validation/test batch in each process (default: the
            per-process training batch).
        global_val_batch_size: Examples per validation/test batch over all processes (a
            paper's stated validation batch): each of N processes takes
            global_val_batch_size / N. Set this or val_batch_size, not both.
        shuffle: Shuffle the training examples each epoch.
        seed: Seed of the training order.
        forest: R2AG's progressive iterative training (r2ag.md Algorithm 1): epoch ``j`` trains
            on RR-Forest^j, the pruned trees collected during epoch ``j - 1`` (epoch 0: the
            questions). Needs ``trainer.reload_dataloaders_every_n_epochs: 1`` and the
            :class:`~lit_rag.callbacks.ProgressiveForest` callback, which adds the trees.
    """

    def __init__(
        self,
        train: str = SYNTHETIC,
        val: str | None = SYNTHETIC,
        test: str | None = None,
        format: str = "auto",
        synthetic_seed: int = 0,
        num_train: int | None = None,
        num_val: int | None = None,
        hops: list[int] = [2, 3],  # noqa: B006 - copied below; a list reads best in YAML
        num_distractors: int = 6,
        max_references: int | None = None,
        batch_size: int | None = None,
        global_batch_size: int | None = None,
        val_batch_size: int | None = None,
        global_val_batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        forest: bool = False,
    ) -> None:
        super().__init__()
        self._check_args(
            num_train,
            num_val,
            max_references,
            (batch_size, global_batch_size),
            (val_batch_size, global_val_batch_size),
        )
        if format not in FORMATS:
            raise ValueError(f"data.format must be one of {', '.join(FORMATS)}; got '{format}'")
        if not hops or any(k not in (1, 2, 3, 4) for k in hops):
            raise ValueError(f"data.hops must be a non-empty list of values in 1..4; got {hops}")
        self.save_hyperparameters()
        self.train_source = train
        self.val_source = val
        self.test_source = test
        self.format = format
        self.synthetic_seed = synthetic_seed
        self.num_train = num_train
        self.num_val = num_val
        self.hops = list(hops)
        self.num_distractors = num_distractors
        self.max_references = max_references
        self.global_batch_size = global_batch_size
        # the per-process setting (None when the global one is set: process_batch_size splits it)
        self.batch_size = batch_size or (None if global_batch_size else DEFAULT_BATCH)
        self._val_batch_size = val_batch_size
        self.global_val_batch_size = global_val_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._world: SyntheticWorld | None = None
        self._splits: dict[str, list[Example]] = {}
        self.forest = forest
        self.iteration = 0
        self.current: list[Example] = []  # RR-Forest^j for j >= 1
        self.next: dict[tuple[str, tuple[str, ...]], Example] = {}  # RR-Forest^{j+1}, deduplicated

    @staticmethod
    def _check_args(
        num_train: int | None,
        num_val: int | None,
        max_references: int | None,
        train_batch: tuple[int | None, int | None],
        val_batch: tuple[int | None, int | None],
    ) -> None:
        """``train_batch``, ``val_batch``: (per process, over all processes)."""
        for key, value in (
            ("num_train", num_train),
            ("num_val", num_val),
            ("max_references", max_references),
            ("val_batch_size", val_batch[0]),
            ("global_val_batch_size", val_batch[1]),
            ("batch_size", train_batch[0]),
            ("global_batch_size", train_batch[1]),
        ):
            if value is not None and value < 1:
                raise ValueError(f"data.{key} must be >= 1 or null; got {value}")
        for prefix, (local, total) in (("", train_batch), ("val_", val_batch)):
            if local is not None and total is not None:
                raise ValueError(
                    f"data.{prefix}batch_size ({local}, per process) and "
                    f"data.global_{prefix}batch_size ({total}, over all processes) are both "
                    f"set; set one of them (e.g. --data.{prefix}batch_size=null)"
                )

    def process_batch_size(self, world_size: int) -> int:
        """Examples per training batch in each of ``world_size`` processes: ``batch_size``, or
        ``global_batch_size / world_size``.

        Example:
            >>> QADataModule(global_batch_size=512).process_batch_size(8)
            64
        """
        if self.global_batch_size is None:
            return self.batch_size
        return _split(self.global_batch_size, world_size, "")

    @property
    def val_batch_size(self) -> int:
        """Examples per validation / test batch in each process."""
        if self._val_batch_size is not None:
            return self._val_batch_size
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.global_val_batch_size is not None:
            return _split(self.global_val_batch_size, world, "val_")
        return self.process_batch_size(world)

    # ------------------------------------------------------------------ loading

    def world(self) -> SyntheticWorld:
        """The synthetic world (built on first use) behind ``"synthetic"`` splits."""
        if self._world is None:
            self._world = SyntheticWorld(seed=self.synthetic_seed)
        return self._world

    def _synthetic(self, split: str, n: int, exclude: set[str]) -> list[Example]:
        offset = {"train": 0, "val": 1, "test": 2}[split]
        return self.world().examples(
            n,
            hops=self.hops,
            num_distractors=self.num_distractors,
            seed=self.synthetic_seed + offset,
            exclude_questions=exclude,
            id_prefix=f"syn-{self.synthetic_seed}-{split}",
        )

    def _load(self, split: str) -> list[Example]:
        if split in self._splits:
            return self._splits[split]
        sources = {"train": self.train_source, "val": self.val_source, "test": self.test_source}
        source = sources[split]
        cap = self.num_train if split == "train" else self.num_val
        if source is None:
            examples: list[Example] = []
        elif source == SYNTHETIC:
            exclude: set[str] = set()
            for earlier in ("train", "val")[: ("train", "val", "test").index(split)]:
                exclude |= {ex.question for ex in self._load_if_synthetic(earlier)}
            default = 2000 if split == "train" else 64
            examples = self._synthetic(split, cap or default, exclude)
        elif source.startswith("verifiers:"):
            examples = self._verifiers(split, source, cap)
        else:
            examples = read_examples(source, format=self.format)[:cap]
            if not examples:  # an empty run would end at once, "successfully"
                raise DatasetFormatError(
                    f"data.{split} '{source}' holds no examples "
                    "(the file is empty or only whitespace); "
                    "give a file with at least one question"
                )
        examples = [limit_references(ex, self.max_references) for ex in examples]
        self._splits[split] = examples
        return examples

    def _verifiers(self, split: str, source: str, cap: int | None) -> list[Example]:
        """A verifiers environment's tasks (``verifiers:<env-id>``, lit_rag.integrations): a
        split that names the training split's environment takes the tasks after its
        ``num_train`` (held out), in the environment's order."""
        from lit_rag.integrations.verifiers import load_examples

        held_out = split != "train" and source == self.train_source
        skip = (self.num_train or 0) if held_out else 0
        examples = load_examples(source, None if cap is None else skip + cap)[skip:]
        if not examples:
            raise DatasetFormatError(
                f"data.{split} '{source}': no tasks left after the {skip} of data.train; "
                "lower data.num_train or give the environment more tasks"
            )
        return examples

    def _load_if_synthetic(self, split: str) -> list[Example]:
        source = {"train": self.train_source, "val": self.val_source}[split]
        return self._load(split) if source == SYNTHETIC else []

    def setup(self, stage: str | None = None) -> None:
        """Load (or generate) the splits the stage needs."""
        if stage in (None, "fit"):
            self._load("train")
        if stage in (None, "fit", "validate") and not self._load("val") and stage == "validate":
            raise DatasetFormatError(
                "lit-rag validate needs validation data: set data.val (a file or 'synthetic')"
            )
        if stage in (None, "test") and not self._load("test") and stage == "test":
            raise DatasetFormatError(
                "lit-rag test needs test data: set data.test (a file or 'synthetic')"
            )

    def use_val(self, source: str, num_val: int | None = None) -> None:
        """Validate on another file from now on (its first ``num_val`` examples): ``lit-rag
        evaluate`` runs one recipe over a suite's datasets in turn."""
        self.val_source, self.num_val = source, num_val
        self._splits.pop("val", None)

    def train_examples(self) -> list[Example]:
        """The training examples (after ``num_train`` and ``max_references``)."""
        return self._load("train")

    def val_examples(self) -> list[Example]:
        """The validation examples (empty when ``val`` is None)."""
        return self._load("val")

    def test_examples(self) -> list[Example]:
        """The test examples (empty when ``test`` is None)."""
        return self._load("test")

    # ------------------------------------------------------------------ loaders

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """Leave ``list[Example]`` batches as they are: they hold text, not tensors.

        Lightning's default would copy every example with ``apply_to_collection`` for nothing;
        environments tokenize on the right device later.
        """
        if isinstance(batch, list) and all(isinstance(ex, Example) for ex in batch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ------------------------------------------------------------------ the RR-Forest

    def add_contexts(self, examples: list[Example]) -> int:
        """Add pruned trees to the next iteration's pool (one per question and context
        ``key()``: R2AG's set of retrieved gold ids); returns how many were new."""
        added = 0
        for ex in examples:
            key = (ex.id, () if ex.contract is None else ex.contract.key())
            if key not in self.next:
                self.next[key] = ex
                added += 1
        return added

    def pool(self) -> list[Example]:
        """The training examples of the current iteration (all of them without ``forest``)."""
        return self.current if self.forest and self.iteration > 0 else self.train_examples()

    def state_dict(self) -> dict[str, Any]:
        if not self.forest:
            return {}
        return {
            "iteration": self.iteration,
            "current": [_example_to_dict(e) for e in self.current],
            "next": [_example_to_dict(e) for e in self.next.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.iteration = int(state.get("iteration", 0))
        self.current = [_example_from_dict(r) for r in state.get("current", [])]
        self.next = {}
        self.add_contexts([_example_from_dict(r) for r in state.get("next", [])])

    def train_dataloader(self) -> ResumableLoader:
        """Shuffled, resumable batches (``list[Example]``) for this process's rank."""
        trainer = self.trainer
        if self.forest:
            if trainer is not None and trainer.reload_dataloaders_every_n_epochs != 1:
                raise ValueError(
                    "data.forest needs trainer.reload_dataloaders_every_n_epochs: 1 "
                    "(each epoch is one "
                    f"forest iteration); got {trainer.reload_dataloaders_every_n_epochs}"
                )
            epoch = trainer.current_epoch if trainer is not None else 0
            if epoch > self.iteration:  # a new iteration: the collected trees become the pool
                self.current, self.next, self.iteration = list(self.next.values()), {}, epoch
        return ResumableLoader(
            self.pool(),
            batch_size=self.process_batch_size(trainer.world_size if trainer is not None else 1),
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=trainer.current_epoch if trainer is not None else 0,
            num_replicas=trainer.world_size if trainer is not None else 1,
            rank=trainer.global_rank if trainer is not None else 0,
        )

    def _eval_loader(self, examples: list[Example]) -> DataLoader:
        return DataLoader(
            examples,  # type: ignore[arg-type]
            batch_size=self.val_batch_size,
            shuffle=False,
            collate_fn=collate_examples,
        )

    def val_dataloader(self) -> DataLoader | list[Any]:
        """Batches of validation examples in file order (``[]`` when there are none)."""
        examples = self.val_examples()
        return self._eval_loader(examples) if examples else []

    def test_dataloader(self) -> DataLoader | list[Any]:
        """Batches of test examples in file order (``[]`` when there are none)."""
        examples = self.test_examples()
        return self._eval_loader(examples) if examples else []


def _split(size: int, world_size: int, prefix: str) -> int:
    """``data.global_<prefix>batch_size`` over ``world_size`` processes; an error naming the
    process counts that divide it."""
    if size % world_size:
        fits = ", ".join(str(n) for n in range(1, min(size, 64) + 1) if size % n == 0)
        raise InputError(
            f"data.global_{prefix}batch_size {size} cannot be split over {world_size} processes "
            f"(devices x nodes); process counts that divide it: {fits}; or set "
            f"data.{prefix}batch_size (per process)"
        )
    return size // world_size
