"""Gather a run directory's facts into a `ReportFacts`, through the loaders the other commands use.

Every number comes from the code path that produces it elsewhere, so the report cannot drift from
`lucid evaluate` / `lucid budget`: bounds through `load_upper_bounds` (the access layer's own
validation) and bounds.json, accuracy through `lucid.access.evaluate.evaluate_run`, the ledger
through `lucid.access.classifier.run_ledger` (as `lucid budget`). The verification log is read by
the CLI layer (only it and the engine may import `lucid.bab`) and handed in as `ClassLog`s.
Checks that need no computation (bounds.json, memo, baseline file) run before the evaluation,
so bad input fails fast.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lucid import __version__
from lucid.access.ledger import DEFAULT_DELTA
from lucid.access.memo import MEMO_FILE, is_database_url, memo_name
from lucid.access.served_run import load_upper_bounds
from lucid.atomic import read_json
from lucid.errors import LucidError
from lucid.network import NetworkFile
from lucid.report.facts import (
    BaselineFacts,
    BaselineRow,
    ClassBound,
    ClassLog,
    EvaluationFacts,
    LedgerFacts,
    LedgerRow,
    ReportFacts,
    TrainingFacts,
    VerificationFacts,
)
from lucid.rundir import BOUNDS_FILE, EXTERNAL_ALGORITHM, Run, open_run, read_scaler

BASELINES_FILE = "baselines.json"
_EDGE_TOLERANCE = 1e-6  # network-space distance at which a data extreme "touches" the box


def gather_facts(
    run_dir: str | Path,
    epsilons: list[tuple[str, float]],
    *,
    seed: int | None = 0,
    memo: str | Path | None = None,
    baselines: str | Path | None = None,
    class_logs: Mapping[int, ClassLog] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> ReportFacts:
    """All facts of RUN. `memo` / `baselines` given explicitly must exist; the defaults
    (RUN/memo.sqlite, RUN/baselines.json) are optional and reported as "not served" / "not run"."""
    run = open_run(run_dir)
    verification = _verification(run, class_logs)
    ledger, ledger_note = _ledger(run, memo)
    base, base_note = _baselines(run, baselines)
    training = _training(run)
    evaluation, eval_note = _evaluation(run, epsilons, seed, progress)
    return ReportFacts(
        run=str(run.path),
        generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        lucid_version=__version__,
        training=training,
        verification=verification,
        evaluation=evaluation,
        evaluation_note=eval_note,
        baselines=base,
        baselines_note=base_note,
        ledger=ledger,
        ledger_note=ledger_note,
    )


# ------------------------------------------------------------------------------------- bounds


def _verification(run: Run, class_logs: Mapping[int, ClassLog] | None) -> VerificationFacts:
    path = run.path / BOUNDS_FILE
    if not path.is_file():
        raise LucidError(f"{path} does not exist: run `lucid verify {run.path}` first")
    load_upper_bounds(run)  # the access layer's validation: a file it refuses is refused here too
    doc = read_json(
        path, missing=f"{path} does not exist: run `lucid verify {run.path}` first", unreadable=f"{path} is corrupt"
    )
    options = doc.get("options") if isinstance(doc.get("options"), dict) else {}
    labels = list(run.meta["labels"])
    classes = []
    for key in sorted(doc["bounds"], key=int):
        e = doc["bounds"][key]
        c = int(key)
        classes.append(
            ClassBound(
                cls=c,
                label=labels[c],
                upper=_num(e.get("upper")),
                lower=_num(e.get("lower")),
                complete=bool(e.get("complete")),
                exact=None if e.get("exact") is None else bool(e["exact"]),
                reason=None if e.get("reason") is None else str(e["reason"]),
                seconds=_num(e.get("seconds")),
                nodes=None if e.get("nodes") is None else int(e["nodes"]),
                leaking_row=None if e.get("leaking_row") is None else int(e["leaking_row"]),
                removals=int(e.get("removals", 1)),
                log=(class_logs or {}).get(c),
            )
        )
    regions = doc.get("regions")
    residual = doc.get("residual") if isinstance(doc.get("residual"), dict) else {}
    entries = sorted((residual.get("classes") or {}).items(), key=lambda kv: int(kv[0]))
    levels = tuple((int(c), _num(e.get("level")), len(e.get("positions") or [])) for c, e in entries)
    members = tuple(
        (int(c), tuple(int(r) for r in e.get("rows") or []), tuple(_num(b) for b in e.get("bounds") or []))
        for c, e in entries
    )
    choice = doc.get("residual_choice") if isinstance(doc.get("residual_choice"), dict) else None
    return VerificationFacts(
        solver=str(doc.get("solver", "?")),
        hyper=str(options.get("hyper", "loo")),
        options=tuple(sorted(options.items())),
        classes=tuple(classes),
        log_present=class_logs is not None,
        regions=int(regions.get("leaves", 1)) if isinstance(regions, dict) else 1,
        residual=int(residual.get("size", 0) or 0),
        levels=levels,
        members=members,
        choice=choice,
    )


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------- training


def _training(run: Run) -> TrainingFacts:
    meta, t = run.meta, run.meta.get("training") or {}
    offset, scale = read_scaler(run)
    lower, upper = run.domain
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(scale != 0, offset + lower / scale, np.nan)
        hi = np.where(scale != 0, offset + upper / scale, np.nan)
    init = t.get("init") if isinstance(t.get("init"), dict) else None
    agt = t.get("agt") if isinstance(t.get("agt"), dict) else None
    layers = t.get("trainable_layers")
    data = meta.get("data") or {}
    names = data.get("feature_names") or [f"x{i}" for i in range(run.input_dim)]
    return TrainingFacts(
        data_source=str(data.get("source", "?")),
        train_size=run.train_size,
        test_size=int(meta.get("test_size", 0)),
        input_dim=run.input_dim,
        num_classes=run.num_classes,
        labels=tuple(meta["labels"]),
        architecture=_architecture(meta["architecture"], run),
        algorithm=str(t.get("algorithm", "unrecorded")),
        epochs=_int(t.get("epochs")),
        lr=_num(t.get("lr")),
        weight_decay=_num(t.get("weight_decay")),
        batch_size=_int(t.get("batch_size")),
        seed=_int(t.get("seed")),
        networks=len(NetworkFile(run.path, run.meta)),
        fingerprint=t.get("fingerprint"),
        fine_tuned_from=None if init is None else str(init.get("sha256") or init.get("fingerprint")),
        trainable_layers=None if layers is None else tuple(int(i) for i in layers),
        agt_max_k=None if agt is None else _int(agt.get("max_k")),
        domain_lower=tuple(float(v) for v in lo),
        domain_upper=tuple(float(v) for v in hi),
        feature_names=tuple(str(n) for n in names),
        domain_from_data=_domain_from_data(run, lower, upper, offset, scale),
        external=(str(t.get("name", "")), str(t.get("version", "")), str(t.get("description", "")))
        if t.get("algorithm") == EXTERNAL_ALGORITHM
        else None,
        domain_given=data.get("domain_source") == "manifest",
    )


def _int(v: Any) -> int | None:
    return None if v is None or isinstance(v, bool) else int(v)


def _architecture(spec: Any, run: Run) -> str:
    if not isinstance(spec, dict):
        return str(spec)
    dense = "-".join(str(h) for h in [run.input_dim, *spec.get("hidden", []), run.num_classes])
    if spec.get("type") == "cnn":
        return (
            f"CNN: 1-D convolutions {spec.get('conv_channels')} (kernel {spec.get('kernel_size')}), "
            f"then dense {dense}, ReLU"
        )
    if spec.get("type") == "cnn2d":
        shape = "x".join(str(v) for v in spec.get("input_shape", []))
        return f"CNN: {spec.get('spec')} on {shape} (C x H x W) images, ReLU"
    return f"MLP {dense}, ReLU"


def _domain_from_data(
    run: Run, lower: np.ndarray, upper: np.ndarray, offset: np.ndarray, scale: np.ndarray
) -> bool | None:
    """True when, on some rescaled feature, the data's minimum and maximum both sit on the box's
    faces: the scaling was fitted to the data (no public --domain), so the box itself reveals the
    data's extremes. Features already in [0, 1] are not rescaled by `lucid train`, so their box says
    nothing beyond that range and does not count; for an imported run, a side other than [0, 1]
    that the rows touch at both ends does."""
    try:
        data = run.data()
    except LucidError:
        return None
    parts = [np.asarray(data[k], dtype=np.float64) for k in ("X_train", "X_test") if k in data and len(data[k])]
    if not parts:
        return None
    x = np.concatenate(parts).reshape(-1, run.input_dim)
    touches = (np.abs(x.min(0) - lower) <= _EDGE_TOLERANCE) & (np.abs(x.max(0) - upper) <= _EDGE_TOLERANCE)
    rescaled = (offset != 0.0) | (scale != 1.0)
    if (run.meta.get("training") or {}).get("algorithm") == EXTERNAL_ALGORITHM:
        # `lucid import` without a manifest domain takes a feature's range over the rows, unscaled,
        # wherever it leaves [0, 1]
        rescaled |= ~((lower == 0.0) & (upper == 1.0))
    return bool(np.any(touches & rescaled))


# ------------------------------------------------------------------------------------- evaluation


def _evaluation(
    run: Run, epsilons: list[tuple[str, float]], seed: int | None, progress: Callable[[str, int, int], None] | None
) -> tuple[EvaluationFacts | None, str]:
    from lucid.access.evaluate import evaluate_run

    data = run.data()
    if "X_test" not in data or len(data["X_test"]) == 0:
        return None, "the run has no test split (trained with --test-fraction 0): accuracy was not evaluated"
    result, plot = evaluate_run(run.path, epsilons, seed=seed, progress=progress)
    facts = EvaluationFacts(
        epsilons=tuple(k for k, _ in epsilons),
        seed=seed,
        result=result,
        confidence=np.asarray(plot["confidence"], dtype=np.float64),
        predicted=np.asarray(plot["classes"]),
        noised=np.asarray(plot["noised"], dtype=bool),
        betas=tuple(float(b) for b in plot["bounds"]),
        released_but_leaking=int(plot["released_but_leaking"]),
        bound_name=str(plot.get("bound_name", "iDP-DB")),
    )
    return facts, ""


# ------------------------------------------------------------------------------------- ledger


def _ledger(run: Run, memo: str | Path | None) -> tuple[LedgerFacts | None, str]:
    from lucid.access.classifier import run_ledger

    # a database URL stays text (a Path would fold its '//'); it is only ever shown without its password
    target = memo if is_database_url(memo) else (Path(memo) if memo is not None else run.path / MEMO_FILE)
    if memo is None and isinstance(target, Path) and not target.exists():  # (always a Path here)
        return None, (
            f"no memo at {target}: the run has not been served with `lucid serve` (or pass --memo), "
            "so there is no privacy ledger"
        )
    totals = run_ledger(run, target)
    rows = tuple(LedgerRow(t.client, t.answers, t.noised, t.refused, t.charged, t.spent, t.spent_tight) for t in totals)
    name = memo_name(target)
    note = "" if rows else f"{name}: the memo exists but no answers have been recorded yet"
    return LedgerFacts(memo=name, delta=DEFAULT_DELTA, rows=rows), note


# ------------------------------------------------------------------------------------- baselines


def _baselines(run: Run, baselines: str | Path | None) -> tuple[BaselineFacts | None, str]:
    path = Path(baselines) if baselines is not None else run.path / BASELINES_FILE
    if baselines is None and not path.exists():
        return None, (
            f"not run (no {path}; `python -m lucid.baselines {run.path} --json {path}` "
            "trains DP-SGD, ALIBI and subsample-and-aggregate for comparison)"
        )
    doc = read_json(
        path, missing=f"baseline results {path} do not exist", unreadable=f"cannot read baseline results {path}"
    )
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, dict) and "method" in r for r in results):
        raise LucidError(f"{path} is not the JSON of `python -m lucid.baselines --json` (a 'results' list)")
    rows = []
    for r in results:
        eps, acc = _num(r.get("epsilon")), _num(r.get("accuracy"))
        if (eps is not None and not math.isfinite(eps)) or (acc is not None and not 0 <= acc <= 1):
            raise LucidError(f"{path}: result {r.get('method')!r} has an invalid epsilon or accuracy")
        rows.append(BaselineRow(str(r["method"]), eps, acc, str(r.get("status", "ok")), str(r.get("message", ""))))
    return BaselineFacts(source=str(path), rows=tuple(rows)), ""
