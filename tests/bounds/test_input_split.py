"""The input-splitting tier (lucid/bounds/input_split.py) against the exact beta*_{c,{i}} of the brute
force (tests/helpers/bruteforce.py, no code shared with lucid): every bound it returns is at least the
exact value, it proves a level above beta* and never one below it, and analyse_node uses it for
networks with few inputs."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from bruteforce import exact_for, tiny_stack

from lucid.analysis.analyse import NodeRequest, analyse_node
from lucid.analysis.problem import VerificationProblem
from lucid.bounds.input_split import input_split_singleton
from lucid.bounds.split_options import SplitLimits, SplitOptions
from lucid.errors import LucidError
from lucid.settings import VerifySettings


def _cases():
    for seed in range(3):
        stack = tiny_stack(seed, hidden=(6, 6), classes=3, k=4, d=2)
        problem = VerificationProblem.from_stack(stack, np.zeros(2), np.ones(2))
        for pos in range(1, len(stack)):
            for cls in range(3):
                yield problem, pos, cls, exact_for(stack, pos, cls, np.zeros(2), np.ones(2))


CASES = [case for case in _cases() if math.isfinite(case[3])]


def test_there_are_cases_that_leak():
    assert len(CASES) >= 10


def test_bounds_are_sound_and_never_prove_a_level_below_the_exact_value():
    for problem, pos, cls, exact in CASES[::3]:
        res = input_split_singleton(problem, cls, pos, exact - 0.02 * (1 + abs(exact)), SplitLimits(60.0), max_boxes=12)
        assert not res.proved
        assert res.bound >= exact - 1e-9
        assert res.witness is None or res.witness.confidence <= exact + 1e-9  # a replayed leak is a true lower bound


def test_cutting_the_box_proves_levels_above_the_exact_value():
    """On these 2-input networks the bound of a box falls about linearly with its width (0.341 at
    width 0.01 and 0.3141 at 0.001 around case 0's optimum 0.3111), so levels 30 % above beta* are
    proved in a few hundred boxes."""
    proved = []
    for problem, pos, cls, exact in CASES[:4]:
        level = exact + 0.3 * (1 + abs(exact))
        res = input_split_singleton(problem, cls, pos, level, SplitLimits(60.0), max_boxes=600)
        assert res.bound >= exact - 1e-9 and res.trace[-1][1] == res.bound
        proved.append(res.proved)
        if res.proved:
            assert res.bound <= level and res.domains > 1
    assert np.mean(proved) >= 0.8, proved


def test_a_stop_event_ends_the_split_with_a_sound_bound():
    problem, pos, cls, exact = CASES[0]
    stop = threading.Event()
    stop.set()
    res = input_split_singleton(problem, cls, pos, exact - 0.5, SplitLimits(60.0, stop=stop))
    assert res.domains == 1 and res.bound >= exact - 1e-9


def test_analyse_node_cuts_the_box_of_a_network_with_few_inputs():
    problem, pos, cls, exact = CASES[0]
    level = exact + 0.3 * (1 + abs(exact))
    for space, expected in (("input", "input"), ("relu", "relu")):
        out = analyse_node(problem, cls, np.array([pos]), settings=VerifySettings(split_space=space, split_time=30.0),
                           request=NodeRequest(level))
        assert out.stats["split"]["space"] == expected
        assert exact - 1e-9 <= out.upper <= level + 1e-6


def test_auto_cuts_the_box_of_wide_networks_with_few_inputs_only():
    from lucid.settings import split_space_for

    assert split_space_for("auto", 7, 100) == "input"  # Crypto 2x50
    assert split_space_for("auto", 7, 60) == "relu"  # fewer than 10 neurons per input
    assert split_space_for("auto", 21, 100) == "relu"  # Adult: too many inputs
    assert split_space_for("auto", 2, 12) == "relu"  # the tests' tiny networks
    assert split_space_for("auto", 2, 20) == "input"
    assert split_space_for("input", 64, 10) == "input" and split_space_for("relu", 2, 100) == "relu"


def test_an_unknown_split_space_is_one_line():
    with pytest.raises(LucidError, match="unknown split space 'boxes'; valid: auto, relu, input"):
        VerifySettings(split_space="boxes")


def test_without_search_an_unproved_network_gets_no_leak_search(monkeypatch):
    """--no-search switches off every witness search, the tier's climbs from its open boxes too."""
    import lucid.bounds.input_split as input_split

    problem, pos, cls, exact = CASES[0]
    calls = []
    monkeypatch.setattr(input_split, "leaks_from", lambda *a: calls.append(a) or [])
    res = input_split_singleton(problem, cls, pos, exact - 0.02 * (1 + abs(exact)), SplitLimits(60.0),
                                SplitOptions(search=False), max_boxes=12)
    assert not res.proved and res.witness is None and not calls
    input_split_singleton(problem, cls, pos, exact - 0.02 * (1 + abs(exact)), SplitLimits(60.0), max_boxes=12)
    assert calls  # the same split with the search on climbs
