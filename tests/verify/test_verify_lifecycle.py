"""The run's lifecycle drives a strategy (lucid/verify/lifecycle.py): prepare, step until done,
result; it checkpoints after every step and on an interrupt, opens the log only after a
successful set-up, always closes the strategy, and writes every file (the residual sets' file,
then bounds.json) itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bab_fixtures import write_tiny_run

from lucid.deadline import Deadline
from lucid.errors import LucidError
from lucid.residual import ClassResidual
from lucid.rundir import bound_entry, open_run
from lucid.settings import VerifySettings
from lucid.verify.checkpoint import CHECKPOINT_FILE
from lucid.verify.lifecycle import Checkpoint, ResidualSets, VerificationRun, Verified


class Scripted:
    """A strategy that records the calls the run makes: `steps` pieces of work, then done."""

    def __init__(self, steps: int, *, fail_in_prepare: bool = False, interrupt_at: int | None = None,
                 residual: bool = False) -> None:
        self.steps, self.fail, self.interrupt_at, self.residual = steps, fail_in_prepare, interrupt_at, residual
        self.calls: list[str] = []
        self.done = 0

    def prepare(self, run, saved):
        self.calls.append(f"prepare saved={saved is not None}")
        self.run = run
        if self.fail:
            raise LucidError("bad input found in the set-up")
        return {"workers": 1, "networks": 3}

    def step(self):
        self.run.event_log().emit("piece", None, index=self.done)
        self.done += 1
        self.calls.append(f"step {self.done}")
        if self.done == self.interrupt_at:
            raise KeyboardInterrupt
        return self.done < self.steps

    def checkpoint(self):
        self.calls.append(f"checkpoint {self.done}")
        return Checkpoint({}, extra={"done": self.done})

    def close(self):
        self.calls.append("close")

    def result(self):
        entry = bound_entry(0.25, 0.125, complete=True, exact=True, seconds=0.0, nodes=self.done,
                            reason="scripted", leaking_row=None)
        sets = None
        if self.residual:
            member = ClassResidual(positions=np.array([2], dtype=np.int64), bounds=np.array([0.5]), level=0.25)
            sets = ResidualSets({0: member}, 1)
        return Verified({"0": entry, "1": dict(entry)}, residual=sets)


def _run(tmp_path: Path, **settings) -> VerificationRun:
    path = write_tiny_run(tmp_path / "run", networks=3)
    return VerificationRun(open_run(path), VerifySettings(**settings), Deadline())


def _events(run: VerificationRun) -> list[dict]:
    return [json.loads(line) for line in (run.path / "verify.log.jsonl").read_text().splitlines()]


def test_the_run_steps_the_strategy_checkpointing_after_each_step_then_writes_bounds(tmp_path):
    run, strategy = _run(tmp_path), Scripted(3)
    result = run.execute(strategy)
    assert strategy.calls == ["prepare saved=False", "step 1", "checkpoint 1", "step 2", "checkpoint 2", "step 3",
                              "close"]
    assert [e["event"] for e in _events(run)] == ["started", "piece", "piece", "piece", "finished"]
    assert json.loads((run.path / CHECKPOINT_FILE).read_text())["done"] == 2  # the extra entries, top level
    assert result["bounds"]["0"]["nodes"] == 3 and (run.path / "bounds.json").exists()


def test_bad_input_in_the_set_up_leaves_no_log_and_no_bounds_and_still_closes(tmp_path):
    run, strategy = _run(tmp_path), Scripted(3, fail_in_prepare=True)
    with pytest.raises(LucidError, match="bad input"):
        run.execute(strategy)
    assert strategy.calls == ["prepare saved=False", "close"]
    assert not (run.path / "verify.log.jsonl").exists() and not (run.path / "bounds.json").exists()


def test_an_interrupt_saves_the_checkpoint_and_a_resume_hands_it_to_prepare(tmp_path):
    run, strategy = _run(tmp_path), Scripted(5, interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        run.execute(strategy)
    assert strategy.calls[-2:] == ["checkpoint 2", "close"] and not (run.path / "bounds.json").exists()
    again = VerificationRun(open_run(run.path), VerifySettings(resume=True), Deadline())
    resumed = Scripted(1)
    again.execute(resumed)
    assert resumed.calls[0] == "prepare saved=True"
    assert [e["event"] for e in _events(again)][-3:] == ["resumed", "piece", "finished"]


def test_the_run_writes_the_residual_sets_file_that_bounds_json_names(tmp_path):
    run = _run(tmp_path, residual=1)
    result = run.execute(Scripted(1, residual=True))
    section = result["residual"]
    assert (run.path / section["file"]).exists() and section["networks"] == [2] and section["size"] == 1
