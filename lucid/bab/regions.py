"""`lucid verify --regions K`: per-class bounds for up to K boxes of the domain (lucid/regions.py).

The domain is verified first, as without regions. Then, while the time limit and K allow, the
leaf box that noises the most *public* probability mass is split in two and both halves are
verified by the same branch-and-bound, restricted to their box: N's bounds, the screen, the
splitting tier, the MILPs and the witness search all see the smaller box. A child starts from
what its parent proved: the parent's per-network screened bounds (sound over any sub-box), the
parent's bound as a cap, and the parent's best leak when it lies in the child's box.

What "mass" means here: a sample of the domain that is public — a file of public inputs
(`--public-inputs`, in the data's units) or, without one, uniform samples of the domain. A sample
point x counts as noised in its leaf when N's confidence at x is <= the leaf's bound for N's
class at x. The training rows are never used to choose boxes. Whatever chooses them, the
guarantee holds (lucid/regions.py).

Screen first (unless the root's branch-and-bound finished every class): a box below the root
first gets only the screen (every network's bound over the box, seconds for thousands of
networks), which bounds most boxes around data far below their parent. The whole branch-and-bound deepens a screened box only when no split is left to make (K
leaves, or no leaf worth splitting), the boxes with the most noised public points first: a cheap
bound on many boxes releases more than a tight bound on few.

Anytime: a box that is not verified yet (or was cut short) keeps its parent's bound. The tree,
its bounds and the best leaks are checkpointed after every box (RUN/verify.checkpoint.json), so
`--resume` continues from the last finished box; the log gets one `region` event per box.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

import lucid.bab.display as live_display
import lucid.bab.engine as bab_engine
import lucid.bab.workers as executors
import lucid.witness.search as witness_search
from lucid.bab.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from lucid.bab.events import LOG_FILE, EventLog
from lucid.bab.partition import FlatParameters
from lucid.bab.session import terminate_as_interrupt
from lucid.bab.state import ClassState
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import Screen
from lucid.errors import LucidError
from lucid.network import confidence
from lucid.bab.region_choice import (box_owner, box_targets, box_time, box_to_continue, cheap_to_deepen, choose_leaf,
                                     choose_split, noised_mask, screen_first, share)
from lucid.regions import RegionTree
from lucid.rundir import Run, bound_entry_value, read_scaler, write_bounds
from lucid.settings import VerifySettings

UNIFORM_SAMPLES = 4096  # public sample of the domain when no --public-inputs file is given
# Seconds a finished box's last analyses get to end before their workers are replaced (restarting
# a worker costs seconds; waiting for a long MILP would overrun --time-limit).
REBIND_GRACE = 2.0


def verify_regions(run: Run, settings: VerifySettings, classes: list[int], result_options: dict,
                   fingerprint: str) -> dict:
    """Region-wise bounds of a run (module docstring); writes and returns bounds.json's content."""
    run_path = Path(run.path)
    ckpt_path = run_path / CHECKPOINT_FILE
    lower, upper = run.domain
    tree, leaks, elapsed_before = None, {}, 0.0
    screened: set[int] = set()  # leaves whose box has only its screen so far
    if settings.resume:
        saved = load_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options)
        try:
            tree = RegionTree.from_json(saved["regions"], lower, upper, run.num_classes, str(ckpt_path))
            leaks = {int(k): {int(c): w for c, w in v.items()} for k, v in saved["leaks"].items()}
            screened = {int(i) for i in saved.get("screened", [])}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LucidError(f"checkpoint {ckpt_path} is not a --regions checkpoint; delete it and run "
                             "without --resume") from None
        elapsed_before = float(saved["elapsed"])
    sample = public_sample(run, settings)

    root = VerificationProblem.from_run(run, bounds=settings.bounds, with_points=settings.search)
    if len(root.stack) < 2:
        raise LucidError(f"{run.path} has no leave-one-out networks to verify")
    if tree is None:
        tree = RegionTree(root.lower, root.upper, run.num_classes)
    if settings.workers is None:
        settings = replace(settings, workers=os.cpu_count() or 1)
    scores = root.stack.select(slice(0, 1)).forward(sample)[0]
    sample_class, sample_conf = scores.argmax(axis=1), confidence(scores)

    log = EventLog(run_path / LOG_FILE, elapsed_before=elapsed_before, append=settings.resume)
    all_options = dict(result_options, workers=settings.workers, time_limit=settings.time_limit, scheduler=None)
    log.emit("resumed" if settings.resume else "started", None, options=all_options, settings=settings.to_json(),
             networks=len(root.stack) - 1, run_fingerprint=fingerprint, regions=settings.regions)
    started = time.monotonic()
    holder = _ProblemHolder(root)
    executor = _make_executor(holder, settings)
    screens: dict[int, dict[int, np.ndarray]] = {}  # node -> class -> per-network screened bounds
    kept: dict[int, dict[int, ClassState]] = {}  # node -> class -> its branch-and-bound, cut short by time
    restore = terminate_as_interrupt()

    def checkpoint() -> None:
        save_checkpoint(ckpt_path, fingerprint=fingerprint, options=result_options,
                        elapsed=elapsed_before + time.monotonic() - started, classes={},
                        extra={"regions": tree.to_json(), "screened": sorted(screened),
                               "leaks": {str(k): {str(c): w for c, w in v.items()} for k, v in leaks.items()}})

    try:
        while True:
            left = None if settings.time_limit is None else settings.time_limit - (time.monotonic() - started)
            if left is not None and left <= 0:
                break
            screened &= set(tree.leaves())
            # (the rest of a carved box is verified over its parent's box: never again)
            unverified = [i for i in tree.leaves() if not tree.verified[i] and not tree.inherits_box(i)]
            leaf_of, noised = noised_mask(tree, sample, sample_class, sample_conf)
            counts = np.bincount(leaf_of[noised], minlength=len(tree))
            leaf = choose_leaf(tree, leaf_of, noised, settings.regions)
            # Boxes with noised public mass first; then splits; then the branch-and-bound of the
            # screened boxes, most noised first; boxes without noised mass only when nothing else is left.
            todo = [i for i in unverified if counts[i]]
            deepen = sorted((i for i in screened if counts[i]), key=lambda i: -counts[i])
            if not todo and leaf is not None:
                made = len(tree)
                _split_leaf(tree, leaf, sample[(leaf_of == leaf) & noised], leaks, settings, log)
                if leaf in screened:  # the rest of a carve of a screened box keeps the box: deepen it later
                    for rest in (i for i in range(made, len(tree)) if tree.inherits_box(i)):
                        screened.add(rest)
                        if tree.parent[rest] in screens:
                            screens[rest] = screens[tree.parent[rest]]
                checkpoint()
                continue
            if not todo and not deepen:
                again = box_to_continue(tree, leaf_of, noised, sample_class,
                                        {box: set(states) for box, states in kept.items()})
                if again is not None:  # a cut-short box, continued where it stopped (the root, at small K)
                    node, box_classes, boxes = again
                    here = np.isin(leaf_of, [i for i in tree.leaves() if box_owner(tree, i) == node]) & noised
                    targets = box_targets(sample_class[here], sample_conf[here], box_classes, tree.bound_lower[node])
                    limit = None if left is None else share(left, settings.time_limit, boxes)
                    kept[node] = _verify_box(tree, node, root, holder, executor, settings, box_classes, limit, screens,
                                             leaks, log, targets, continued=kept.pop(node))
                    checkpoint()
                    continue
                todo = unverified
                deepen = sorted(screened)
            if not todo and not deepen:
                break
            node = todo[0] if todo else deepen[0]
            here = (leaf_of == node) & noised
            noised_here = set(sample_class[here].tolist())
            # the root is verified as without --regions (every class: unseen inputs may have any class)
            box_classes = classes if node == 0 else [c for c in classes if c in noised_here] or classes
            if todo and node != 0 and screen_first(tree, classes, settings):
                _screen_box(tree, node, root, settings, box_classes, screens, leaks, log)
                screened.add(node)
                checkpoint()
                if not cheap_to_deepen(tree, node, screens[node], sample_class[here], sample_conf[here]):
                    continue
                todo = []  # the screen left few networks to prove: its branch-and-bound now
                left = None if left is None else settings.time_limit - (time.monotonic() - started)
                if left is not None and left <= 0:  # the screen took the rest: the box stays screened
                    break
            waiting = len(unverified) + len(deepen) if todo else len(deepen)
            to_come = max(0, settings.regions - len(tree.leaves())) if leaf is not None else 0
            limit = None if left is None else box_time(left, settings.time_limit, node, waiting, to_come)
            # A level only where the exact bound proved too dear: in a box whose parent's
            # verification of the class was cut short (a level stops a box that could go exact).
            parent = tree.parent[node]
            hard = [c for c in box_classes if parent >= 0 and not tree.complete[parent][c]]
            targets = box_targets(sample_class[here], sample_conf[here], hard, tree.bound_lower[node])
            kept[node] = _verify_box(tree, node, root, holder, executor, settings, box_classes, limit, screens, leaks,
                                     log, targets)
            screened.discard(node)
            checkpoint()
    except KeyboardInterrupt:
        checkpoint()  # every finished box is kept; resume continues from here
        raise
    finally:
        restore()
        executor.close()
        log.close()
    entries = _bounds_entries(tree, classes, leaks, elapsed_before + time.monotonic() - started)
    result = write_bounds(run_path, entries, solver=settings.solver, options=all_options, regions=tree.to_json())
    with EventLog(run_path / LOG_FILE, elapsed_before=elapsed_before + time.monotonic() - started, append=True) as tail:
        tail.emit("finished", None, bounds=result["bounds"], regions=len(tree.leaves()))
    return result


