"""Training N and every leave-one-out network N_-i (algorithm T, see docs/training.md)."""

from lucid.training.harness import default_chunk_size, train_run
from lucid.training.settings import TrainSettings

__all__ = ["TrainSettings", "default_chunk_size", "train_run"]
