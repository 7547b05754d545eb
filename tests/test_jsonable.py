"""cbo.jsonable: results to JSON types."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from cbo.jsonable import json_number, jsonable


def test_numbers_arrays_and_non_finite_values():
    data = {
        1: np.float32(0.5),
        "a": [np.int64(3), np.array([1.0, math.inf]), (np.bool_(True), None)],
        "p": Path("x/y"),
        "nan": float("nan"),
        "obj": object,
    }
    out = jsonable(data)
    assert out["1"] == 0.5 and out["a"] == [3, [1.0, "inf"], [True, None]] and out["p"] == "x/y"
    assert out["nan"] == "nan" and out["obj"].startswith("<class")
    json.dumps(out)  # every value is a JSON type
    assert json_number(None) is None and json_number(-math.inf) == "-inf" and json_number(np.float64(2)) == 2.0
