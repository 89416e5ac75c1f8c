"""Data loading, label mapping, splitting, scaling and the --domain box."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lucid.data import load_table, prepare_dataset
from lucid.errors import LucidError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_unit_features_kept_and_tiny_negatives_clipped(tmp_path):
    X = np.array([[0.0, 0.5], [-1e-16, 1.0], [0.25, 0.0], [1.0, 0.75]], dtype=np.float32)
    np.savez(tmp_path / "d.npz", X=X, y=np.array([0, 1, 0, 1]))
    ds = prepare_dataset(str(tmp_path / "d.npz"), test_fraction=0)
    assert ds.scaler == {"type": "affine", "offset": [0.0, 0.0], "scale": [1.0, 1.0]}
    assert ds.domain == {"lower": [0.0, 0.0], "upper": [1.0, 1.0]}
    np.testing.assert_array_equal(ds.X_train, np.clip(X, 0, 1))
    assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int64


def test_other_features_min_max_scaled_with_stored_scaler(tmp_path):
    (tmp_path / "d.csv").write_text("t,p,label\n10,0.2,b\n30,0.4,a\n20,0.9,b\n50,0.1,a\n")
    ds = prepare_dataset(str(tmp_path / "d.csv"), test_fraction=0)
    assert ds.labels == ["a", "b"]
    assert ds.y_train.tolist() == [1, 0, 1, 0]
    assert ds.feature_names == ["t", "p"]
    off, scale = np.array(ds.scaler["offset"]), np.array(ds.scaler["scale"])
    raw = np.array([[10, 0.2], [30, 0.4], [20, 0.9], [50, 0.1]])
    np.testing.assert_allclose(ds.X_train, (raw - off) * scale, atol=1e-7)
    np.testing.assert_allclose(ds.X_train[:, 0], [0, 0.5, 0.25, 1], atol=1e-7)  # min-max scaled
    np.testing.assert_allclose(ds.X_train[:, 1], raw[:, 1], atol=1e-7)  # already in [0, 1]: kept


def test_label_column_by_name_and_integer_labels(tmp_path):
    (tmp_path / "d.csv").write_text("cls,x\n3,0.1\n7,0.2\n3,0.3\n")
    ds = prepare_dataset(str(tmp_path / "d.csv"), label="cls", test_fraction=0)
    assert ds.labels == [3, 7] and ds.y_train.tolist() == [0, 1, 0]
    assert ds.X_train[:, 0].tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_domain_file_overrides_scaling(tmp_path):
    (tmp_path / "d.csv").write_text("a,b,y\n1,5,0\n2,6,1\n3,7,0\n")
    (tmp_path / "box.json").write_text(json.dumps({"lower": [0, 0], "upper": [4, 10]}))
    ds = prepare_dataset(str(tmp_path / "d.csv"), test_fraction=0, domain=tmp_path / "box.json")
    assert ds.scaler["offset"] == [0.0, 0.0] and ds.scaler["scale"] == [0.25, 0.1]
    np.testing.assert_allclose(ds.X_train, [[0.25, 0.5], [0.5, 0.6], [0.75, 0.7]], atol=1e-7)
    (tmp_path / "small.json").write_text(json.dumps({"lower": [0, 0], "upper": [2, 10]}))
    with pytest.raises(LucidError, match="outside the --domain box"):
        prepare_dataset(str(tmp_path / "d.csv"), test_fraction=0, domain=tmp_path / "small.json")


def test_seeded_stratified_split():
    a = prepare_dataset("sklearn:iris", test_fraction=0.2, seed=1)
    b = prepare_dataset("sklearn:iris", test_fraction=0.2, seed=1)
    c = prepare_dataset("sklearn:iris", test_fraction=0.2, seed=2)
    assert len(a.y_train) == 120 and len(a.y_test) == 30
    assert np.bincount(a.y_test).tolist() == [10, 10, 10]  # stratified
    np.testing.assert_array_equal(a.X_test, b.X_test)
    assert not np.array_equal(a.X_test, c.X_test)
    none = prepare_dataset("sklearn:iris", test_fraction=0)
    assert len(none.y_train) == 150 and none.X_test.shape == (0, 4)


@pytest.mark.parametrize("name,d,c", [("breast_cancer", 30, 2), ("wine", 13, 3), ("digits", 64, 10), ("iris", 4, 3)])
def test_sklearn_sets(name, d, c):
    t = load_table(f"sklearn:{name}")
    assert t.X.shape[1] == d and len(np.unique(t.y)) == c


def test_separate_test_file_and_unknown_test_label(tmp_path):
    np.savez(tmp_path / "tr.npz", X=np.array([[0.1], [0.9], [0.5]]), y=np.array([0, 1, 1]))
    np.savez(tmp_path / "te.npz", X=np.array([[0.2], [0.8]]), y=np.array([1, 0]))
    ds = prepare_dataset(str(tmp_path / "tr.npz"), test_data=str(tmp_path / "te.npz"))
    assert len(ds.y_train) == 3 and ds.y_test.tolist() == [1, 0]
    np.savez(tmp_path / "te2.npz", X=np.array([[0.2]]), y=np.array([5]))
    with pytest.raises(LucidError, match="lack"):
        prepare_dataset(str(tmp_path / "tr.npz"), test_data=str(tmp_path / "te2.npz"))


def test_npz_with_pickled_objects_is_refused(tmp_path):
    np.savez(tmp_path / "obj.npz", X=np.array([{"a": 1}, None], dtype=object), y=np.array([0, 1]))
    with pytest.raises(LucidError, match="cannot read"):
        load_table(str(tmp_path / "obj.npz"))


@pytest.mark.skipif(not (SHARED / "crypto" / "train.npz").exists(), reason="../shared/data not present")
def test_shared_crypto_data_keeps_unit_domain():
    ds = prepare_dataset(str(SHARED / "crypto" / "train.npz"), test_data=str(SHARED / "crypto" / "test.npz"))
    assert ds.X_train.shape == (2800, 7) and ds.X_test.shape == (1200, 7)
    assert ds.scaler["scale"] == [1.0] * 7 and ds.scaler["offset"] == [0.0] * 7
    assert ds.X_train.min() >= 0 and ds.X_train.max() <= 1
