"""The label-only access layer: mechanism, memo and the Python wrapper (paper Algorithm 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lucid.access import (Charge, ClassifierOptions, LabelOnlyClassifier, Memo, RandomSource, exponential_mechanism,
                          true_label_probability)
from serve_helpers import LABELS, OFFSET, SCALE  # the run of the `run_dir` fixture (conftest.py)
from synthetic_runs import write_bounds, write_synthetic_run
from thread_helpers import run_threads
from lucid.errors import LucidError
from lucid.network import confidence, load_networks

# x_net = (x - OFFSET) * SCALE; domain [0, 1]^2 in network space


def to_orig(xn: np.ndarray) -> np.ndarray:
    return xn / SCALE + OFFSET


def reference_n(run_dir, xn):
    """N's class and confidence from the shared IR (an independent forward implementation)."""
    scores = load_networks(run_dir).forward(xn)[0]
    return scores.argmax(1), confidence(scores)


# -- the exponential mechanism ----------------------------------------------------------------
@pytest.mark.parametrize("eps,num_classes", [(0.0, 3), (2.0, 3), (1.0, 2), (6.0, 4)])
def test_exponential_mechanism_matches_its_distribution(eps, num_classes):
    rng = RandomSource(seed=1)
    n = 40_000
    classes = np.arange(n) % num_classes
    drawn = exponential_mechanism(classes, num_classes, eps, rng)
    p_true = np.exp(eps / 2) / (np.exp(eps / 2) + num_classes - 1)
    assert true_label_probability(eps, num_classes) == pytest.approx(p_true)
    assert np.mean(drawn == classes) == pytest.approx(p_true, abs=0.015)
    # Every wrong class is equally likely: (1 - p) / (C - 1) each.
    offsets = (drawn - classes) % num_classes
    for k in range(1, num_classes):
        assert np.mean(offsets == k) == pytest.approx((1 - p_true) / (num_classes - 1), abs=0.015)
    assert drawn.min() >= 0 and drawn.max() < num_classes


def test_huge_epsilon_does_not_overflow_and_releases_the_label():
    drawn = exponential_mechanism(np.array([2, 0, 1]), 3, 1e6, RandomSource(seed=0))
    assert drawn.tolist() == [2, 0, 1]


def test_unseeded_randomness_comes_from_the_os():
    a, b = RandomSource().uniform(1000), RandomSource().uniform(1000)
    assert ((a >= 0) & (a < 1)).all() and not np.array_equal(a, b)
    assert 0.45 < a.mean() < 0.55


# -- the wrapper --------------------------------------------------------------------------
def test_released_labels_are_ns_labels_and_noise_follows_the_bounds(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(seed=0))
    xn = np.random.default_rng(5).random((400, 2))
    cls, conf = reference_n(run_dir, xn)
    upper = np.array([0.3, np.inf, -1.0])
    expected_noised = ~(conf > upper[cls])
    got_cls, noised = clf.decide(clf.to_network_space(to_orig(xn)))
    assert np.array_equal(got_cls, cls)
    assert np.array_equal(noised, expected_noised)
    assert 0 < noised.sum() < len(xn)  # the fixture exercises both branches
    labels = clf.predict(to_orig(xn))
    assert labels.tolist()[:3] == [LABELS[c] for c in clf.predict_index(to_orig(xn[:3]))]
    released = ~expected_noised
    assert (labels[released] == np.asarray(LABELS)[cls[released]]).all()
    # Class 1 has no bound (null): every input N labels 1 is noised; class 2 (bound -1) never.
    assert noised[cls == 1].all() and not noised[cls == 2].any()


def test_release_needs_the_bound_plus_the_float_error_of_n(run_dir):
    """Bounds are about exact arithmetic; N's confidence here is float64, so a confidence less than
    E_N above the bound is noised (the old rule, confidence > bound, released it)."""
    xn = np.array([[0.5, 0.5]])
    cls, conf = reference_n(run_dir, xn)
    c, conf = int(cls[0]), float(conf[0])
    write_bounds(run_dir, {c: conf})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(seed=0))
    err = clf.confidence_error
    assert 0 < err < 1e-12
    assert clf.decide(xn)[1].tolist() == [True]
    write_bounds(run_dir, {c: conf - err / 2})
    assert conf > conf - err / 2
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(seed=0))
    assert clf.decide(xn)[1].tolist() == [True]
    write_bounds(run_dir, {c: conf - 2 * err})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(seed=0))
    assert clf.decide(xn)[1].tolist() == [False]