# --- where to work --------------------------------------------------------------------------------
def public_sample(run: Run, settings: VerifySettings) -> np.ndarray:
    """The public points that weigh the boxes (network space, inside the domain)."""
    lower, upper = run.domain
    if settings.public_inputs is None:
        rng = np.random.default_rng(settings.seed)
        return lower + (upper - lower) * rng.random((UNIFORM_SAMPLES, len(lower)))
    path = Path(settings.public_inputs)
    try:
        with np.load(path, allow_pickle=False) as npz:
            X = np.asarray(npz["X"], dtype=np.float64)
    except FileNotFoundError:
        raise LucidError(f"--public-inputs: {path} does not exist") from None
    except (KeyError, ValueError, OSError) as exc:
        raise LucidError(f"--public-inputs: {path} must be a .npz file with an array X ({exc})") from None
    if X.ndim != 2 or X.shape[1] != len(lower) or len(X) == 0:
        raise LucidError(f"--public-inputs: X must have shape [rows, {len(lower)}], got {list(X.shape)}")
    if not np.isfinite(X).all():
        raise LucidError("--public-inputs: X has NaN or infinite values")
    offset, scale = read_scaler(run)
    return np.clip((X - offset) * scale, lower, upper)


def _split_leaf(tree: RegionTree, leaf: int, points: np.ndarray, leaks: dict, settings: VerifySettings,
                log: EventLog) -> None:
    """Split `leaf` around its noised public `points` (lucid/bab/region_choice.py)."""
    splits, kept = choose_split(tree, leaf, points, leaks.get(leaf, {}), room=settings.regions - len(tree.leaves()))
    for split in splits:
        if split.box is not None:
            children = tree.carve(leaf, *split.box)
            log.emit("region_split", None, box=leaf, lower=split.box[0].tolist(), upper=split.box[1].tolist(),
                     children=list(children))
        else:
            children = tree.split(leaf, split.feature, split.threshold)
            log.emit("region_split", None, box=leaf, feature=split.feature, threshold=split.threshold,
                     children=list(children))
        leaf = int(tree.locate(kept[:1])[0])  # the next split is of the piece that holds `kept`


