"""A callback that makes rank 1 stop joining collectives: after training step 1 it sleeps
(``LIT_RAG_TEST_STALL_S``, default 120 s) as a hung rank would. Loaded by ``lit-rag fit`` in
the multi-process CLI tests (``--trainer.callbacks+=stall.StallRank``; tests/scripts on
``PYTHONPATH``)."""

from __future__ import annotations

import os
import time

from lightning.pytorch import Callback


class StallRank(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_rank == 1 and trainer.global_step == 1:
            time.sleep(float(os.environ.get("LIT_RAG_TEST_STALL_S", "120")))