def test_noised_answers_are_memoised_and_survive_a_restart(run_dir, tmp_path):
    write_bounds(run_dir, {0: None, 1: None, 2: None})  # everything noised
    memo_file = tmp_path / "memo.sqlite"
    x = to_orig(np.random.default_rng(2).random((300, 2)))
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, memo=memo_file, options=ClassifierOptions(seed=1))
    first = clf.predict(x)
    # eps = 0: uniform draws, so the memo (not N) is what makes repeats agree.
    assert len(set(first.tolist())) == 3
    assert np.array_equal(clf.predict(x[::-1]), first[::-1])
    assert len(clf.memo) == 300
    clf.close()
    again = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, memo=memo_file, options=ClassifierOptions(seed=99))
    assert np.array_equal(again.predict(x), first)
    # in-memory memo: new draws
    fresh = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, options=ClassifierOptions(seed=99))
    assert not np.array_equal(fresh.predict(x), first)


def test_duplicate_inputs_in_one_batch_share_one_draw(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, options=ClassifierOptions(seed=3))
    x = np.repeat(to_orig(np.random.default_rng(0).random((20, 2))), 30, axis=0)
    labels = clf.predict(x).reshape(20, 30)
    assert (labels == labels[:, :1]).all()
    assert len(clf.memo) == 20


def test_clip_keys_the_memo_on_the_clipped_point(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, options=ClassifierOptions(clip=True, seed=4))
    # 200 distinct raw inputs that all clip to the corner (1, 1): one draw, not 200.
    xn = np.column_stack([1 + np.linspace(0.1, 5, 200), 1 + np.linspace(0.1, 3, 200)])
    labels = clf.predict(to_orig(xn))
    assert len(set(labels.tolist())) == 1
    assert labels[0] == clf.predict(to_orig(np.array([[1.0, 1.0]])))[0]
    assert len(clf.memo) == 1


def test_negative_zero_and_rounding_at_the_domain_edge(run_dir):
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, options=ClassifierOptions(seed=5))
    # Original-unit edges that scale to 0 / 1 up to float rounding are accepted.
    edge = np.array([[10.0, -5.0], [12.0, -4.5], [10.0 + 1e-13, -4.5]])
    clf.predict(edge)
    a = clf.to_network_space(np.array([[10.0, -5.0]]))
    assert not np.signbit(a).any()


@pytest.mark.parametrize(
    "bad,message",
    [
        ([[10.5]], "2 features"),
        ([[10.5, -4.8, 1.0]], "2 features"),
        ([10.5, -4.8], "2-D"),
        ([[10.5, float("nan")]], "finite"),
        ([[float("inf"), -4.8]], "finite"),
        ([["10.5", "-4.8"]], "only numbers"),
        ([[10.5, None]], "only numbers"),
        ([[10.5, -4.8], [10.5]], "rectangular"),
        ([[9.0, -4.8]], "outside the verified domain"),
        ([[10.5, -4.0]], "outside the verified domain"),
        ([[1.7e308, -4.8]], "outside the verified domain"),
    ],
)
def test_bad_inputs_are_refused_with_a_clear_message(run_dir, bad, message):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(seed=0))
    with pytest.raises(LucidError, match=message):
        clf.predict(bad)


def test_clip_still_refuses_values_that_overflow_when_scaled(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(clip=True))
    assert clf.predict([[1e300, -4.8]]).shape == (1,)  # clipped
    with pytest.raises(LucidError, match="outside the verified domain"):
        clf.predict([[-1.7e308, 1.7e308]])  # (x - offset) * scale overflows to inf


def test_empty_batch(run_dir):
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    assert clf.predict(np.zeros((0, 2))).shape == (0,)


