"""lit-rag: RL trainers for retrieval-augmented generation on PyTorch Lightning."""

from lit_rag.compat import moved
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

moved.install()  # the module paths from before the package layout (lit_rag/compat/moved.py)

__version__ = "0.1.0"

__all__ = ["Example", "Passage", "RewardBreakdown", "Step", "Trajectory", "__version__"]
