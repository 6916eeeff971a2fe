"""Smoke checks of the spec layer that every later layer relies on."""

import pytest

from rlperf.errors import SpecError
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_train_layout
from tests.helpers.models import QWEN25_7B_CONFIG

QWEN25_7B = QWEN25_7B_CONFIG


def test_unknown_model_type_is_one_line_error() -> None:
    with pytest.raises(SpecError) as ei:
        ModelSpec.from_hf_config({**QWEN25_7B, "model_type": "gpt9"}, "x")
    assert "model_type" in str(ei.value) and "\n" not in str(ei.value)


def test_negative_field_names_the_field() -> None:
    with pytest.raises(SpecError) as ei:
        ModelSpec.from_hf_config({**QWEN25_7B, "hidden_size": -1}, "x")
    assert "hidden_size" in str(ei.value)


def test_layout_world_size_and_divisibility() -> None:
    m = ModelSpec.from_hf_config(QWEN25_7B, "q")
    lay = TrainLayout(dp=4, tp=2, pp=2)
    assert lay.world_size == 16
    check_train_layout(m, lay)
    with pytest.raises(SpecError, match="tp"):
        check_train_layout(m, TrainLayout(tp=3))
    assert EngineLayout(tp=2, replicas=4).num_gpus == 8


def test_model_copy_recomputes_derived_values() -> None:
    m = ModelSpec.from_hf_config(QWEN25_7B, "q")
    assert m.num_params > 0
    small = m.model_copy(update={"num_layers": 2})
    assert small.num_params < m.num_params
    assert small.num_params == ModelSpec.from_hf_config({**QWEN25_7B, "num_hidden_layers": 2}, "q").num_params