def test_bounds_file_problems(run_dir):
    (run_dir / "bounds.json").unlink()
    with pytest.raises(LucidError, match="lucid verify"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    (run_dir / "bounds.json").write_text("{not json")
    with pytest.raises(LucidError, match="corrupt"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    write_bounds(run_dir, {7: 0.1})
    with pytest.raises(LucidError, match="out of range"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    doc = {"format": "lucid-bounds/1", "bounds": {"0": {"upper": "high"}}}
    (run_dir / "bounds.json").write_text(json.dumps(doc))
    with pytest.raises(LucidError, match="finite number or null"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    # A class missing from bounds.json, or an anytime (incomplete) bound, still works.
    write_bounds(run_dir, {0: 0.2}, complete=False)
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    assert clf.bounds[0] == 0.2 and np.isinf(clf.bounds[1:]).all()


@pytest.mark.parametrize("eps", [-1, float("nan"), float("inf"), "abc"])
def test_bad_epsilon(run_dir, eps):
    with pytest.raises(LucidError, match="epsilon"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=eps)


def test_cnn_runs_are_lowered_and_match_the_ir(tmp_path):
    from safetensors.numpy import save_file

    run = write_synthetic_run(tmp_path / "cnn", input_dim=5, bounds={0: 0.1, 1: None, 2: 0.0})
    rng = np.random.default_rng(0)
    k = 6
    tensors = {
        "conv.0.weight": rng.normal(size=(k, 2, 1, 3)).astype(np.float32),
        "conv.0.bias": rng.normal(size=(k, 2)).astype(np.float32),
        "layers.0.weight": rng.normal(size=(k, 4, 6)).astype(np.float32),
        "layers.0.bias": rng.normal(size=(k, 4)).astype(np.float32),
        "layers.1.weight": rng.normal(size=(k, 3, 4)).astype(np.float32),
        "layers.1.bias": rng.normal(size=(k, 3)).astype(np.float32),
        "removed": np.arange(-1, 5, dtype=np.int64),
    }
    save_file(tensors, str(run / "networks.safetensors"))
    meta = json.loads((run / "run.json").read_text())
    meta["architecture"] = {"type": "cnn", "conv_channels": [2], "kernel_size": 3, "hidden": [4]}
    (run / "run.json").write_text(json.dumps(meta))
    clf = LabelOnlyClassifier.from_run(run, epsilon=1.0, options=ClassifierOptions(seed=0))
    xn = rng.random((50, 5))
    assert np.allclose(clf.scores(xn), load_networks(run).forward(xn)[0])


# -- the memo -----------------------------------------------------------------------------
def test_memo_evicts_the_least_recently_used(tmp_path):
    memo = Memo(tmp_path / "m.sqlite", max_size=3)
    memo.get_or_put([b"a", b"b", b"c"], np.array([0, 1, 2]))
    assert memo.get_or_put([b"a"], np.array([9])).tolist() == [0]  # a is now the newest
    memo.get_or_put([b"d"], np.array([1]))  # evicts b, the least recently used
    assert len(memo) == 3
    assert memo.lookup(b"b") is None and memo.lookup(b"a") == 0 and memo.lookup(b"d") == 1
    memo.close()
    # A smaller size on reopening trims the file at once.
    small = Memo(tmp_path / "m.sqlite", max_size=1)
    assert len(small) == 1 and small.lookup(b"d") == 1


def test_memo_refuses_another_models_file_and_garbage(tmp_path):
    Memo(tmp_path / "m.sqlite", fingerprint="model-a").close()
    with pytest.raises(LucidError, match="different model"):
        Memo(tmp_path / "m.sqlite", fingerprint="model-b")
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LucidError, match="memo"):
        Memo(tmp_path / "junk.sqlite")
    with pytest.raises(LucidError, match="not a directory"):
        Memo(tmp_path / "missing" / "m.sqlite")
    with pytest.raises(LucidError, match="at least 1"):
        Memo(None, max_size=0)


def test_memo_is_consistent_under_concurrent_writers(tmp_path):
    """Threads on one connection and a second connection race on the same keys: one draw wins."""
    path = tmp_path / "m.sqlite"
    memos = [Memo(path), Memo(path)]
    keys = [f"k{i}".encode() for i in range(50)]
    answers: list[dict[bytes, int]] = []

    def worker(t: int) -> None:
        seen: dict[bytes, int] = {}
        for _ in range(5):
            got = memos[t % 2].get_or_put(keys, np.full(len(keys), t))
            for k, v in zip(keys, got.tolist()):
                assert seen.setdefault(k, v) == v
        answers.append(seen)

    errors = run_threads(worker, 6)
    assert not errors, errors
    assert all(a == answers[0] for a in answers)
    assert len(memos[0]) == 50


def test_no_noise_is_drawn_for_memo_hits():
    memo = Memo(None)
    calls = []

    def propose(missing):
        calls.append(missing.tolist())
        return np.full(len(missing), 2)

    assert memo.get_or_put([b"a", b"b"], propose).tolist() == [2, 2]
    assert memo.get_or_put([b"a", b"c", b"a"], propose).tolist() == [2, 2, 2]
    assert memo.get_or_put([b"c", b"b"], propose).tolist() == [2, 2]  # all hits: no call
    assert calls == [[0, 1], [1]]


# -- constant work and the privacy ledger ----------------------------------------------------
def _sql_shape(statements: list[str]) -> list[str]:
    """SQL as executed, with every literal (blob, string, number) masked."""
    import re

    masked = []
    for s in statements:
        s = re.sub(r"[xX]'[0-9a-fA-F]*'", "?", s)
        s = re.sub(r"'[^']*'", "?", s)
        masked.append(re.sub(r"(?<![\w.])-?\d+(\.\d+)?([eE][-+]?\d+)?", "?", s))
    return masked


def test_released_and_noised_rows_do_the_same_work(run_dir):
    """All-released and all-noised queries: the same draws, the same SQL statements, the same
    memo and ledger writes; only the label values (and the noised flags) differ."""
    xn = np.random.default_rng(7).random((40, 2))
    traces, draws, answers = {}, {}, {}
    for name, bounds in [("released", {0: -1.0, 1: -1.0, 2: -1.0}), ("noised", {0: None, 1: None, 2: None})]:
        write_bounds(run_dir, bounds)
        clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.0, options=ClassifierOptions(seed=0))
        assert clf.decide(xn)[1].all() == (name == "noised") and clf.decide(xn)[1].any() == (name == "noised")
        calls: list[int] = []
        uniform = clf.rng.uniform
        clf.rng.uniform = lambda n: calls.append(n) or uniform(n)
        statements: list[str] = []
        clf.memo._db.set_trace_callback(statements.append)
        labels = [clf.predict_index(to_orig(xn[i : i + 1]))[0] for i in range(20)]  # single queries
        labels += clf.predict_index(to_orig(xn)).tolist()  # a batch: 20 new rows, 20 repeats
        labels += clf.predict_index(to_orig(xn[:5]), client="other").tolist()
        clf.memo._db.set_trace_callback(None)
        traces[name], draws[name], answers[name] = _sql_shape(statements), calls, labels
        assert len(clf.memo) == 40  # released answers are memoised too
        stored = dict(clf.memo._db.execute("SELECT label, noised FROM memo").fetchall())
        assert set(stored.values()) == {int(name == "noised")}
        clf.close()
    # one draw per row not in the memo yet, on both branches: the batch's 20 repeats and the other
    # client's 5 stored rows draw nothing
    assert draws["released"] == draws["noised"] == [1] * 20 + [20]
    assert traces["released"] == traces["noised"]
    assert any("INSERT INTO memo" in s for s in traces["released"])
    cls = reference_n(run_dir, xn)[0]
    assert answers["released"][:20] == cls[:20].tolist()
    assert answers["noised"] != answers["released"]  # eps = 0: uniform draws, not N's labels


def _split_by_branch(run_dir):
    """Network-space inputs the fixture's bounds release, and ones they noise (from the IR)."""
    xn = np.random.default_rng(5).random((400, 2))
    cls, conf = reference_n(run_dir, xn)
    noised = ~(conf > np.array([0.3, np.inf, -1.0])[cls])
    assert noised.sum() >= 30 and (~noised).sum() >= 30
    return xn[~noised], xn[noised]


def test_ledger_totals_on_a_scripted_sequence(run_dir, tmp_path):
    rel, noi = _split_by_branch(run_dir)
    rel, noi = rel[:6], noi[:6]
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=tmp_path / "m.sqlite",
                                       options=ClassifierOptions(seed=0))
    first = clf.predict(to_orig(np.vstack([rel[:3], noi[:2]])))  # default: 3 released, 2 noised
    again = clf.predict(to_orig(np.vstack([noi[:2], rel[:3]])))  # repeats: memo, no charge
    assert again.tolist() == first[[3, 4, 0, 1, 2]].tolist()
    clf.predict(to_orig(np.vstack([noi[2:3], noi[2:3], rel[3:4]])))  # a duplicate in one batch
    clf.predict(to_orig(np.vstack([rel[:2], noi[:3]])), client="alice")  # others' memo entries
    clf.predict(to_orig(noi[3:6]), client="bob")
    clf.predict(to_orig(noi[3:6]), client="bob")
    clf.close()
    # ... and the totals survive reopening the file.
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=tmp_path / "m.sqlite",
                                       options=ClassifierOptions(seed=1))
    totals = {t.client: t for t in clf.ledger()}
    assert list(totals) == ["alice", "bob", "default", "*"]
    expect = {"default": (5 + 2, 2 + 1), "alice": (5, 3), "bob": (3, 3), "*": (4 + 6, 3 + 3)}
    for client, (answers, noised) in expect.items():
        t = totals[client]
        assert (t.answers, t.noised, t.refused) == (answers, noised, 0), client
        assert t.charged == pytest.approx(0.5 * answers) and t.spent == pytest.approx(0.5 * noised)
        assert 0 < t.spent_tight <= t.spent
    assert totals["default"].by_epsilon == [{"epsilon": 0.5, "answers": 7, "noised": 3, "refused": 0}]
    # A restart with another epsilon is refused: the stored draws keep theirs (memo/metadata.py) ...
    with pytest.raises(LucidError, match="epsilon = 0.5"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=2.0, memo=clf.memo, options=ClassifierOptions(seed=1))
    # ... while a ledger with several epsilons (a file written before memos recorded theirs) keeps
    # one group per epsilon, and the totals add up.
    from lucid.access import summarise

    t = {t.client: t for t in summarise([*clf.memo.ledger_rows(), ("default", 2.0, 1, 1, 0)])}["default"]
    assert (t.answers, t.noised) == (8, 4) and t.spent == pytest.approx(1.5 + 2.0)
    assert t.spent_tight <= t.spent


