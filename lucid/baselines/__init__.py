"""Private-training and private-prediction baselines LUCID is compared with (paper Table 3).

- `dpsgd`: DP-SGD (Opacus, RDP accountant) — (eps, delta)-DP for the whole training set.
- `dpcert`: DP-CERT — DP-SGD over noise-augmented copies (averaged, then clipped), smoothed prediction.
- `alibi`: ALIBI label-DP (Laplace randomized response on one-hot labels, Bayesian soft labels).
- `subsample_aggregate`: T teachers on disjoint parts, exponential mechanism over vote counts.
- `smooth_sensitivity`: AGT smooth-sensitivity private prediction (one model or T teachers).

Every baseline returns a `BaselineResult` with the test accuracy and the training seconds, and
reports an unreachable privacy target as a result (status "unreachable") instead of raising.
"""

from lucid.baselines.common import BaselineResult, TrainConfig
from lucid.baselines.models import build_model, parse_architecture

__all__ = ["BaselineResult", "TrainConfig", "build_model", "parse_architecture"]
