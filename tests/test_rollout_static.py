"""Static batching (HF generate, TRT-LLM static micro-batches): each batch of max_num_seqs
requests, in dispatch order, runs its padded prefill then decodes until its longest response is
done; against the closed forms of the step model and against continuous batching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout import RolloutOptions, RolloutRequests, simulate_rollout
from rlperf.stages.rollout_step import StepModel

QWEN7 = load_model("Qwen2.5-7B")
H100 = make_cluster("H100", num_gpus=8)
# the same attention kernels for both batchings (a paged KV cache is otherwise read at
# decode_kv_hbm_efficiency): what the comparison below isolates is the scheduling
H100_SAME_KV = H100.model_copy(update={"profile": H100.profile.model_copy(
    update={"decode_kv_hbm_efficiency": H100.profile.decode_hbm_efficiency})})


def batch_s(step: StepModel, prompts: np.ndarray, responses: np.ndarray) -> float:
    """One static batch by hand: prefill of b x the longest prompt, then the longest response's
    remaining decode steps with all b rows over the padded context."""
    b, p, r = len(prompts), int(prompts.max()), int(responses.max())
    prefill = step.run(0, 0, b * p, step.prefill_s_per_token(b * p, b * p * (p + 1) / 2, b), b).time_s(1)
    return prefill + step.run(b, b * (p + 1), 0, 0.0).time_s(r - 1)


def static(max_num_seqs: int, replicas: int = 1, **kw: object) -> EngineLayout:
    return EngineLayout(tp=1, replicas=replicas, max_num_seqs=max_num_seqs, batching="static", **kw)


def test_a_batch_lasts_its_longest_member_at_its_batch_size() -> None:
    prompts, responses = np.array([100, 300, 200, 50]), np.array([40, 900, 10, 300])
    lay = static(4)
    res = simulate_rollout(QWEN7, H100, lay, RolloutRequests.build(prompts, responses))
    expected = batch_s(StepModel.build(QWEN7, H100, lay), prompts, responses)
    assert res.makespan_s == pytest.approx(expected, rel=1e-12)
    # every request is returned with its batch; it generated its own tokens only
    assert np.all(res.finish_time_s == res.makespan_s)
    assert res.num_decode_tokens == responses.sum() and res.num_prefill_tokens == 4 * 300
    assert res.num_steps == 900 and res.finished.all()


def test_batches_are_taken_in_dispatch_order_one_after_another() -> None:
    rng = np.random.default_rng(3)
    prompts, responses = rng.integers(10, 500, 10), rng.integers(1, 700, 10)
    lay = static(4)
    res = simulate_rollout(QWEN7, H100, lay, RolloutRequests.build(prompts, responses))
    step = StepModel.build(QWEN7, H100, lay)
    ends = np.cumsum([batch_s(step, prompts[k:k + 4], responses[k:k + 4]) for k in (0, 4, 8)])
    assert res.makespan_s == pytest.approx(ends[-1], rel=1e-12)
    np.testing.assert_allclose(res.finish_time_s, np.repeat(ends, [4, 4, 2]), rtol=1e-12)


def test_replicas_run_their_groups_in_parallel() -> None:
    # round robin by group: groups 0, 2 on replica 0, groups 1, 3 on replica 1
    prompts = np.array([64, 64, 128, 128, 32, 32, 256, 256])
    responses = np.array([5, 500, 70, 80, 900, 1, 30, 31])
    groups = np.repeat(np.arange(4), 2)
    lay = static(2, replicas=2)
    res = simulate_rollout(QWEN7, H100, lay, RolloutRequests.build(prompts, responses, groups))
    step = StepModel.build(QWEN7, H100, lay)
    rep0 = batch_s(step, prompts[0:2], responses[0:2]) + batch_s(step, prompts[4:6], responses[4:6])
    rep1 = batch_s(step, prompts[2:4], responses[2:4]) + batch_s(step, prompts[6:8], responses[6:8])
    np.testing.assert_allclose(res.replica_finish_s, [rep0, rep1], rtol=1e-12)
    assert list(res.replica_of) == [0, 0, 1, 1, 0, 0, 1, 1]


def test_a_late_request_waits_for_the_running_batch() -> None:
    prompts, responses = np.array([100, 100, 100]), np.array([200, 300, 50])
    lay = static(4)
    req = RolloutRequests.build(prompts, responses, arrival_s=[0.0, 0.0, 0.01])
    res = simulate_rollout(QWEN7, H100, lay, req)
    step = StepModel.build(QWEN7, H100, lay)
    first = batch_s(step, prompts[:2], responses[:2])
    assert res.finish_time_s[2] == pytest.approx(first + batch_s(step, prompts[2:], responses[2:]), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(1, 600), st.integers(1, 1500)), min_size=1, max_size=40),
    max_num_seqs=st.integers(1, 12),
    replicas=st.integers(1, 3),
    group=st.integers(1, 4),
)
def test_continuous_is_never_slower_than_static(
    data: list[tuple[int, int]], max_num_seqs: int, replicas: int, group: int
) -> None:
    """Same requests, same dispatch, same kernels: refilling free slots never loses to waiting for
    a batch's longest response (with room in the KV cache for every batch)."""
    prompts = np.array([p for p, _ in data])
    groups = np.arange(len(data)) // group
    prompts = prompts[groups * group]  # a group shares its prompt
    req = RolloutRequests.build(prompts, [r for _, r in data], groups)
    cont = EngineLayout(tp=1, replicas=replicas, max_num_seqs=max_num_seqs, prefix_sharing=False)
    stat = cont.model_copy(update={"batching": "static"})
    t_cont = simulate_rollout(QWEN7, H100_SAME_KV, cont, req).makespan_s
    t_stat = simulate_rollout(QWEN7, H100_SAME_KV, stat, req).makespan_s
    assert t_cont <= t_stat * (1 + 1e-9)


def test_a_batch_that_does_not_fit_the_kv_cache_is_rejected() -> None:
    req = RolloutRequests.build([1000] * 4, [3000] * 4)
    with pytest.raises(SpecError, match=r"engine\.max_num_seqs"):
        simulate_rollout(QWEN7, H100, static(4), req, kv_capacity=10_000)
    assert simulate_rollout(QWEN7, H100, static(2), req, kv_capacity=10_000).finished.all()


@pytest.mark.parametrize("opts", [RolloutOptions(time_limit_s=1.0), RolloutOptions(stop_after_num_finished=2)])
def test_static_batches_cannot_stop_early(opts: RolloutOptions) -> None:
    with pytest.raises(SpecError, match="static"):
        simulate_rollout(QWEN7, H100, static(4), RolloutRequests.build([10] * 4, [20] * 4), opts)


def test_partial_rollout_budget_and_resumed_requests() -> None:
    # a budget caps each request's new tokens; resumed requests re-prefill prompt + generated
    prompts, responses, done = np.array([50, 80]), np.array([400, 900]), np.array([0, 300])
    lay = static(2)
    req = RolloutRequests.build(prompts, responses, already_generated=done)
    res = simulate_rollout(QWEN7, H100, lay, req, RolloutOptions(token_budget_per_request=250))
    assert list(res.generated_tokens) == [250, 550] and not res.finished.any()
    step = StepModel.build(QWEN7, H100, lay)
    assert res.makespan_s == pytest.approx(batch_s(step, prompts + done, np.array([250, 250])), rel=1e-12)
