"""DP-CERT baseline (Wu et al., "Augment then Smooth: Reconciling Differential Privacy with
Certified Robustness"): DP-SGD with augmentation multiplicity, then randomized-smoothing prediction.

Training: every step draws a Poisson batch (rate q = batch_size / n); each drawn row x_i gives
K + 1 copies, itself and K Gaussian-noised ones x_i + N(0, sigma^2 I); the row's gradient is the
*average* of its copies' loss gradients, clipped to L2 norm C (average first, then clip: all of a
row's influence is inside one clipped vector, so the sensitivity is C as in plain DP-SGD); the sum
over the batch gets N(0, (rho C)^2 I) and is divided by the expected batch size q n. rho comes from
Opacus' RDP accountant for the run's number of steps (`get_noise_multiplier`), and the epsilon
actually spent is read back from an `RDPAccountant` that recorded every step. The guarantee is
(eps, delta)-DP of the trained model (add/remove one row), so any number of queries is free.

Prediction: the smoothed classifier, the majority vote of the model over `smoothing_samples`
seeded noisy copies x + N(0, sigma^2 I) of the query (ties: the smaller class index).

Defaults, and why: sigma = 0.1 (the paper's 0.25-1.0 are for images; LUCID's tabular features
lie in [0, 1] with class differences of ~0.1-0.3 per feature, which sigma = 0.25 swamps),
K = 4 augmentations, 100 smoothing samples (enough for a majority vote, not for a certificate),
C = 1 (as the DP-SGD baseline).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lucid.access.mechanism import check_epsilon
from lucid.baselines.common import BaselineResult, Dataset, DpSgdSettings, TrainConfig
from lucid.baselines.models import build_model
from lucid.errors import LucidError

METHOD = "dpcert"


def averaged_clipped_gradients(
    model: torch.nn.Module, copies: torch.Tensor, y: torch.Tensor, max_grad_norm: float
) -> dict[str, torch.Tensor]:
    """Per row: the mean gradient over its copies ([B, K+1, d]), clipped to `max_grad_norm`; summed over rows."""
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters()}

    def row_loss(p: dict, xs: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, p, (xs,))
        return F.cross_entropy(logits, label.expand(len(xs)))  # mean over copies: the averaged gradient

    per_row = vmap(grad(row_loss), in_dims=(None, 0, 0))(params, copies, y)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_row.values()))
    factor = (max_grad_norm / (norms + 1e-12)).clamp(max=1.0)
    return {name: (g * factor.view(-1, *([1] * (g.ndim - 1)))).sum(0) for name, g in per_row.items()}


def smoothed_predictions(
    model: torch.nn.Module, X: np.ndarray, sigma: float, samples: int, num_classes: int, seed: int
) -> np.ndarray:
    """The majority class of the model over `samples` Gaussian-noised copies of every row."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.asarray(X, dtype=np.float32))
    votes = torch.zeros(len(x), num_classes, dtype=torch.int64)
    with torch.no_grad():
        for _ in range(samples):
            noisy = x + sigma * torch.randn(x.shape, generator=generator)
            votes[torch.arange(len(x)), model(noisy).argmax(1)] += 1
    return votes.argmax(1).numpy()  # argmax takes the first maximum: ties go to the smaller class


