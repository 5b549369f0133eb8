"""The update's arithmetic (``lit_rag/trainer/flops.py``) and its clock: FLOPs counted from the
model's config equal the weights its matmuls hold, the peak is read from the GPU's name or the
recipe, and on a GPU each timed part is a pair of device events read once per step (no host
synchronisation inside the step). CUDA itself is not here: the clock takes stand-in events."""

from __future__ import annotations

import pytest
import torch

from lit_rag.models.loading import ModelConfig, TinyConfig, load_model
from lit_rag.trainer.flops import Arithmetic, peak_of, peak_tflops, throughput
from lit_rag.trainer.phases import Clock, device_events


def test_the_arithmetic_counts_the_weights_of_every_matmul():
    model = load_model(ModelConfig(tiny=TinyConfig(hidden_size=64, num_layers=3, num_heads=4)))
    arithmetic = Arithmetic.of_model(model)
    layers = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in name
    )
    assert arithmetic.layer_weights == layers
    assert arithmetic.head_weights == model.lm_head.weight.numel()
    # a forward: 2 FLOPs a weight a position, the head only where it predicts
    assert arithmetic.forward(10, 4) == 2 * (layers * 10 + model.lm_head.weight.numel() * 4)
    assert arithmetic.training(10, 4, trains_weights=True) == 3 * arithmetic.forward(10, 4)
    assert arithmetic.training(10, 4, trains_weights=False) == 2 * arithmetic.forward(10, 4)
    assert Arithmetic.of_model(torch.nn.Linear(2, 2)) is None  # no decoder config


def test_the_peak_comes_from_the_recipe_or_the_gpus_name():
    assert peak_of("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_of("NVIDIA H100 PCIe") == 756.0
    assert peak_of("NVIDIA H200") == 989.0
    assert peak_of("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_of("NVIDIA GeForce RTX 4090") is None
    assert peak_tflops(torch.device("cpu")) is None  # no MFU on a CPU
    assert peak_tflops(torch.device("cpu"), given=2.5) == 2.5


def test_throughput_and_mfu():
    metrics = throughput(tflop=30.0, tokens=6000, seconds=2.0, peak=100.0)
    assert float(metrics["perf/update_tflops"]) == 15.0
    assert float(metrics["perf/update_tokens_per_s"]) == 3000.0
    assert float(metrics["perf/mfu"]) == pytest.approx(0.15)
    assert "perf/mfu" not in throughput(30.0, 6000, 2.0, None)
    assert throughput(30.0, 6000, 0.0, 100.0) == {}


class Event:
    """A stand-in CUDA event: the 'device' reaches it at a time the test sets."""

    clock = 0.0

    def record(self) -> None:
        self.at = Event.clock

    def elapsed_time(self, end: Event) -> float:  # milliseconds, as CUDA's
        return (end.at - self.at) * 1000.0


def test_on_a_gpu_the_clock_reads_device_events_once_a_step():
    synced = []
    clock = Clock(event=Event, synchronize=lambda: synced.append(1))
    for spent in (0.5, 0.25):
        with clock("time/forward_s"):
            Event.clock += spent
    with clock("time/backward_s"):
        Event.clock += 1.0
    assert synced == []  # nothing waits for the device inside the step
    metrics = clock.metrics()
    assert synced == [1]
    assert float(metrics["time/forward_s"]) == pytest.approx(0.75)
    assert float(metrics["time/backward_s"]) == pytest.approx(1.0)


def test_the_device_decides_the_clock():
    assert device_events(torch.device("cuda", 0)) and device_events("cuda")
    assert not device_events(torch.device("cpu")) and not device_events(None)
    assert Clock(torch.device("cpu")).event is None  # the host's clock
