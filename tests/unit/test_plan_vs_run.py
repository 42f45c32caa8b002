"""The planner-against-reality benches' pure parts: bench/perf/engine_scaling.py's exponent fit and
bench/studies/plan_vs_run.py's --gen-scaling A[@TPS] variants, on hand-computed numbers."""

from __future__ import annotations

import argparse

import pytest

from bench.perf.engine_scaling import fit_exponent
from bench.studies.plan_vs_run import _variant
from stream_dapo.tools.plan import ENGINE_SCALING


def test_fit_exponent_recovers_a_power_law() -> None:
    # tps = 900 m^0.5 at m = 1, 4, 16: 900, 1800, 3600
    assert fit_exponent([1, 4, 16], [900.0, 1800.0, 3600.0]) == pytest.approx(0.5)
    # flat and proportional engines
    assert fit_exponent([1, 2, 8], [500.0, 500.0, 500.0]) == pytest.approx(0.0)
    assert fit_exponent([1, 2, 8], [100.0, 200.0, 800.0]) == pytest.approx(1.0)


def test_variant_takes_a_number_or_a_name_and_an_optional_rate() -> None:
    assert _variant("gpu") == (ENGINE_SCALING["gpu"], None)
    assert _variant("cpu@3392") == (ENGINE_SCALING["cpu"], 3392.0)
    assert _variant("0.25@1000.5") == (0.25, 1000.5)
    with pytest.raises(argparse.ArgumentTypeError, match="A@TPS"):
        _variant("tpu")
    with pytest.raises(argparse.ArgumentTypeError, match="A@TPS"):
        _variant("gpu@fast")
