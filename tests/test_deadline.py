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