def test_budget_refuses_on_the_worst_case_whatever_the_branch(run_dir, tmp_path):
    from lucid.access import BudgetExceeded

    rel, noi = _split_by_branch(run_dir)
    memo = Memo(tmp_path / "m.sqlite")
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=memo, options=ClassifierOptions(seed=0, budget=3.0))
    # Client r only ever got released answers, client n only noised ones: both are refused at
    # the 4th distinct input, released or noised, so the refusal says nothing about the branch.
    for client, mine in [("r", rel), ("n", noi)]:
        seen = clf.predict(to_orig(mine[:2]), client=client)
        seen = np.concatenate([seen, clf.predict(to_orig(mine[2:3]), client=client)])
        for probe in (rel[10:11], noi[10:11], np.vstack([mine[:1], rel[11:12]])):
            with pytest.raises(BudgetExceeded, match="budget"):
                clf.predict(to_orig(probe), client=client)
        # Its answered inputs still come from the memo, identically.
        assert clf.predict(to_orig(mine[:3][::-1]), client=client).tolist() == seen[::-1].tolist()
    assert len(memo) == 6  # refused requests stored nothing
    totals = {t.client: t for t in clf.ledger()}
    assert (totals["r"].answers, totals["r"].noised, totals["r"].refused) == (3, 0, 3)
    assert (totals["n"].answers, totals["n"].noised, totals["n"].refused) == (3, 3, 3)
    assert totals["r"].charged == totals["n"].charged == 3.0
    # Another client is unaffected, and a batch that fits exactly is answered.
    assert len(clf.predict(to_orig(np.vstack([rel[20:22], noi[20:21]])), client="x")) == 3
    with pytest.raises(LucidError, match="client name"):
        clf.predict(to_orig(rel[:1]), client="*")  # the all-clients row is not a client


