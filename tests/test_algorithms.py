"""The algorithm registry: stage graphs follow algorithms.md §1."""

import pytest

from rlperf.algorithms import get_algorithm, list_algorithms, register_algorithm
from rlperf.errors import SpecError

EXPECTED = {"PPO", "GRPO", "Dr.GRPO", "DAPO", "RLOO", "REINFORCE++", "ReMax", "GSPO", "PRIME", "VAPO"}


def test_all_algorithms_registered() -> None:
    assert {a.name for a in list_algorithms()} >= EXPECTED


def test_duplicate_registration_rejected() -> None:
    with pytest.raises(SpecError, match="already registered"):
        register_algorithm(lambda: get_algorithm("GRPO"))


def test_unknown_algorithm_suggests() -> None:
    with pytest.raises(SpecError, match="GRPO"):
        get_algorithm("grpoo")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_stage_graph_is_a_dag_rooted_at_generation(name: str) -> None:
    algo = get_algorithm(name)
    for updates in (1, 4):
        stages = algo.active_stages(updates)
        names = [s.name for s in stages]
        assert names[0] == "generate"
        assert names[-1] == "actor_update"
        for i, s in enumerate(stages):
            assert all(d in names[:i] for d in s.deps)


def test_passes_match_the_summary_table() -> None:
    # PPO: 4 forward-only models + 2 trained; GRPO: no critic; ReMax: second generation;
    # PRIME: PRM trained online with a double forward; DAPO: no reference (no KL).
    ppo = [s.name for s in get_algorithm("PPO").active_stages(4)]
    assert {"values", "critic_update", "ref_logprob", "old_logprob"} <= set(ppo)
    grpo = [s.name for s in get_algorithm("GRPO").active_stages(4)]
    assert "values" not in grpo and "ref_logprob" in grpo
    assert "generate_greedy" in [s.name for s in get_algorithm("ReMax").active_stages(1)]
    prime = [s.name for s in get_algorithm("PRIME").active_stages(1)]
    assert {"prm_update", "prm_forward", "prm_ref_forward"} <= set(prime)
    assert get_algorithm("PRIME").oversample == 4.0
    dapo = get_algorithm("DAPO")
    assert "ref_logprob" not in [s.name for s in dapo.active_stages(16)]
    assert dapo.dynamic_sampling and dapo.clip_high == 0.28


def test_old_logprob_only_with_several_updates() -> None:
    grpo = get_algorithm("GRPO")
    assert "old_logprob" not in [s.name for s in grpo.active_stages(1)]
    assert "old_logprob" in [s.name for s in grpo.active_stages(2)]


def test_kl_in_the_reward_needs_old_logprobs_even_with_one_update() -> None:
    for name in ("REINFORCE++", "RLOO", "PPO"):
        assert "old_logprob" in [s.name for s in get_algorithm(name).active_stages(1)]
