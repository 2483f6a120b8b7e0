import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import knn
from openalign.eval.features import Context
from openalign.eval.options import EvalOptions, KnnOptions


def test_a_split_is_its_own_knn_pair_with_each_class_dealt_alternately():
    from openalign.eval.features import EvalData

    labels = ["a", "b", "a", "c", "a", "b"]
    data = EvalData(torch.eye(6), [], torch.zeros(0, dtype=torch.long), labels)
    assert knn.split_by_class(data) == ([0, 4, 1], [2, 5], labels)  # class c (one image) is left out
    data.meta = [{"family": f} for f in ("x", "x", "y", "y", "z", "x")]
    assert knn.split_by_class(data)[:2] == ([0, 5, 2], [1, 3])  # the families are the classes
    assert knn.split_by_class(data, "family") == knn.split_by_class(data)
    with pytest.raises(ConfigError, match="knn.group=colour"):
        knn.split_by_class(data, "colour")
    # KNN on it: each test image's nearest training image (the identity features: none is nearer than another)
    out, _ = knn.knn(Context(None, None, EvalOptions(), data), KnnOptions())
    assert (out["n_train"], out["n_test"], out["n_classes"], out["pairs_from"]) == (3, 2, 2, "split")  # families x, y
