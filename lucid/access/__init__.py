"""Label-only, iDP-protected access to a trained run (paper Algorithm 2, LUCID-Inference)."""

from lucid.access.classifier import ClassifierOptions, LabelOnlyClassifier
from lucid.access.ledger import (
    BudgetExceeded,
    ClientTotals,
    EpsilonPlan,
    optimal_composition,
    plan_epsilon,
    summarise,
)
from lucid.access.mechanism import RandomSource, exponential_mechanism, true_label_probability
from lucid.access.memo import Charge, Memo, MemoStore, open_memo
from lucid.access.memo.sqlite import read_ledger
from lucid.access.served_run import load_upper_bounds

__all__ = [
    "BudgetExceeded",
    "Charge",
    "ClassifierOptions",
    "ClientTotals",
    "EpsilonPlan",
    "LabelOnlyClassifier",
    "Memo",
    "MemoStore",
    "RandomSource",
    "exponential_mechanism",
    "load_upper_bounds",
    "open_memo",
    "optimal_composition",
    "plan_epsilon",
    "read_ledger",
    "summarise",
    "true_label_probability",
]
