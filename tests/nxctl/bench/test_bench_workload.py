"""The workload: MIN:MAX parsing, seeded prompts and lengths, shared prefixes, tenants, Poisson arrivals."""

from __future__ import annotations

import math

import pytest

from engine.errors import InvalidRequestError
from engine.settings import EngineSettings
from engine.workload import LengthRange, WorkloadSpec, make_workload, parse_weights
from nxctl.bench.options import BenchOptions


def test_length_range_parses_and_refuses() -> None:
    assert LengthRange.parse("16:512", "--input-len") == LengthRange(16, 512)
    assert str(LengthRange(3, 3)) == "3:3"
    for bad in ("5", "a:b", "0:4", "8:4", "1:2:3", ""):
        with pytest.raises(InvalidRequestError, match="--input-len"):
            LengthRange.parse(bad, "--input-len")


def test_workload_is_seeded_and_within_ranges() -> None:
    spec = WorkloadSpec(num_requests=20, input_len=LengthRange(4, 9), output_len=LengthRange(2, 5), seed=3)
    a, b = make_workload(spec, 100, 64), make_workload(spec, 100, 64)
    assert a == b
    assert all(4 <= len(r.prompt_token_ids) <= 9 and 2 <= r.output_len <= 5 for r in a)
    assert all(0 <= t < 100 for r in a for t in r.prompt_token_ids)
    assert all(r.arrival_s == 0.0 for r in a) and [r.index for r in a] == list(range(20))
    assert make_workload(WorkloadSpec(num_requests=20, seed=4, input_len=spec.input_len), 100, 1024) != a


def test_shared_prefix_and_tenants() -> None:
    spec = WorkloadSpec(
        num_requests=200,
        input_len=LengthRange(2, 3),
        output_len=LengthRange(1, 1),
        shared_prefix=5,
        tenants=2,
        tenant_weights=(3.0, 1.0),
    )
    reqs = make_workload(spec, 1000, 64)
    assert len({tuple(r.prompt_token_ids[:5]) for r in reqs}) == 1
    assert all(7 <= len(r.prompt_token_ids) <= 8 for r in reqs)
    share = sum(r.tenant == "tenant-0" for r in reqs) / len(reqs)
    assert 0.6 < share < 0.9 and {r.tenant for r in reqs} == {"tenant-0", "tenant-1"}


def test_poisson_arrivals_have_the_asked_rate() -> None:
    spec = WorkloadSpec(
        num_requests=2000, input_len=LengthRange(1, 1), output_len=LengthRange(1, 1), rate=50.0
    )
    arrivals = [r.arrival_s for r in make_workload(spec, 10, 8)]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert 50.0 * 0.9 < (len(arrivals) - 1) / arrivals[-1] < 50.0 * 1.1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"num_requests": 0}, "--num-requests"),
        ({"rate": -1.0}, "--rate"),
        ({"rate": math.nan}, "--rate"),
        ({"tenants": 2, "tenant_weights": (1.0,)}, "--tenant-weights"),
        ({"tenants": 2, "tenant_weights": (1.0, 0.0)}, "--tenant-weights"),
        ({"shared_prefix": -1}, "--shared-prefix"),
    ],
)
def test_bad_specs_are_refused(kwargs: dict, needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        WorkloadSpec(**kwargs)


def test_too_long_for_the_context_and_bad_weights() -> None:
    with pytest.raises(InvalidRequestError, match="context"):
        make_workload(WorkloadSpec(), 100, 512)
    assert parse_weights("3,1") == (3.0, 1.0) and parse_weights(None) == ()
    with pytest.raises(InvalidRequestError):
        parse_weights("3,x")


def test_schedule_selection() -> None:
    assert BenchOptions().selected() == ("cb_invariant", "cb_fast", "static", "sequential", "single")
    assert BenchOptions(peers=("hf",)).selected()[-2:] == ("hf", "single")
    several = BenchOptions(peers=("llamacpp", "hf", "vllm")).selected()
    assert several[-5:] == ("llamacpp", "hf", "vllm_f32", "vllm_bf16", "single")
    assert BenchOptions(peers=("ct2",), schedules=("ct2_int8", "cb_invariant")).selected() == (
        "cb_invariant",
        "ct2_int8",
    )
    assert BenchOptions(peers=("hf", "ct2")).peer == "hf,ct2" and BenchOptions().peer is None
    prefix = BenchOptions(workload=WorkloadSpec(shared_prefix=8))
    assert "cb_nocache" in prefix.selected()
    both = BenchOptions(
        engine=EngineSettings(dtype="bfloat16"), compare_dtype="float32", schedules=("static", "cb_invariant")
    )
    assert both.selected() == ("cb_invariant", "cb_invariant_f32", "static")
    acts = BenchOptions(compare_activations="float", schedules=("cb_invariant", "single"))
    assert acts.selected() == ("cb_invariant", "cb_invariant_float_activations", "single")
    assert BenchOptions(url="http://x").selected() == ("url",)
    for bad in (
        {"schedules": ("nope",)},
        {"schedules": ("hf",)},
        {"peers": ("vllm-gpu",)},
        {"peers": ("hf", "hf")},
        {"schedules": ("vllm_f32",), "peers": ("hf",)},
        {"repeat": 0},
        {"engine": EngineSettings(dtype="float32"), "compare_dtype": "float32"},
        {"compare_activations": "mixed"},  # the default activations: nothing to compare
        {"compare_activations": "fp8"},
        {"compare_activations": "float", "compare_dtype": "bfloat16"},
        {"url": "localhost:1"},
    ):
        with pytest.raises(InvalidRequestError):
            BenchOptions(**bad)