# --- one box --------------------------------------------------------------------------------------
class _ProblemHolder:
    """The problem the in-process executor analyses (swapped per box)."""

    def __init__(self, problem: VerificationProblem) -> None:
        self.problem = problem


def _make_executor(holder: _ProblemHolder, settings: VerifySettings) -> executors.Executor:
    if settings.workers == 1:
        return executors.ThreadExecutor(
            lambda *args, **kw: executors.analyse_with(holder.problem, settings, *args, **kw), 1)
    return executors.ProcessExecutor(holder.problem, settings, settings.workers)


def _box_problem(tree: RegionTree, node: int, root: VerificationProblem) -> VerificationProblem:
    if node == 0:
        return root
    lo, hi = tree.box(node)
    problem = VerificationProblem.from_stack(root.stack, lo, hi, bounds=root.bounds_method)
    if root.points is not None:
        inside = np.all((root.points >= lo) & (root.points <= hi), axis=1)
        problem.points = root.points[inside] if inside.any() else None
    return problem


def _screen_box(tree: RegionTree, node: int, root: VerificationProblem, settings: VerifySettings,
                classes: list[int], screens: dict, leaks: dict, log: EventLog) -> None:
    """The screen of `node`'s box for `classes`: each network's bound is the smaller of its own
    screen over the box and its nearest verified ancestor's (both sound over the box), and the
    box's bound per class the largest of them. Its lower bounds are the leaks its ancestors found
    inside it. Not complete unless the bound meets such a leak or is <= 0."""
    t0 = time.monotonic()
    problem = _box_problem(tree, node, root)
    prior = _nearest(tree, node, screens)
    open_classes = [c for c in classes if tree.bound_upper[node][c] > 0]
    upper = tree.bound_upper[node].copy()
    lower = np.full(tree.num_classes, -np.inf)
    inherited = _inherited_leaks(tree, node, leaks)
    leaks[node], screens[node] = {}, {}
    if open_classes:
        screen = Screen(problem, settings.screen, settings.device, open_classes)
        positions = np.arange(1, len(problem.stack), dtype=np.int64)
        known = {c: prior[c][positions] for c in open_classes if c in prior}
        for c, found in screen.highest(open_classes, positions, known).items():
            bound = np.full(len(problem.stack), -np.inf)
            bound[positions] = found
            screens[node][c] = bound
            upper[c] = min(upper[c], float(bound.max()))
    for c, leak in inherited.items():
        lower[c] = leak["value"]
        leaks[node][c] = leak
    found = np.isfinite(lower)
    meets = upper <= np.where(found, lower + EXACT_TOLERANCE * np.maximum(1.0, np.abs(np.where(found, lower, 0))),
                              -np.inf)
    complete = ~(upper > 0) | meets
    seconds = round(time.monotonic() - t0, 3)  # the same figure in the tree and the log, which `lucid log` sums
    tree.record(node, upper, lower, seconds, complete)
    lo, hi = tree.box(node)
    parent = tree.parent[node]
    log.emit("region", None, box=node, parent=None if parent < 0 else parent, depth=tree.depth_of(node),
             box_lower=lo.tolist(), box_upper=hi.tolist(), seconds=seconds, screen_only=True,
             complete={str(c): bool(tree.complete[node][c]) for c in open_classes},
             upper={str(c): bound_entry_value(tree.bound_upper[node][c], upper=True) for c in open_classes},
             lower={str(c): bound_entry_value(tree.bound_lower[node][c], upper=False) for c in open_classes})


