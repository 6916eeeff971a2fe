"""The reference runtime: one real GRPO / PPO step of a tiny model on the CPU."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlperf.errors import SpecError  # noqa: E402
from rlperf.runtime.arith import ArithVocab, make_prompt, score  # noqa: E402
from rlperf.runtime.batching import microbatch_indices, minibatch_indices  # noqa: E402
from rlperf.runtime.rollout import ForcedLength  # noqa: E402
from rlperf.runtime.step import RuntimeOptions, StepRunner  # noqa: E402
from rlperf.scenario import load_scenario_spec, resolve_workload  # noqa: E402
from rlperf.sim.trace import chrome_trace  # noqa: E402
from rlperf.specs.parallel import TrainLayout  # noqa: E402
from rlperf.stages.microbatch import microbatches_for  # noqa: E402


def tiny_spec(algorithm: str = "GRPO", **alg: Any) -> Any:
    return load_scenario_spec({
        "name": f"tiny-{algorithm.lower()}",
        "model": "tiny-qwen2",
        "cluster": {"gpu": "local", "num_nodes": 1, "gpus_per_node": 1},
        "workload": {
            "prompts_per_step": 2,
            "group_size": 4,
            "prompt_length": {"kind": "uniform", "min_tokens": 6, "max_tokens": 12},
            "response_length": {"kind": "lognormal", "median_tokens": 8, "sigma": 0.6, "cap_tokens": 12},
        },
        "algorithm": {"name": algorithm, "minibatches": 2, **alg},
        "plan": {
            "rollout": {"dtype": "fp32", "kv_dtype": "fp32", "max_num_seqs": 4, "prefix_sharing": False},
            "layouts": {"actor": {"zero_stage": 0, "recompute": "none", "param_dtype": "fp32", "micro_batch_size": 3}},
        },
    })


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


@pytest.fixture(scope="module")
def grpo() -> tuple[StepRunner, Any, dict[str, torch.Tensor]]:
    # a large learning rate so one step visibly moves the weights
    runner = StepRunner(tiny_spec(), RuntimeOptions(actor_lr=1e-2, device="cpu"))
    before = params(runner.actor)
    return runner, runner.run(), before


def test_grpo_runs_its_stage_graph_in_order(grpo: Any) -> None:
    _, res, _ = grpo
    # two mini-batches: the old-policy pass is needed; GRPO's k3 KL needs the reference
    assert [s.name for s in res.stages] == ["generate", "reward", "old_logprob", "ref_logprob", "advantage", "actor_update"]
    assert all(s.time_s > 0 for s in res.stages)
    assert res.step_time_s == pytest.approx(sum(s.time_s for s in res.stages), rel=0.05, abs=5e-3)
    assert res.optimizer_steps == 2


def test_responses_follow_the_workload_draw(grpo: Any) -> None:
    runner, res, _ = grpo
    sample = resolve_workload(runner.spec.workload).sample(0)
    assert res.response_tokens == sample.total_response_tokens
    assert res.prompt_tokens == sample.group_size * sample.total_prompt_tokens
    assert res.num_responses == sample.num_responses
    assert res.train_tokens <= res.padded_train_tokens


def test_loss_finite_and_weights_move(grpo: Any) -> None:
    runner, res, before = grpo
    assert math.isfinite(res.policy_loss) and math.isfinite(res.kl) and res.kl >= 0
    assert math.isfinite(res.grad_norm) and res.grad_norm > 0
    assert 0 <= res.reward_mean <= 1
    after = params(runner.actor)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert runner.ref is not None
    # the reference stays at the initial weights (the warm-up step changed nothing)
    ref = params(runner.ref)
    assert all(torch.equal(before[k], ref[k]) for k in before)


def test_trace_has_one_span_per_stage_and_details(grpo: Any) -> None:
    _, res, _ = grpo
    tr = chrome_trace(res.segments, "measured")
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"all", "all/detail"}
    top = [e for e in xs if e["name"] in {s.name for s in res.stages}]
    assert [e["name"] for e in top] == [s.name for s in res.stages]
    for a, b in itertools.pairwise(top):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # stages run one after the other
    cats = {e["cat"] for e in xs}
    assert {"generate", "old_logprob", "actor_update"} <= cats  # detail spans carry their stage


def test_same_seed_same_step() -> None:
    a = StepRunner(tiny_spec(), RuntimeOptions(device="cpu", warmup=False)).run()
    b = StepRunner(tiny_spec(), RuntimeOptions(device="cpu", warmup=False)).run()
    assert a.reward_mean == b.reward_mean
    assert a.policy_loss == pytest.approx(b.policy_loss, rel=1e-5, abs=1e-9)


def test_ppo_step_trains_actor_and_critic() -> None:
    runner = StepRunner(tiny_spec("PPO"), RuntimeOptions(actor_lr=1e-2, critic_lr=1e-2, device="cpu", warmup=False))
    assert runner.critic is not None
    critic_before = params(runner.critic)
    res = runner.run()
    assert [s.name for s in res.stages] == [
        "generate", "reward", "old_logprob", "ref_logprob", "values", "advantage", "critic_update", "actor_update"]
    assert math.isfinite(res.critic_loss) and res.critic_loss >= 0
    assert math.isnan(res.kl)  # PPO's KL is in the reward, not the loss
    assert res.optimizer_steps == 4  # 2 mini-batches x (critic + actor)
    after = params(runner.critic)
    assert any(not torch.equal(critic_before[k], after[k]) for k in after)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"algorithm": {"name": "DAPO"}}, "algorithm.name"),
        ({"cluster": {"gpu": "local", "num_nodes": 2}}, "cluster"),
        ({"plan": {"layouts": {"actor": {"dp": 2}}}}, "plan.layouts.actor.dp"),
        ({"algorithm": {"name": "GRPO", "reward": {"kind": "model"}}}, "algorithm.reward.kind"),
    ],
)
def test_unsupported_settings_are_one_line_errors(change: dict[str, Any], field: str) -> None:
    data = tiny_spec().model_dump()
    data.update(change)
    with pytest.raises(SpecError) as err:
        StepRunner(load_scenario_spec(data), RuntimeOptions(device="cpu", warmup=False))
    assert err.value.field == field


# ------------------------------------------------------------------ pieces
def test_forced_length_processor() -> None:
    proc = ForcedLength([1, 3, 5], prompt_width=2, cap=5, eos=1, device=torch.device("cpu"))
    scores = torch.zeros(3, 6)
    out = proc(torch.zeros(3, 2, dtype=torch.long), scores.clone())  # first new token
    assert out[0].argmax() == 1 and torch.isinf(out[0, 0])  # request 0 must end now
    assert torch.isinf(out[1, 1]) and out[1, 0] == 0  # request 1 may not end yet
    out = proc(torch.zeros(3, 6, dtype=torch.long), scores.clone())  # fifth new token
    assert out[2, 1] == 0 and out[2, 0] == 0  # request 2 is at the cap: truncated, not forced


def test_arith_prompt_and_verifier() -> None:
    vocab = ArithVocab.for_model(64, [0, 1], eos=1)
    rng = np.random.default_rng(0)
    prompt, answer = make_prompt(rng, 9, vocab)
    assert len(prompt) == 9 and prompt[-3] == vocab.plus and prompt[-1] == vocab.equals
    a, b = vocab.numbers.index(prompt[-4]), vocab.numbers.index(prompt[-2])
    assert answer == a + b
    filler = vocab.filler[0]
    assert score([filler, vocab.numbers[answer], 1], answer, vocab, 0.1) == 1.0
    assert score([vocab.numbers[(answer + 1) % len(vocab.numbers)]], answer, vocab, 0.1) == 0.1
    assert score([filler, 1], answer, vocab, 0.1) == 0.0
    with pytest.raises(SpecError):
        make_prompt(rng, 3, vocab)


@pytest.mark.parametrize("layout", [TrainLayout(micro_batch_size=3), TrainLayout(max_tokens_per_microbatch=40)])
def test_microbatches_match_the_cost_model(layout: TrainLayout) -> None:
    rng = np.random.default_rng(1)
    seq = rng.integers(5, 30, size=17)
    for mini in minibatch_indices(17, 3):
        mine = [np.sort(seq[rows]) for rows in microbatch_indices(seq, mini, layout)]
        model = [np.sort(mb) for mb in microbatches_for(seq[mini], layout).ranks[0]]
        assert [m.tolist() for m in mine] == [m.tolist() for m in model]
        assert sorted(np.concatenate(microbatch_indices(seq, mini, layout)).tolist()) == mini.tolist()


def test_padded_tokens_match_the_cost_model_without_packing(grpo: Any) -> None:
    """The runtime pads each micro-batch to its longest: what the cost model counts with
    packing=False (one forward pass over the whole batch)."""
    runner, res, _ = grpo
    sample = resolve_workload(runner.spec.workload).sample(0)
    lay = runner.spec.plan.layout_for("actor").model_copy(update={"packing": False})
    seq = sample.prompt_tokens[sample.group_ids] + sample.flat_response_tokens
    assert int(seq.sum()) == res.train_tokens
    assert int(microbatches_for(seq, lay).microbatch_tokens(padded=True).sum()) == res.padded_train_tokens