def test_old_memo_files_are_migrated(tmp_path):
    """lucid-memo/1 (noised answers only, no ledger): stored answers keep being read, but their
    epsilon is unknown, so no new answer is drawn into the file; an empty one is simply upgraded.
    (lucid-memo/2 files: tests/access/test_serve_hardening.py.)"""
    import sqlite3

    from lucid.access import read_ledger

    for path, stored in [(tmp_path / "old.sqlite", "INSERT INTO memo VALUES (x'01', 2, 5);"),
                         (tmp_path / "empty.sqlite", "")]:
        db = sqlite3.connect(path)
        db.executescript(
            "CREATE TABLE memo (key BLOB PRIMARY KEY, label INTEGER NOT NULL, used INTEGER NOT NULL) WITHOUT ROWID;"
            "CREATE TABLE meta (name TEXT PRIMARY KEY, value);"
            f"INSERT INTO meta VALUES ('format', 'lucid-memo/1'), ('fingerprint', ''), ('count', {int(bool(stored))});"
            + stored
        )
        db.commit()
        db.close()
    with pytest.raises(LucidError, match="cannot be established"):
        Memo(tmp_path / "old.sqlite", epsilon=1.0)
    memo = Memo(tmp_path / "old.sqlite")  # as without an epsilon: migrated, but draws nothing new
    assert memo.lookup(b"\x01") == 2
    assert dict(memo._db.execute("SELECT key, noised FROM memo").fetchall()) == {b"\x01": 1}
    meta = dict(memo._db.execute("SELECT * FROM meta").fetchall())
    assert meta["format"] == "lucid-memo/3" and meta["epsilon"] == "unknown"
    with pytest.raises(LucidError, match="cannot be established"):
        memo.get_or_put([b"\x01", b"\x02"], np.array([0, 1]), charge=Charge(client="c", epsilon=1.0))
    memo.close()
    assert read_ledger(tmp_path / "old.sqlite") == []
    memo = Memo(tmp_path / "empty.sqlite")
    assert memo.get_or_put([b"\x02"], np.array([1]), noised=np.array([False]),
                           charge=Charge(client="c", epsilon=1.0)).tolist() == [1]
    assert memo.ledger_rows() == [("*", 1.0, 1, 0, 0), ("c", 1.0, 1, 0, 0)]
    assert memo.epsilon == 1.0
    memo.close()