EXACT_TOLERANCE = 1e-6  # a bound within this (relative) of a leak in its box is that box's exact bound


def _verify_box(tree: RegionTree, node: int, root: VerificationProblem, holder: _ProblemHolder,
                executor: executors.Executor, settings: VerifySettings, classes: list[int], limit: float | None,
                screens: dict, leaks: dict, log: EventLog, targets: dict[int, float] | None = None,
                continued: dict[int, ClassState] | None = None) -> dict[int, ClassState]:
    """The whole branch-and-bound of `node`'s box for `classes`, starting from its ancestors' screens
    and leaks; a box screened already (`_screen_box`, or the rest of a screened carve, which keeps
    its box) starts from those bounds instead of screening again. `continued`: the states of the
    box's earlier branch-and-bound that a time limit cut short, continued where they stopped.
    Returns the states of the classes cut short this time (to be continued later)."""
    t0 = time.monotonic()
    problem = _box_problem(tree, node, root)
    holder.problem = problem
    executor.rebind(problem, grace=REBIND_GRACE)
    box_settings = replace(settings, time_limit=limit, resume=False)
    parent = tree.parent[node]
    parent_screens = _nearest(tree, node, screens)
    # A class whose bound is already <= 0 here releases every confident input: nothing to gain.
    open_classes = [c for c in classes if tree.bound_upper[node][c] > 0]
    screen = None if settings.screen == "none" else Screen(problem, settings.screen, settings.device, open_classes)

    def initial(c: int, positions: np.ndarray) -> np.ndarray:
        own = screen.initial(c, positions)
        prior = parent_screens.get(c)
        return own if prior is None else np.minimum(own, prior[positions])

    lo, hi = tree.box(node)
    if not open_classes:
        tree.record(node, tree.bound_upper[node], tree.bound_lower[node], 0.0, np.ones(tree.num_classes, bool))
        log.emit("region", None, box=node, parent=None if parent < 0 else parent, depth=tree.depth_of(node),
                 box_lower=lo.tolist(), box_upper=hi.tolist(), seconds=0.0, skipped=True)
        return {}
    classes = open_classes
    states = {c: ClassState(cls=c) for c in classes}
    for c, leak in _inherited_leaks(tree, node, leaks).items():
        if c in states:
            states[c].lower, states[c].lower_row, states[c].lower_witness = leak["value"], leak["row"], leak["x"]
    for c, bound in screens.get(node, {}).items():
        if c in states:
            states[c].screen = bound.copy()
    states.update({c: cs for c, cs in (continued or {}).items() if c in states})
    for c, cs in states.items():
        cs.target = (targets or {}).get(c)
    search = (partial(witness_search.search_class_witness, problem, points=problem.points)
              if settings.search else None)
    title = f"lucid verify --regions: box {node} of at most {2 * settings.regions - 1}"
    with live_display.LiveDisplay(title, enabled=settings.progress) as display:
        engine = bab_engine.Engine(
            executor, classes, len(problem.stack), box_settings, params=FlatParameters(problem.stack),
            screen=None if screen is None else initial,
            refine=screen.refine if screen is not None and screen.refines else None, search=search,
            on_progress=display.update, states=states)
        engine.run()
    upper = tree.bound_upper[node].copy()  # classes not verified here keep what they had
    lower = np.full(tree.num_classes, -np.inf)
    complete = tree.complete[node] | ~(upper > 0)
    leaks[node] = {}
    screens[node] = {}
    for c, cs in engine.states.items():
        upper[c] = cs.upper
        complete[c] = cs.complete
        if cs.lower is not None:
            lower[c] = cs.lower
            leaks[node][c] = {"x": cs.lower_witness, "row": cs.lower_row, "value": cs.lower}
        if cs.screen is not None:
            screens[node][c] = cs.screen
    seconds = round(time.monotonic() - t0, 3)  # the same figure in the tree and the log, which `lucid log` sums
    tree.record(node, upper, lower, seconds, complete)
    log.emit("region", None, box=node, parent=None if parent < 0 else parent, depth=tree.depth_of(node),
             box_lower=lo.tolist(), box_upper=hi.tolist(), seconds=seconds,
             complete={str(c): bool(cs.complete) for c, cs in engine.states.items()},
             upper={str(c): bound_entry_value(tree.bound_upper[node][c], upper=True) for c in classes},
             lower={str(c): bound_entry_value(tree.bound_lower[node][c], upper=False) for c in classes})
    return {c: _to_continue(cs) for c, cs in engine.states.items() if cs.reason == "time limit"}


