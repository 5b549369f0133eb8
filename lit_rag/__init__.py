"""lit-rag: RL trainers for retrieval-augmented generation on PyTorch Lightning."""

from lit_rag.compat import moved
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory
from lit_rag.version import RELEASE

moved.install()  # the module paths from before the package layout (lit_rag/compat/moved.py)

__version__ = RELEASE

__all__ = ["Example", "Passage", "RewardBreakdown", "Step", "Trajectory", "__version__"]
