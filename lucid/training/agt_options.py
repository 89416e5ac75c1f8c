"""The `lucid train --agt K` step: the abstract-gradient-training boxes (options: `TrainSettings`).

Kept apart from the harness so the leave-one-out training loop reads on its own; the boxes are
computed before anything is written, so a diverging bound leaves no staging directory behind.
"""

from __future__ import annotations

import sys

import torch

from lucid.agt.train import AgtBox, agt_boxes
from lucid.data import Dataset
from lucid.sgd import TrainingInputs
from lucid.training.settings import TrainSettings


def stage_agt_boxes(ds: Dataset, spec: dict, init: dict, orders: torch.Tensor, settings: TrainSettings) -> list[AgtBox]:
    """Boxes for k = 1..settings.agt that contain every parameter vector T reaches without up to k rows."""
    if settings.progress:
        print(f"lucid: abstract gradient training, boxes for k = 1..{settings.agt}", file=sys.stderr, flush=True)  # noqa: T201 (progress, on stderr)
    inputs = TrainingInputs(init, spec, torch.from_numpy(ds.X_train), torch.from_numpy(ds.y_train), orders)
    return agt_boxes(inputs, settings.sgd_step(ds.num_classes), max_k=settings.agt, max_width=settings.agt_width)