def _to_continue(cs: ClassState) -> ClassState:
    """A class state cut short, as a later branch-and-bound of the same box continues it: through its
    checkpoint form, which turns the analyses that were running into ones to redo."""
    again = ClassState.from_json(cs.cls, cs.to_json())
    again.screen, again.refined = cs.screen, cs.refined
    return again


def _nearest(tree: RegionTree, node: int, screens: dict) -> dict:
    """The per-network screened bounds of `node`'s nearest verified ancestor (the rest of a carve is
    never verified: its children start from the box it inherits). Sound for `node`: an ancestor's
    box holds it."""
    return next((screens[a] for a in tree.ancestors(node) if a in screens), {})


def _inherited_leaks(tree: RegionTree, node: int, leaks: dict) -> dict[int, dict]:
    """Per class, the best leak any ancestor found inside `node`'s box: a true lower bound there."""
    lo, hi = tree.box(node)
    best: dict[int, dict] = {}
    for ancestor in tree.ancestors(node):
        for c, leak in leaks.get(ancestor, {}).items():
            x = np.asarray(leak["x"], dtype=np.float64)
            if np.all(x >= lo) and np.all(x <= hi) and (c not in best or leak["value"] > best[c]["value"]):
                best[c] = leak
    return best


def _leaves_exact(tree: RegionTree, c: int) -> bool:
    """Every leaf's bound met a leak in that leaf (up to the safety margins): no leaf stopped at a
    target level or a --gap."""
    return all(_leaf_exact(tree.bound_upper[i][c], tree.bound_lower[i][c]) for i in tree.leaves())


def _leaf_exact(upper: float, lower: float) -> bool:
    """No leak possible (upper = -inf), or a leak found within the tolerance of the upper bound. A finite
    upper bound with no leak found (lower = -inf) is not exact: without the finite check, inf <= 1e-6 * inf."""
    if upper == -np.inf:
        return True
    return bool(np.isfinite(lower) and upper - lower <= EXACT_TOLERANCE * max(1.0, abs(lower)))


def _bounds_entries(tree: RegionTree, classes: list[int], leaks: dict, seconds: float) -> dict[str, dict]:
    """bounds.json's per-class entries: the domain's bound as the leaves prove it."""
    upper = tree.leaf_upper()
    lower = tree.best_lower()
    complete = tree.leaves_complete()
    out = {}
    for c in classes:
        row = None
        for node_leaks in leaks.values():
            leak = node_leaks.get(c)
            if leak is not None and leak["value"] == lower[c]:
                row = leak["row"]
        # complete: every leaf's verification of the class finished (exact, or down to its target level)
        done = bool(complete[c])
        out[str(c)] = {"upper": bound_entry_value(upper[c], upper=True),
                       "lower": bound_entry_value(lower[c], upper=False),
                       "complete": done, "exact": done and _leaves_exact(tree, c), "seconds": round(seconds, 3),
                       "nodes": len(tree), "reason": "regions", "leaking_row": row}
    return out