@dataclass(frozen=True)
class DpCertSettings:
    """What DP-CERT adds to DP-SGD (module docstring: the defaults and why): K = `augmentations`
    Gaussian-noised copies of every drawn row, the noise `sigma` of those copies and of the smoothed
    prediction, and the `smoothing_samples` noisy copies a prediction votes over.

    Checked when a run uses them (`check`), after the DP-SGD settings, as before they travelled together."""

    augmentations: int = 4
    sigma: float = 0.1
    smoothing_samples: int = 100

    def check(self) -> None:
        """One error line for the first setting out of range."""
        augmentations, sigma, smoothing_samples = self.augmentations, self.sigma, self.smoothing_samples
        if int(augmentations) != augmentations or augmentations < 0:
            raise LucidError(f"the number of augmentations must be a non-negative integer, got {augmentations}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise LucidError(f"the augmentation / smoothing noise sigma must be positive, got {sigma}")
        if int(smoothing_samples) != smoothing_samples or smoothing_samples < 1:
            raise LucidError(f"smoothing needs at least one sample, got {smoothing_samples}")


def train_dpcert(
    data: Dataset,
    config: TrainConfig,
    epsilon: float,
    dp_sgd: DpSgdSettings = DpSgdSettings(),
    dpcert: DpCertSettings = DpCertSettings(),
) -> BaselineResult:
    """Train with DP-CERT to (epsilon, delta)-DP (delta defaults to 1/n) and measure the smoothed accuracy."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    epsilon = check_epsilon(epsilon)
    n = len(data.X_train)
    delta = dp_sgd.delta_for(n)
    dpcert.check()
    max_grad_norm = dp_sgd.max_grad_norm
    augmentations, sigma, smoothing_samples = dpcert.augmentations, dpcert.sigma, dpcert.smoothing_samples
    rate = min(1.0, config.batch_size / n)
    steps_per_epoch = max(1, round(1 / rate))
    steps = int(config.epochs) * steps_per_epoch
    info = {
        "delta": delta,
        "max_grad_norm": max_grad_norm,
        "sample_rate": rate,
        "augmentations": augmentations,
        "sigma": sigma,
        "smoothing_samples": smoothing_samples,
        "steps": steps,
    }
    if epsilon == 0:
        return BaselineResult(
            METHOD,
            epsilon,
            None,
            0.0,
            "unreachable",
            "DP-CERT cannot reach eps = 0 (DP-SGD would need infinite noise)",
            info,
        )
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rho = float(
                get_noise_multiplier(
                    target_epsilon=epsilon, target_delta=delta, sample_rate=rate, steps=steps, accountant="rdp"
                )
            )
    except ValueError as exc:
        return BaselineResult(
            METHOD,
            epsilon,
            None,
            time.perf_counter() - start,
            "unreachable",
            f"Opacus cannot reach eps = {epsilon:g} at delta = {delta:.3g} ({steps} steps, "
            f"sampling rate {rate:.3g}): {exc}",
            info,
        )
    torch.manual_seed(config.seed)
    model = build_model(config.arch, data.input_dim, data.num_classes)
    rng = torch.Generator().manual_seed(config.seed + 1)
    X = torch.from_numpy(data.X_train)
    y = torch.from_numpy(data.y_train)
    accountant = RDPAccountant()
    expected_batch = rate * n
    for _ in range(steps):
        rows = torch.nonzero(torch.rand(n, generator=rng) < rate).flatten()
        summed = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        if len(rows):  # an empty Poisson batch is still a (noise-only) step
            base = X[rows][:, None, :]
            noise = sigma * torch.randn((len(rows), augmentations, X.shape[1]), generator=rng)
            copies = torch.cat([base, base + noise], dim=1)  # the row itself and K noised copies
            summed = averaged_clipped_gradients(model, copies, y[rows], max_grad_norm)
        with torch.no_grad():
            for name, p in model.named_parameters():
                g = (summed[name] + rho * max_grad_norm * torch.randn(p.shape, generator=rng)) / expected_batch
                p.add_(g + config.weight_decay * p, alpha=-config.lr)
        accountant.step(noise_multiplier=rho, sample_rate=rate)
    seconds = time.perf_counter() - start
    info.update(noise_multiplier=rho, epsilon_spent=float(accountant.get_epsilon(delta)))
    model.eval()
    with torch.no_grad():
        info["base_accuracy"] = float((model(torch.from_numpy(data.X_test)).argmax(1).numpy() == data.y_test).mean())
    predicted = smoothed_predictions(model, data.X_test, sigma, smoothing_samples, data.num_classes, config.seed + 2)
    return BaselineResult(METHOD, epsilon, float((predicted == data.y_test).mean()), seconds, "ok", "", info)
