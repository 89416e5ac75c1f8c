"""`TrainSettings`: every option of one training run, typed, validated once, passed unchanged.

The CLI (or `train_run`'s keyword arguments) builds one frozen `TrainSettings`; the harness, the
AGT step and the Dask path all read this same object. Every option that can be checked without the
data is checked here, before anything is loaded or written; the first bad value is one error line.
`training_record` is the part of run.json that defines T's output, and so (less the test file's
path) enters the run's fingerprint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from lucid.agt.train import DEFAULT_MAX_WIDTH
from lucid.errors import LucidError
from lucid.option_fields import settings_from_options
from lucid.sgd import SgdStep
from lucid.training.architecture import parse_arch
from lucid.training.finetune import parse_train_layers

ALGORITHM = "lucid-loo-sgd/1"  # docs/training.md defines it; bump if T ever changes
AGT_ARCHITECTURES = ("mlp", "cnn")  # what lucid.agt can bound (2-D convolutions: not implemented)


@dataclass(frozen=True)
class TrainSettings:
    """One training run's options (the `lucid train` flags; docs/training.md).

    arch: `DxW`, comma-separated widths, `cnn`, or a layer list `conv(8,3,pad=1),fc(32)` (a 2-D CNN).
    input_shape: `C,H,W` of a layer list with conv layers (the features are the C-H-W flattened image).
    epochs, lr, weight_decay, batch_size, seed: T's SGD (the seed also draws the initialisation, the
        batch order and the test split).
    test_fraction / test_data: the test split, taken from the data or from another file.
    label: a CSV's label column (None: the last); domain: a JSON file of public bounds.
    device: where the chunks train (cpu, cuda); chunk_size: networks per chunk (None: derived
        from a memory budget); scheduler: a Dask scheduler (`tcp://HOST:8786`, `local:N` or a
        Client) to train the chunks on instead of this process's threads; progress: a progress bar.
    agt / agt_max_width: also store AGT boxes for k = 1..agt removed rows, stopping when an
        interval grows wider than agt_max_width (None: the AGT default).
    loo: train the leave-one-out networks (False: N alone).
    init_from / train_layers: T's fine-tuning variant: start from that run's N and update only
        these dense layers (`all`, `last`, `0,2`).
    """

    arch: str = "2x50"
    input_shape: str | None = None
    epochs: int = 50
    lr: float = 0.1
    weight_decay: float = 1e-5
    batch_size: int = 1024
    seed: int = 0
    test_fraction: float = 0.2
    test_data: str | None = None
    label: str | None = None
    domain: str | None = None
    device: str = "cpu"
    chunk_size: int | None = None
    progress: bool = True
    scheduler: Any = None
    agt: int = 0
    agt_max_width: float | None = None
    loo: bool = True
    init_from: str | None = None
    train_layers: str = "all"

    def __post_init__(self) -> None:
        epochs, batch_size, lr, weight_decay = self.epochs, self.batch_size, self.lr, self.weight_decay
        if int(epochs) != epochs or epochs < 1:
            raise LucidError(f"--epochs must be a positive integer, got {epochs}")
        if int(batch_size) != batch_size or batch_size < 1:
            raise LucidError(f"--batch-size must be a positive integer, got {batch_size}")
        if not (math.isfinite(lr) and lr > 0):
            raise LucidError(f"--lr must be a positive number, got {lr}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise LucidError(f"--weight-decay must be a non-negative number, got {weight_decay}")
        chunk_size = self.chunk_size
        if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
            raise LucidError(f"--chunk-size must be a positive integer, got {chunk_size}")
        agt, max_width = self.agt, self.agt_max_width
        if int(agt) != agt or agt < 0:
            raise LucidError(f"--agt must be a non-negative integer (the largest number of removed rows), got {agt}")
        if max_width is not None and not (math.isfinite(max_width) and max_width > 0):
            raise LucidError(f"--agt-max-width must be a positive number, got {max_width}")
        device = self.torch_device  # rejects an unknown device, or cuda where there is none
        if self.scheduler is not None and device.type != "cpu":
            raise LucidError("--scheduler trains on the workers' CPUs; leave out --device")
        spec = self.spec  # checks arch and input_shape
        parse_train_layers(self.train_layers, spec)
        if agt and spec["type"] not in AGT_ARCHITECTURES:
            raise LucidError(
                "--agt bounds MLPs and the 1-D CNN (--arch cnn) only; 2-D convolutions (conv(...) layers) "
                "are not supported (docs/agt.md)"
            )
        # prepare_dataset checks this too; here it fails before the data is read, as it always has
        if not (0 <= self.test_fraction < 1) or not math.isfinite(self.test_fraction):
            raise LucidError(f"--test-fraction must be in [0, 1), got {self.test_fraction}")
        if self.input_shape is not None and not isinstance(self.input_shape, str):  # (1, 8, 8) from Python
            object.__setattr__(self, "input_shape", ",".join(str(int(v)) for v in self.input_shape))
        for name in ("epochs", "batch_size", "chunk_size", "agt"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("lr", "weight_decay", "agt_max_width"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def from_options(cls, **options: Any) -> TrainSettings:
        """From keyword options; an unknown name is one error line, not a TypeError."""
        return settings_from_options(cls, "train", options)

    # --- what the harness reads ---------------------------------------------------------------------
    @property
    def torch_device(self) -> torch.device:
        """The device as torch's object: cpu or cuda (cuda only where it is available)."""
        try:
            dev = torch.device(self.device)
        except (RuntimeError, ValueError):
            raise LucidError(f"unknown device '{self.device}' (use cpu or cuda)") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise LucidError("--device cuda was requested but CUDA is not available here")
        if dev.type not in ("cpu", "cuda"):
            raise LucidError(f"unsupported device '{self.device}' (use cpu or cuda)")
        return dev

    @property
    def spec(self) -> dict:
        """The architecture as run.json records it (a fresh dict on every call)."""
        return parse_arch(self.arch, self.input_shape)

    @property
    def trainable(self) -> set[int] | None:
        """The dense layers SGD updates (None: every layer)."""
        return parse_train_layers(self.train_layers, self.spec)

    def sgd_step(self, num_classes: int) -> SgdStep:
        """T's SGD step for a run on data with `num_classes` classes, as every chunk (local or on a
        Dask worker) and the AGT step apply it."""
        trainable = self.trainable
        return SgdStep(
            self.lr,
            self.weight_decay,
            self.batch_size,
            num_classes,
            None if trainable is None else frozenset(trainable),
        )

    @property
    def agt_width(self) -> float:
        """The AGT box width at which training stops, with the default filled in."""
        return float(DEFAULT_MAX_WIDTH if self.agt_max_width is None else self.agt_max_width)

    def training_record(self, init_record: dict | None) -> dict:
        """run.json's `training` (without the fingerprint, which is computed from it).

        `agt`, `loo`, `init` and `trainable_layers` appear only when they differ from plain T, so
        that runs which do not use them keep their fingerprints."""
        training = {
            "algorithm": ALGORITHM,
            "optimizer": "sgd",
            "momentum": 0.0,
            "loss": "cross_entropy",
            "lr": float(self.lr),
            "weight_decay": float(self.weight_decay),
            "epochs": int(self.epochs),
            "batch_size": int(self.batch_size),
            "seed": int(self.seed),
            "test_fraction": None if self.test_data is not None else float(self.test_fraction),
            "test_data": self.test_data,
        }
        if self.agt:
            training["agt"] = {"max_k": int(self.agt), "max_width": self.agt_width}
        if not self.loo:
            training["loo"] = False
        if init_record is not None:
            training["init"] = init_record
        trainable = self.trainable
        if trainable is not None:
            training["trainable_layers"] = sorted(trainable)
        return training
