"""DP-SGD baseline: one plain network trained with Opacus to a target (eps, delta).

The noise multiplier comes from Opacus' `make_private_with_epsilon` with the RDP accountant
for the run's number of epochs and (Poisson) sampling rate batch_size / n. A target Opacus
cannot reach (eps = 0, or a budget so small that the noise multiplier search gives up, e.g.
eps = 0.02 on a small data set) is reported as status "unreachable", not raised.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from lucid.access.mechanism import check_epsilon
from lucid.baselines.common import BaselineResult, Dataset, DpSgdSettings, TrainConfig, accuracy
from lucid.baselines.models import build_model

METHOD = "dpsgd"


def train_dpsgd(
    data: Dataset, config: TrainConfig, epsilon: float, dp_sgd: DpSgdSettings = DpSgdSettings()
) -> BaselineResult:
    """Train with DP-SGD to (epsilon, delta)-DP; delta defaults to 1/n."""
    from opacus import PrivacyEngine

    epsilon = check_epsilon(epsilon)
    n = len(data.X_train)
    delta = dp_sgd.delta_for(n)
    max_grad_norm = dp_sgd.max_grad_norm
    info = {"delta": delta, "max_grad_norm": max_grad_norm, "sample_rate": min(1.0, config.batch_size / n)}
    if epsilon == 0:
        return BaselineResult(
            METHOD,
            epsilon,
            None,
            0.0,
            "unreachable",
            "DP-SGD cannot reach eps = 0 (it would need infinite noise)",
            info,
        )

    torch.manual_seed(config.seed)
    model = build_model(config.arch, data.input_dim, data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    dataset = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    loader = DataLoader(
        dataset,
        batch_size=min(config.batch_size, n),
        shuffle=True,
        generator=torch.Generator().manual_seed(config.seed),
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about its non-cryptographic RNG in benchmarks
        engine = PrivacyEngine(accountant="rdp")
        try:
            model, optimizer, loader = engine.make_private_with_epsilon(
                module=model,
                optimizer=optimizer,
                data_loader=loader,
                target_epsilon=epsilon,
                target_delta=delta,
                epochs=int(config.epochs),
                max_grad_norm=max_grad_norm,
                noise_generator=torch.Generator().manual_seed(config.seed + 1),
            )
        except ValueError as exc:
            if "budget is too low" not in str(exc):
                raise
            return BaselineResult(
                METHOD,
                epsilon,
                None,
                time.perf_counter() - start,
                "unreachable",
                f"Opacus cannot reach eps = {epsilon:g} at delta = {delta:.3g} "
                f"({config.epochs} epochs, sampling rate {info['sample_rate']:.3g}): {exc}",
                info,
            )
        loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        for _ in range(int(config.epochs)):
            for xb, yb in loader:
                if len(xb) == 0:  # Poisson sampling can draw an empty batch: still a (noise-only) step
                    optimizer.zero_grad()
                    optimizer.step()
                    continue
                optimizer.zero_grad()
                loss_fn(model(xb), yb).backward()
                optimizer.step()
        seconds = time.perf_counter() - start
        info["noise_multiplier"] = float(optimizer.noise_multiplier)
        info["epsilon_spent"] = float(engine.get_epsilon(delta))
    model.eval()
    acc = accuracy(model._module if hasattr(model, "_module") else model, data.X_test, data.y_test)
    return BaselineResult(METHOD, epsilon, acc, seconds, "ok", "", info)
