"""Settings of the multi-process test fits that build their trainers in a script; the CPU FSDP and
DeepSpeed strategies they use are lit-rag's own (lit_rag/models/cpu_strategies.py), the ones
``lit-rag fit --trainer.strategy=fsdp`` gets on CPU."""

from __future__ import annotations

from lit_rag.models.cpu_strategies import CPUFSDP, CPUDeepSpeed

__all__ = ["CPUFSDP", "CPUDeepSpeed", "QUIET_TRAINER"]

#: Trainer settings of the multi-process test fits: no logger, bars, summary or validation
QUIET_TRAINER = {
    "accelerator": "cpu",
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}
