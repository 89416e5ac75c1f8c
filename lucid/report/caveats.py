"""The threat model in plain words: what the proved bounds guarantee, and what they do not.

A reviewer reads the numbers through these sentences, so they are kept in one place (both formats
render the same text) and follow docs/guarantee.md and the threat model in docs/access.md.
Run-specific facts (public or fitted domain, group size of an AGT verification, fine-tuning)
switch the matching sentences.
"""

from __future__ import annotations

from lucid.report.facts import ReportFacts
from lucid.rundir import EXTERNAL_ALGORITHM

EXTERNAL_T = (
    "The networks were trained outside LUCID and imported (`lucid import`): the leave-one-out "
    "networks are the ones supplied for each row, and the guarantee is about exactly those networks. "
    "LUCID checked the networks, not how they were trained: if the training algorithm would not "
    "reproduce them from D without a row, the guarantee does not describe it."
)


def covered(facts: ReportFacts) -> tuple[tuple[str, str], ...]:
    """(short claim, explanation) pairs for what the guarantee covers on this run."""
    t = facts.training
    groups = sorted({c.removals for c in facts.verification.classes})
    group_k = max(groups) if groups else 1
    neighbours = (
        "removing any one row of D"
        if group_k == 1
        else f"removing any group of up to {group_k} rows of D (group iDP over an AGT box)"
    )
    items = [
        (
            "Label-only answers",
            (
                "What a client of `lucid serve` (or LabelOnlyClassifier) receives is a label per input, nothing "
                "else: no scores, confidences, bounds or branch, also not in error messages."
            ),
        ),
        (
            "Individual DP for this data set",
            (
                f"Each answer is individually differentially private (iDP) with respect to {neighbours}, for the "
                f"actual training set D of this run ({t.train_size} rows). A label is released as is (0-iDP) only "
                "when N's confidence exceeds the class's proved bound β_c, which means every network trained "
                "without such a row gives the same label; every other answer is drawn by the exponential "
                "mechanism (ε-iDP)."
            ),
        ),
        (
            "For the training algorithm T exactly as run",
            (
                EXTERNAL_T
                if t.algorithm == EXTERNAL_ALGORITHM
                else f"The leave-one-out networks are what T ({t.algorithm}: plain SGD, seed {t.seed}, "
                "the seeded batch order shared by all networks) produces without each row; the guarantee is about that "
                "deterministic T and nothing else."
            )
            + (
                " The pre-trained start of this fine-tuned run is a constant of T: the guarantee assumes it "
                "does not depend on the private rows."
                if t.fine_tuned_from
                else ""
            ),
        ),
        (
            "Repeated queries of one input",
            (
                "Answers are memoised on the point N evaluates (after scaling and clipping), so asking the same "
                "input again returns the stored answer and reveals nothing new; distinct noised answers compose "
                "and are counted per client in the privacy ledger (basic and (ε, δ) composition)."
            ),
        ),
        (
            "Sound upper bounds, even when time-limited",
            (
                "Every reported upper bound is a solver's dual bound plus a floating-point safety margin, never an "
                "incumbent; a class stopped by its time limit keeps a sound but looser bound, which only means "
                "more of its inputs are noised."
            ),
        ),
    ]
    return tuple(items)


def not_covered(facts: ReportFacts) -> tuple[tuple[str, str], ...]:
    """(short limit, explanation) pairs for what the guarantee does not cover on this run."""
    t = facts.training
    items = [
        (
            'The bit "was this input noised"',
            (
                "Whether an answer was released or noised (confidence <= β_c) depends on the leave-one-out "
                "networks and so differs between D and D without a row. The service does the same work on both "
                "branches and budgets cap the worst-case charge so that refusals do not reveal it, but the "
                "ledger's noised/spent columns (in `lucid budget` and in this report) do: keep them from clients."
            ),
        ),
        (
            "This report itself",
            (
                "The report is for the model owner and reviewers. The bounds β_c, the test-set confidences, "
                "the leaking rows' indices, the ledger and the domain in it are derived from the private data and "
                "are not protected by the guarantee: do not publish it to clients."
            ),
        ),
        (
            "Training randomness and other training runs",
            (
                "LUCID did not train these networks, so whatever randomness their training had is not a source "
                "of privacy here"
                if t.algorithm == EXTERNAL_ALGORITHM
                else "The seed is fixed and recorded, so T's randomness is not a source of privacy here"
            )
            + "; the guarantee says nothing about networks trained with another seed, other hyper-parameters, "
            "other data or another algorithm, or about releasing N's weights or scores.",
        ),
        (
            "Neighbours other than removing one row"
            if all(c.removals == 1 for c in facts.verification.classes)
            else "Neighbours other than removals",
            (
                "iDP here compares D with D minus its own rows (one row, or up to the verified group size). "
                "Adding a new row, changing a row's value, or removing more rows than verified is not covered, "
                "and iDP protects the rows of this D, not every possible data set as differential privacy would."
            ),
        ),
        (
            "Queries beyond the budget",
            (
                "Without `lucid serve --budget` a client can collect arbitrarily many noised answers and their "
                "privacy loss grows with each; budgets are per API token, so one person with many tokens holds "
                "many budgets (the all-clients row bounds what they hold together). An input evicted from a full "
                "memo, or a deleted or lost memo file, gets a fresh draw."
            ),
        ),
        (
            "Side channels outside the process",
            (
                "Equal work on both branches covers what Python, numpy and SQLite do (measured, not proved for "
                "CPU caches); the network, the operating system and co-located processes are outside it, and "
                "latency reveals whether anyone asked the same point before unless `--deadline-ms` covers it."
            ),
        ),
        (
            "Inputs outside the verified domain",
            "The bounds hold only inside the verified box (section Data and training algorithm T); the service "
            "refuses other inputs, or clips them into the box with `--clip`."
            + (
                " This run's box "
                + (
                    "coincides with the data's extremes (the manifest gave it, but unless its bounds "
                    "are public it was fitted to the data)"
                    if t.domain_given
                    else "appears fitted to the data (no public domain)"
                )
                + ", so the box, and which inputs are refused, reveal the data's extremes: "
                + (
                    "import it again with a public `domain` in the manifest"
                    if t.algorithm == EXTERNAL_ALGORITHM
                    else "retrain with `--domain` and public bounds"
                )
                + " for a deployment."
                if t.domain_from_data
                else ""
            ),
        ),
        (
            "Solver correctness",
            (
                "The proof relies on the MILP solver's dual bounds (HiGHS runs without presolve because of known "
                "presolve bugs, and every witness is replayed in float64); `--solver highs+scip` cross-checks "
                "every node with a second backend for defence in depth."
            ),
        ),
    ]
    return tuple(items)
