"""The update's arithmetic: model FLOPs, achieved TFLOP/s and model FLOPs utilisation (MFU).

MFU (Chowdhery et al. 2022, PaLM, Appendix B) is the FLOPs the model needs for the tokens it
trained on, over the time, over the device's peak. Per token position of a decoder forward that
is 2 FLOPs per weight of its matmuls (every layer's q, k, v, o, gate, up and down projections),
plus 2 per weight of the output head at each position the head runs on (the completion tokens
only: :mod:`lit_rag.trainer.head`). A training pass adds the backward: 2 more per weight for the
input gradient, and 2 more for the weight gradient where the weights train (full fine-tuning; a
LoRA update trains only its small adapters, counted as none). The fixed log-prob forwards
(reference, pi_old) count as forwards. Attention's own score and value products are left out
(at most a few percent at these lengths), so the figure errs low.

The peak comes from the recipe (``model.peak_tflops``) or, on a GPU, from :data:`PEAK_TFLOPS`
by the device's name; on a CPU there is no peak to read and no MFU is logged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lit_rag.sizing.shapes import ModelShape, shape_of

#: dense bf16 tensor-core peak (TFLOP/s) by a substring of ``torch.cuda.get_device_name()``, the
#: first that matches; NVIDIA's data sheets (the SXM parts unless named)
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)


def peak_tflops(device: torch.device | str | None, given: float | None = None) -> float | None:
    """The device's peak: ``given`` when set, else the table's entry for a GPU's name; ``None``
    on a CPU or an unknown GPU."""
    if given is not None:
        return float(given)
    if device is None or torch.device(device).type != "cuda":
        return None
    return peak_of(torch.cuda.get_device_name(device))


def peak_of(name: str) -> float | None:
    """:data:`PEAK_TFLOPS`' entry for a device name, ``None`` when none matches."""
    return next((peak for part, peak in PEAK_TFLOPS if part in name), None)


@dataclass(frozen=True)
class Arithmetic:
    """FLOPs per token of one model: its layers' matmul weights and its head's."""

    layer_weights: int
    head_weights: int

    @classmethod
    def of(cls, shape: ModelShape) -> Arithmetic:
        per_layer = sum(a * b for a, b in shape.linears())
        return cls(shape.layers * per_layer, shape.hidden * shape.vocab)

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> Arithmetic | None:
        """From a transformers model's config (sharding does not change it); ``None`` when the
        config does not name a decoder's numbers."""
        config = getattr(model, "config", None)
        try:
            return cls.of(shape_of(config.to_dict()))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    def forward(self, positions: float, predicted: float) -> float:
        """FLOPs of a forward over ``positions`` token positions, the head at ``predicted``."""
        return 2.0 * (self.layer_weights * positions + self.head_weights * predicted)

    def training(self, positions: float, predicted: float, trains_weights: bool) -> float:
        """FLOPs of a forward and backward pass (see the module)."""
        return self.forward(positions, predicted) * (3.0 if trains_weights else 2.0)


def throughput(tflop: float, tokens: float, seconds: float, peak: float | None) -> dict:
    """The update's ``perf/`` metrics from its TFLOPs, trained tokens and time."""
    if seconds <= 0:
        return {}
    metrics = {
        "perf/update_tokens_per_s": torch.tensor(tokens / seconds),
        "perf/update_tflops": torch.tensor(tflop / seconds),
    }
    if peak:
        metrics["perf/mfu"] = torch.tensor(tflop / seconds / peak)
    return metrics
