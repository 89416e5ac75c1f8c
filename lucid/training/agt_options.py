"""The `lucid train --agt K` step: option checks and the abstract-gradient-training boxes.

Kept apart from the harness so the leave-one-out training loop reads on its own; the boxes are
computed before anything is written, so a diverging bound leaves no staging directory behind.
"""

from __future__ import annotations

import math
import sys

import torch

from lucid.agt.train import AgtBox
from lucid.agt.train import DEFAULT_MAX_WIDTH, agt_boxes
from lucid.data import Dataset
from lucid.errors import LucidError


def check_agt_options(agt: int, agt_max_width: float | None) -> None:
    if int(agt) != agt or agt < 0:
        raise LucidError(f"--agt must be a non-negative integer (the largest number of removed rows), got {agt}")
    if agt_max_width is not None and not (math.isfinite(agt_max_width) and agt_max_width > 0):
        raise LucidError(f"--agt-max-width must be a positive number, got {agt_max_width}")


def agt_width(agt_max_width: float | None) -> float:
    return float(DEFAULT_MAX_WIDTH if agt_max_width is None else agt_max_width)


def stage_agt_boxes(ds: Dataset, spec: dict, init: dict, orders: torch.Tensor, agt: int, max_width: float, *,
                    lr: float, weight_decay: float, batch_size: int, trainable: set[int] | None,
                    progress: bool) -> list[AgtBox]:
    """Boxes for k = 1..agt that contain every parameter vector T reaches without up to k rows."""
    if progress:
        print(f"lucid: abstract gradient training, boxes for k = 1..{int(agt)}", file=sys.stderr, flush=True)
    return agt_boxes(
        init, spec, torch.from_numpy(ds.X_train), torch.from_numpy(ds.y_train), orders, max_k=int(agt),
        lr=lr, weight_decay=weight_decay, batch_size=batch_size, num_classes=ds.num_classes, max_width=max_width,
        trainable=trainable,
    )