def test_eviction_charges_a_fresh_draw_again(tmp_path):
    memo = Memo(tmp_path / "m.sqlite", max_size=2)
    charge = Charge(client="c", epsilon=1.0)
    memo.get_or_put([b"a", b"b"], np.array([0, 1]), charge=charge)
    memo.get_or_put([b"a"], np.array([2]), charge=charge)  # a repeat: free
    memo.get_or_put([b"c"], np.array([2]), charge=charge)  # evicts b (and who saw it)
    assert memo.lookup(b"b") is None
    assert memo._db.execute("SELECT COUNT(*) FROM seen WHERE key = ?", (b"b",)).fetchone()[0] == 0
    memo.get_or_put([b"b"], np.array([0]), charge=charge)  # drawn afresh: charged again
    assert memo.ledger_rows() == [("*", 1.0, 4, 4, 0), ("c", 1.0, 4, 4, 0)]


def _exact_binary_rr_delta(eps: float, k: int, eps_prime: float) -> float:
    """delta(eps') of k-fold binary randomized response with log-ratio eps (closed form)."""
    from scipy.stats import binom

    j = np.arange(k + 1)
    loss = eps * (k - 2 * j)
    pmf = binom.pmf(j, k, 1.0 / (1.0 + np.exp(eps)))
    return float(np.sum(pmf * np.clip(1.0 - np.exp(eps_prime - loss), 0.0, None)))


