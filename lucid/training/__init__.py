"""Training N and every leave-one-out network N_-i (algorithm T, see docs/training.md)."""

from lucid.training.harness import default_chunk_size, train_run

__all__ = ["train_run", "default_chunk_size"]
