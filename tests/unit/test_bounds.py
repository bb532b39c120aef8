"""calibrun.core.bounds: the checks every count and number a user gives goes through (config, calibtool, data
sources)."""

from __future__ import annotations

import numpy as np
import pytest

from calibrun.core.bounds import MAX_BATCHES, MAX_SEED, check_factor, check_positive_int, check_seed
from calibrun.core.errors import CalibrunError


@pytest.mark.parametrize("value", [0, 7, MAX_SEED, np.int64(5), np.uint32(MAX_SEED)])
def test_seed_takes_python_and_numpy_integers_in_range(value):
    assert check_seed(value) == int(value)
    assert type(check_seed(value)) is int


@pytest.mark.parametrize("value", [-1, MAX_SEED + 1, True, 1.0, "3", np.float32(2)])
def test_seed_refuses_the_rest_naming_the_bound(value):
    with pytest.raises(CalibrunError, match=r"SEED-ish must be an integer in 0\.\.4294967295"):
        check_seed(value, "SEED-ish")


def test_positive_int_names_its_maximum_and_shortens_huge_values():
    assert check_positive_int(np.int16(3), "batches", MAX_BATCHES) == 3
    with pytest.raises(CalibrunError, match="batches must be at most 100000, got 100001"):
        check_positive_int(MAX_BATCHES + 1, "batches", MAX_BATCHES)
    with pytest.raises(CalibrunError, match=r"rows must be an integer >= 1, got 0"):
        check_positive_int(0, "rows")
    with pytest.raises(CalibrunError) as info:
        check_positive_int(-(10**5000), "rows")
    assert len(str(info.value)) < 120  # 5000 digits are not repeated back
    assert "an integer of about 5001 digits" in str(info.value)


@pytest.mark.parametrize(("value", "message"), [("nan", "finite number > 0"), (0.0, "finite number > 0"),
                                                (1e31, "1e-30..1e+30"), (1e-31, "1e-30..1e+30"),
                                                ("wide", "a number > 0")])
def test_factor_refuses_what_float32_data_cannot_carry(value, message):
    with pytest.raises(CalibrunError, match=message.replace(".", r"\.").replace("+", r"\+")):
        check_factor(value)


def test_factor_takes_numbers_and_numeric_text():
    assert check_factor("0.2") == 0.2
    assert check_factor(np.float32(10)) == 10.0