@pytest.mark.parametrize("eps,k", [(1.0, 1), (1.0, 100), (0.1, 1000), (0.3, 37)])
def test_optimal_composition_matches_the_closed_form(eps, k):
    from lucid.access import optimal_composition

    delta = 1e-6
    got = optimal_composition([(eps, k)], delta)
    assert got <= eps * k * (1 + 1e-9)
    assert _exact_binary_rr_delta(eps, k, got) <= delta * (1 + 1e-6)  # sound
    assert _exact_binary_rr_delta(eps, k, got - 0.01 * max(1.0, got) - 1e-9) > delta  # and tight
    if k >= 100:
        assert got < 0.95 * eps * k  # better than basic composition


def test_optimal_composition_of_several_epsilons():
    from lucid.access import optimal_composition

    both = optimal_composition([(0.5, 200), (0.2, 300)], 1e-6)
    assert max(optimal_composition([(0.5, 200)], 1e-6), optimal_composition([(0.2, 300)], 1e-6)) < both
    assert both < 0.5 * 200 + 0.2 * 300
    assert optimal_composition([], 1e-6) == 0.0 and optimal_composition([(0.0, 5), (1.0, 0)], 1e-6) == 0.0
    assert optimal_composition([(100.0, 3)], 1e-6) == 300.0  # beyond exp's range: basic
    with pytest.raises(LucidError, match="delta"):
        optimal_composition([(1.0, 1)], 0.0)


def test_budget_cli(run_dir, tmp_path, capsys):
    from lucid.cli import main

    def budget(*args):
        try:
            main(["budget", *args])
            code = 0
        except SystemExit as exc:
            code = exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = budget(str(run_dir))
    assert code == 2 and "memo.sqlite does not exist" in err and len(err.strip().splitlines()) == 1
    code, _, err = budget(str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in err
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 200)
    code, _, err = budget(str(run_dir), "--memo", str(tmp_path / "junk.sqlite"))
    assert code == 2 and "ledger" in err and len(err.strip().splitlines()) == 1
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=run_dir / "memo.sqlite",
                                       options=ClassifierOptions(seed=0))
    clf.predict(to_orig(np.random.default_rng(5).random((30, 2))), client="alice")
    expected = {t.client: t for t in clf.ledger()}
    clf.close()
    code, out, _ = budget(str(run_dir), "--delta", "1e-5")
    assert code == 0 and "alice" in out and "(all clients" in out and "δ=1e-05" in out
    code, out, _ = budget(str(run_dir), "--json")
    doc = json.loads(out)
    got = {c["client"]: c for c in doc["clients"]}
    assert got["alice"]["answers"] == expected["alice"].answers == 30
    assert got["alice"]["noised"] == expected["alice"].noised > 0
    assert got["alice"]["spent"] == pytest.approx(expected["alice"].spent)
    code, _, err = budget(str(run_dir), "--delta", "2")
    assert code == 2 and "delta" in err
    Memo(tmp_path / "other.sqlite", fingerprint="another-model").close()
    code, _, err = budget(str(run_dir), "--memo", str(tmp_path / "other.sqlite"))
    assert code == 2 and "different model" in err


def test_min_response_time_holds_answers_and_errors(run_dir):
    """min_response_ms: a lower bound on every call's duration, errors included (a sleep and a spin
    guarantee it; the benchmark measures the spread)."""
    import time

    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(min_response_ms=30))
    for x in ([[10.5, -4.8]], [[9.0, -4.8]]):
        t0 = time.perf_counter()
        try:
            clf.predict(x)
        except LucidError:
            pass
        assert time.perf_counter() - t0 >= 0.03
    for bad in (-1, float("nan"), "soon"):
        with pytest.raises(LucidError, match="minimum response time"):
            LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(min_response_ms=bad))
