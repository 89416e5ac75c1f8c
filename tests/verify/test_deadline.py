"""`Deadline` (lucid/deadline.py): a span of seconds from a start, handed down to a piece of a run."""

from __future__ import annotations

import time

from lucid.deadline import Deadline


def test_a_deadline_with_a_start_counts_from_it_and_one_without_from_when_it_begins():
    started = time.monotonic() - 10.0
    ran = Deadline(4.0, started)
    assert ran.past() and ran.left() < -5.9 and ran.used() >= 10.0 and ran.end == started + 4.0
    assert ran.begun() is ran  # a fixed start stays
    share = Deadline(4.0)  # a region's share: it starts when its work does
    assert share.used() == 0.0 and not share.past() and share.left() == 4.0
    begun = share.begun()
    assert begun.start is not None and not begun.past() and 3.9 < begun.left() <= 4.0
    again = ran.restarted()
    assert not again.past() and again.seconds == 4.0 and again.start > started


def test_without_a_limit_nothing_is_ever_past():
    forever = Deadline(None, time.monotonic() - 1e6)
    assert not forever.past() and forever.left() is None and forever.end is None and forever.used() >= 1e6


def test_paced_chunks_are_fixed_without_an_end_and_none_start_past_it():
    from lucid.deadline import paced

    assert [(s.start, s.stop) for s in paced(10, 4, None)] == [(0, 4), (4, 8), (8, 10)]
    assert list(paced(10, 4, time.monotonic() - 1.0)) == []  # the end has passed: no chunk at all


def test_paced_chunks_follow_the_measured_rate_and_stop_at_the_end():
    """Under an end, the first chunk is small, later ones take about PACE_SECONDS at the rate so far
    (never below PACE_FIRST, never above `chunk`), and no chunk starts once the end has passed."""
    from lucid.deadline import PACE_FIRST, PACE_SECONDS, paced

    sizes = []
    for part in paced(10_000, 512, time.monotonic() + 60.0):  # 1 ms an item: about PACE_SECONDS / 1 ms items
        sizes.append(part.stop - part.start)
        time.sleep(0.001 * sizes[-1])
        if len(sizes) == 3:
            break
    assert sizes[0] == PACE_FIRST and all(PACE_FIRST <= n <= 512 for n in sizes)
    assert sizes[1] >= 0.2 * PACE_SECONDS / 0.001  # (a loaded machine sleeps longer: a smaller chunk)
    done, end = 0, time.monotonic() + 0.3
    for part in paced(10_000, 64, end):  # 64 ms a chunk at most
        time.sleep(0.001 * (part.stop - part.start))
        done = part.stop
    assert 0 < done < 10_000 and time.monotonic() < end + 1.0  # it stopped after the chunk that ran past the end


def test_phases_name_the_innermost_phase_the_deadline_passed_in():
    from lucid.deadline import Phases

    phases, ran_out, plenty = Phases(), Deadline(1.0, time.monotonic() - 2.0), Deadline(60.0, time.monotonic())
    assert phases.stopped_in(3, started=True) == "the node analyses"  # no phase ran out: the main loop did
    with phases.phase("witness search", plenty, cls=0):
        pass
    assert phases.expired_in is None
    with phases.phase("set-up", ran_out):
        with phases.phase("screen refinement", ran_out, cls=2):
            pass
    with phases.phase("witness search", ran_out, cls=4):  # later phases do not replace the first
        pass
    assert phases.expired_in == ("screen refinement", 2)
    assert phases.stopped_in(2, started=True) == "its screen refinement"
    assert phases.stopped_in(1, started=True) == "class 2's screen refinement"
    assert phases.stopped_in(5, started=False) == "class 2's screen refinement, before its start"
    early = Phases()
    with early.phase("set-up (networks, N's bounds)", ran_out):
        pass
    assert early.stopped_in(0, started=False) == "set-up (networks, N's bounds), before its start"
