"""Lightning's FSDP and DeepSpeed strategies on CPU processes (gloo collectives).

Lightning accepts FSDP and DeepSpeed on CUDA only; a smoke run of a paper recipe's strategy on a
laptop (``--trainer.strategy=fsdp --trainer.devices=2``, accelerator ``cpu``) gets these
subclasses instead (:func:`lit_rag.models.distributed.cpu_strategy`). Everything else (wrapping,
sharding, mixed precision, ZeRO partitioning, the optimizer and checkpoints) is the real
strategy; each subclass changes only what stops it on CPU:

- :class:`CPUFSDP`: Lightning passes ``device_id=None`` on CPU, which torch's FSDP refuses, so
  the CPU device is passed; ``*-mixed`` autocasts on the CPU as a GPU run does on CUDA
  (:class:`CPUFSDPPrecision`); the first rank's weights reach the others
  (``sync_module_states``) over gloo, which torch's up-front check for NCCL refuses; and the
  checkpoint is gathered without the CPU offload (Lightning's ``offload_to_cpu=True`` on CPU
  tensors, nothing to offload, crashes torch 2.13 in FSDP's state-dict hook: a segfault,
  measured). FSDP's own ``cpu_offload`` needs an accelerator
  (torch pins the offloaded shards' memory).
- :class:`CPUDeepSpeed`: DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``, gloo collectives);
  Lightning's CUDA check and its device-index check (CPU devices have no index) are skipped and
  DeepSpeed gets the local rank as the device rank.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy


class CPUFSDPPrecision(FSDPPrecision):
    """Lightning's FSDP precision with the autocast of the device the ranks compute on: its
    ``*-mixed`` forward context is ``torch.autocast("cuda")``, which leaves CPU operations as they
    are, so a CPU run would compute where a GPU run autocasts (a LoRA layer's fp32 input against
    its FSDP-cast bf16 weight: a dtype error no GPU run meets)."""

    def forward_context(self):
        if "mixed" in self.precision:
            dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
            return torch.autocast("cpu", dtype=dtype)
        return super().forward_context()


class CPUFSDP(FSDPStrategy):
    """Lightning's FSDP on CPU processes (see the module docstring)."""

    strategy_name = "fsdp_cpu"

    @property
    def precision_plugin(self) -> FSDPPrecision:
        return FSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin) -> None:
        if type(plugin) is FSDPPrecision:  # the one Lightning's connector builds
            plugin = CPUFSDPPrecision(plugin.precision)
        FSDPStrategy.precision_plugin.fset(self, plugin)

    @contextlib.contextmanager
    def model_sharded_context(self):
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        with (
            enable_wrap(
                wrapper_cls=FullyShardedDataParallel,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            ),
            _module_states_synced_on_cpu(),
        ):
            yield

    def lightning_module_state_dict(self):
        from torch.distributed.fsdp import (
            FullStateDictConfig,
            FullyShardedDataParallel,
            StateDictType,
        )

        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(
            self.model, StateDictType.FULL_STATE_DICT, config
        ):
            return self.model.state_dict()


@contextlib.contextmanager
def _module_states_synced_on_cpu():
    """FSDP's ``sync_module_states`` on CPU ranks: torch refuses CPU tensors up front (NCCL
    broadcasts device memory only), while the broadcast itself is gloo's, which takes them."""
    from torch.distributed.fsdp import _init_utils

    check = _init_utils._check_module_states_for_sync_module_states
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    try:
        yield
    finally:
        _init_utils._check_module_states_for_sync_module_states = check


class CPUDeepSpeed(DeepSpeedStrategy):
    """Lightning's DeepSpeed on CPU processes (see the module docstring)."""

    strategy_name = "deepspeed_cpu"

    def __init__(self, *args, **kwargs) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        super().__init__(*args, **kwargs)

    def setup_environment(self) -> None:
        super(DeepSpeedStrategy, self).setup_environment()  # skips the CUDA check only

    def setup_distributed(self) -> None:
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        import deepspeed

        engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, deepspeed_optimizer
