"""Algorithm T's inputs and SGD step, as the concrete trainer and its abstract counterpart read them.

`lucid.training.vectorized.train_networks` runs T on K networks at once; `lucid.agt.train.abstract_train`
runs the same T in interval arithmetic. Both start from `TrainingInputs` and apply `SgdStep`, so one
object carries the same options to both (and, pickled, to a Dask worker). The module sits beside
both packages, not in either: `lucid.training` imports `lucid.agt`, so `lucid.agt` cannot import it.
`TrainSettings.sgd_step` (`lucid.training.settings`) derives the step of a `lucid train` run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a Dask scheduler unpickles an SgdStep without torch
    import torch


@dataclass(frozen=True)
class SgdStep:
    """T's SGD step without momentum, the same for every network of a run.

    lr, weight_decay: p <- p - lr (g + weight_decay p); batch_size: rows per step (the last batch
    of an epoch may be smaller); num_classes: the width of the cross-entropy's one-hot labels.
    trainable: the dense layers the step updates (None: every layer). The fine-tuning variant of T
    leaves the others at their initial values, without weight decay (MLPs only).
    """

    lr: float
    weight_decay: float
    batch_size: int
    num_classes: int
    trainable: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.trainable is not None and not isinstance(self.trainable, frozenset):  # a set or list from Python
            object.__setattr__(self, "trainable", frozenset(self.trainable))


@dataclass(frozen=True, eq=False)  # tensors: compared by identity
class TrainingInputs:
    """What T starts from and walks: the initial parameters (by safetensors name) of the
    architecture `spec`, the training rows X and class ids y, and orders [epochs, n], the row
    order of each epoch (`lucid.training.vectorized.batch_orders`)."""

    init: dict[str, torch.Tensor]
    spec: dict
    X: torch.Tensor
    y: torch.Tensor
    orders: torch.Tensor
