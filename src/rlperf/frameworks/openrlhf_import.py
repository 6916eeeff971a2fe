"""OpenRLHF command line (``openrlhf.cli.train_ppo_ray``) -> rlperf ScenarioSpec.

How OpenRLHF places models (``train_ppo_ray.py``; frameworks_overview.md §1, OpenRLHF row):
actor, reference, critic and reward model are Ray actor groups of
``*_num_nodes x *_num_gpus_per_node`` GPUs each, and the vLLM engines
(``vllm_num_engines x vllm_tensor_parallel_size`` GPUs) are another group. Flags share GPUs:
``--colocate_actor_ref`` (actor + reference), ``--colocate_critic_reward`` (critic + reward
model), ``--colocate_all_models`` (everything, vLLM included: the hybrid engine; with
``--async_train`` only the DeepSpeed models). The reference exists iff ``init_kl_coef > 0``, the
critic iff the estimator is ``gae``, the reward model iff there is no ``--remote_rm_url``.

Mappings (flag -> rlperf field):

- ``rollout_batch_size`` -> prompts per step, ``n_samples_per_prompt`` -> group size,
  ``prompt_max_len`` / ``generate_max_len`` -> caps; ``train_batch_size`` counts *samples*, so
  mini-batches = ``rollout_batch_size x n_samples_per_prompt / train_batch_size``;
  ``max_epochs`` -> epochs.
- one DeepSpeed strategy for every model: ``zero_stage``, ``ds_tensor_parallel_size`` (AutoTP)
  -> tp, ``ring_attn_size`` -> ring cp, ``gradient_checkpointing`` -> full recompute,
  ``micro_train_batch_size``, ``use_dynamic_batch`` + ``train_max_tokens_per_gpu`` -> token
  budget, ``adam_offload`` -> CPU optimizer (ZeRO-Offload).
- ``async_train`` with ``async_queue_size q``: the sampler runs up to ``q`` batches ahead of the
  trainer, so a batch is at most ``q`` updates old: ``q = 1`` -> one-step off-policy, else
  async with staleness ``q``; with ``partial_rollout`` (generation paused at each weight sync,
  in-flight samples resumed with the new weights) -> streaming with ``q`` batches in flight.
- colocated: ``vllm_enable_sleep`` / ``deepspeed_enable_sleep`` -> offload between phases.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlperf.algorithms import get_algorithm
from rlperf.errors import SpecError
from rlperf.algorithms.spec import KL
from rlperf.frameworks.common import as_bool, as_float, as_int, build_spec, catalog_model, generic_workload, kl_setting
from rlperf.frameworks.openrlhf_args import (
    DOTTED,
    DOTTED_DEFAULTS,
    DOTTED_IGNORED_PREFIXES,
    ESTIMATORS,
    IGNORED,
    READ,
    UNSUPPORTED,
)
from rlperf.frameworks.report import ImportReport, KeyNote, Recorder, fmt_value
from rlperf.scenario import ScenarioSpec, check_positions

# Arity of the arguments that take several values (-1: up to the next flag); the rest take one.
NARGS = {
    "eps_clip_low_high": 2,
    "adam_betas": 2,
    "reward_clip_range": 2,
    "dynamic_filtering_reward_range": 2,
    "vllm_is_truncated_threshold": 2,
    "target_modules": -1,
}
ENTRY = "openrlhf.cli.train_ppo_ray"


# Scenario field -> the OpenRLHF option it is read from, so that a value the scenario refuses is
# reported under the option the user wrote (build_spec).
SOURCE_KEYS = {
    "cluster.num_nodes": "--actor_num_nodes",
    "cluster.gpus_per_node": "--actor_num_gpus_per_node",
    "workload.prompts_per_step": "--rollout_batch_size",
    "workload.group_size": "--n_samples_per_prompt",
    "workload.response_length": "--generate_max_len",
    "workload.prompt_length": "--prompt_max_len",
    "algorithm.epochs": "--max_epochs",
    "plan.rollout.gpu_memory_utilization": "--vllm_gpu_memory_utilization",
    "plan.rollout.tp": "--vllm_tensor_parallel_size",
    "plan.layouts.actor.micro_batch_size": "--micro_train_batch_size",
    "plan.layouts.actor.max_tokens_per_microbatch": "--train_max_tokens_per_gpu",
    "plan.layouts.actor.zero_stage": "--zero_stage",
}


def is_openrlhf_entry(token: str) -> bool:
    """Whether ``token`` runs OpenRLHF's PPO trainer (module name or path to its file; before
    v0.4 it was ``examples/train_ppo_ray.py``, and forks keep the name, e.g. ``train_ppo_ray_box.py``)."""
    module = token.removesuffix(".py").replace("/", ".")
    return module.endswith(ENTRY) or (token.endswith(".py") and module.rsplit(".", 1)[-1].startswith("train_ppo_ray"))


def split_args(args: str | Sequence[str]) -> list[str]:
    """The argument tokens after the launcher (``ray job submit ... -- python3 -m ...``)."""
    tokens = shlex.split(args.replace("\\\n", " "), comments=True) if isinstance(args, str) else list(args)
    for i, tok in enumerate(tokens):
        if tok.endswith((ENTRY, "train_ppo_ray.py")):
            return tokens[i + 1 :]
    if "--" in tokens:
        tokens = tokens[tokens.index("--") + 1 :]
    first = next((i for i, t in enumerate(tokens) if t.startswith("--")), len(tokens))
    return tokens[first:]


def _abbreviated(name: str) -> str | None:
    """The flag ``name`` abbreviates (train_ppo_ray's argparse accepts a unique prefix, e.g.
    ``--n_samples`` for ``--n_samples_per_prompt``), when it is no flag itself and exactly one
    flag rlperf knows starts with it."""
    known = (*READ, *IGNORED, *UNSUPPORTED, *NARGS, *DOTTED)
    if len(name) < 4 or name in known:
        return None
    matches = {k for k in known if k.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def parse_args(tokens: Sequence[str], spelled: dict[str, str] | None = None) -> dict[str, Any]:
    """``{name: value}`` from ``--name value`` / ``--name=value`` / ``--flag``; later ones win.

    train_ppo_ray takes no positional arguments, so a flag followed by another flag (or by
    nothing) is a switch, and a flag takes the values up to the next flag (at most its arity;
    a flag rlperf does not know takes them all). Dotted flags (``--train.batch_size``) are
    stored under their older names; ``spelled`` collects ``--old -> --dotted`` for reporting."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise SpecError("openrlhf", f"stray value {tok!r} (expected --flag)")
        name, eq, value = tok[2:].partition("=")
        full = _abbreviated(name)
        if full is not None:  # argparse's allow_abbrev: a unique prefix names the flag
            if spelled is not None:
                spelled[f"--{full}"] = f"--{name}"
            name = full
        if name in DOTTED:
            if spelled is not None:
                spelled[f"--{DOTTED[name]}"] = f"--{name}"
            name = DOTTED[name]
        i += 1
        if eq:
            out[name] = value
            continue
        known = name in READ or name in IGNORED or name in UNSUPPORTED or name in NARGS
        arity = NARGS.get(name, 1 if known else -1)
        values: list[str] = []
        while i < len(tokens) and not tokens[i].startswith("--") and (arity < 0 or len(values) < arity):
            values.append(tokens[i])
            i += 1
        single = arity == 1 or (not known and len(values) == 1)
        out[name] = True if not values else values[0] if single else values
    return out


def import_openrlhf(
    args: str | Sequence[str],
    extra: Sequence[str] = (),
    *,
    gpu: str = "H100",
    mean_response_tokens: float | None = None,
    model_config: str | None = None,
) -> tuple[ScenarioSpec, ImportReport]:
    """A scenario from an OpenRLHF ``train_ppo_ray`` command line (string or tokens)."""
    spelled: dict[str, str] = {}
    values = parse_args(split_args(args) + list(extra), spelled)
    rec = Recorder("OpenRLHF", f"{len(values)} arguments", model_config)
    defaults = {**READ, **DOTTED_DEFAULTS} if spelled else READ
    try:
        spec, report = _Importer(values, rec, gpu, mean_response_tokens, defaults).run()
    except SpecError as err:  # under the flag as the command line spelled it (--train.micro_batch_size)
        field = " + ".join(spelled.get(part, part) for part in err.field.split(" + "))
        raise SpecError(field, err.problem, err.allowed, err.source) from None
    return spec, respell(report, spelled)


def respell(report: ImportReport, spelled: Mapping[str, str]) -> ImportReport:
    """The report with each key as the command line spelled it (dotted or not)."""
    if not spelled:
        return report

    def notes(items: tuple[KeyNote, ...]) -> tuple[KeyNote, ...]:
        return tuple(KeyNote(spelled.get(n.key, n.key), n.value, n.note) for n in items)

    return replace(
        report,
        mapped=notes(report.mapped),
        ignored=notes(report.ignored),
        unsupported=notes(report.unsupported),
        unknown=notes(report.unknown),
        defaulted=notes(report.defaulted),
    )


class _Importer:
    def __init__(self, values: dict[str, Any], rec: Recorder, gpu: str, mean: float | None, defaults: dict[str, Any] = READ) -> None:
        self.defaults = defaults
        self.values = values
        self.rec = rec
        self.gpu = gpu
        self.mean = mean
        self.has_ref = False
        self.model = ""  # the actor's catalog model, read first by run()

    def raw(self, name: str, note: str = "") -> Any:
        default = self.defaults[name]
        if name in self.values:
            value = self.values[name]
            if note:
                self.rec.map(f"--{name}", value, note)
            return value
        shown = False if default == "flag" else default
        if shown is not None:
            self.rec.default(f"--{name}", shown, note)
        return shown

    def int_(self, name: str, note: str = "", lo: int = 1) -> int:
        return as_int(f"--{name}", self.raw(name, note), lo)

    def flag(self, name: str, note: str = "") -> bool:
        return as_bool(f"--{name}", self.raw(name, note))

    # ------------------------------------------------------------------ top level
    def run(self) -> tuple[ScenarioSpec, ImportReport]:
        if "pretrain" not in self.values:
            raise SpecError("--pretrain", "missing: the importer needs the actor's model")
        model = self.model = catalog_model("--pretrain", self.values["pretrain"], self.rec, actor=True)
        name = self._algorithm_name()
        algorithm = self._algorithm(name, model)
        workload, minibatches = self._batches()
        algorithm["minibatches"] = minibatches
        cluster, placement, pool_gpus, colocated = self._placement(name, algorithm["reward"]["kind"] == "model")
        layouts = self._layouts(pool_gpus)
        plan = {
            "placement": placement,
            "rollout": self._engine(pool_gpus["generate"]),
            "layouts": layouts,
            "mode": self._mode(),
            "offload_between_phases": self._offload(colocated),
        }
        run_name = self.values.get("wandb_run_name")
        if run_name is not None:
            self.rec.map("--wandb_run_name", run_name, "scenario name")
        parts = {"cluster": cluster, "workload": workload, "algorithm": algorithm, "plan": plan}
        spec = build_spec("OpenRLHF", None if run_name is None else str(run_name), model, parts, SOURCE_KEYS)
        caps = "--max_len" if self._whole_context() else "--prompt_max_len + --generate_max_len"
        check_positions(spec, caps, "the max_position_embeddings of a --model-config")
        return spec, self.rec.freeze(*self._rest())

    def _rest(self) -> tuple[list[KeyNote], list[KeyNote]]:
        ignored: list[KeyNote] = []
        unknown: list[KeyNote] = []
        for name, value in sorted(self.values.items()):
            key, shown = f"--{name}", fmt_value(value)
            if name in READ:
                if key not in self.rec.mapped and key not in self.rec.unsupported:
                    ignored.append(KeyNote(key, shown, "has no effect in this configuration"))
            elif name in IGNORED:
                ignored.append(KeyNote(key, shown, IGNORED[name]))
            elif any(name.startswith(p) for p in DOTTED_IGNORED_PREFIXES):
                ignored.append(KeyNote(key, shown, next(n for p, n in DOTTED_IGNORED_PREFIXES.items() if name.startswith(p))))
            elif name in UNSUPPORTED:
                note, harmless = UNSUPPORTED[name]
                if value in harmless or shown in {fmt_value(h) for h in harmless}:
                    ignored.append(KeyNote(key, shown, "at a value rlperf models as is"))
                else:
                    self.rec.unsupported_key(key, value, note)
            else:
                unknown.append(KeyNote(key, shown))
        return ignored, unknown

    # ------------------------------------------------------------------ algorithm
    def _algorithm_name(self) -> str:
        est = str(self.raw("advantage_estimator"))
        if est not in ESTIMATORS:
            raise SpecError("--advantage_estimator", f"unknown {est!r}", ", ".join(ESTIMATORS))
        name = {"gae": "PPO", "rloo": "RLOO", "dr_grpo": "Dr.GRPO", "group_norm": "GRPO"}.get(est, "REINFORCE++")
        if est == "reinforce_baseline":
            self.rec.unsupported_key("--advantage_estimator", est, "REINFORCE++-baseline is costed as REINFORCE++ (same stages)")
        if name == "GRPO" and self.flag("dynamic_filtering"):
            self.rec.map("--dynamic_filtering", True, "dynamic sampling: DAPO")
            name = "DAPO"
        elif name == "GRPO" and str(self.raw("policy_loss_type")) == "gspo":
            self.rec.map("--policy_loss_type", "gspo", "sequence-level ratio: GSPO")
            name = "GSPO"
        self.rec.map("--advantage_estimator", est, f"algorithm {name}")
        return name

    def _algorithm(self, name: str, model: str) -> dict[str, Any]:
        coef = as_float("--init_kl_coef", self.raw("init_kl_coef"))
        # OpenRLHF builds the reference model iff init_kl_coef > 0; --use_kl_loss moves the KL
        # from the reward into the loss (k3 as rlperf costs it; the reference pass is the same).
        has_ref = self.has_ref = coef > 0
        in_loss = self.flag("use_kl_loss", "KL in the loss" if "use_kl_loss" in self.values else "")
        kl: KL = "none" if not has_ref else "k3_loss" if in_loss else "k1_reward"
        self.rec.map("--init_kl_coef", coef, f"reference model (algorithm.kl {kl})" if has_ref else "no reference model")
        if has_ref and not any(s.condition == "kl" for s in get_algorithm(name).stages):
            self.rec.unsupported_key("--init_kl_coef", coef, f"rlperf's {name} has no reference pass; costed without it")
            self.has_ref, kl = False, "none"
        out: dict[str, Any] = {"name": name, "epochs": self.int_("max_epochs", "epochs"), "reward": self._reward()}
        if kl_setting(name, kl) is not None:
            out["kl"] = kl
        if name == "PPO":
            critic_src = self.values.get("critic_pretrain")
            if critic_src is None and out["reward"]["kind"] == "model":
                critic_src = str(self.values["reward_pretrain"]).split(",")[0]
                self.rec.assume("critic initialised from the reward model (OpenRLHF's default)")
            if critic_src is not None:
                critic = catalog_model("--critic_pretrain" if "critic_pretrain" in self.values else "--reward_pretrain", critic_src, self.rec)
                out["critic_model"] = critic if critic != model else None
        return out

    def _reward(self) -> dict[str, Any]:
        if self.values.get("remote_rm_url"):
            self.rec.map("--remote_rm_url", self.values["remote_rm_url"], "reward: rule (remote verifier)")
            self.rec.assume("the remote reward is a CPU verifier with rlperf's default cost per sample")
            return {"kind": "rule"}
        src = self.values.get("reward_pretrain")
        if src is None and self.values.get("agent_func_path"):
            self.rec.assume("the agent function returns the reward: costed as a CPU verifier (rlperf's default cost per sample)")
            return {"kind": "rule"}
        if src is None:
            raise SpecError("--reward_pretrain", "missing: give a reward model or --remote_rm_url")
        first = str(src).split(",")[0]
        if "," in str(src):
            self.rec.unsupported_key("--reward_pretrain", src, "several reward models: only the first is costed")
        return {"kind": "model", "model": catalog_model("--reward_pretrain", first, self.rec)}

    def _batches(self) -> tuple[dict[str, Any], int]:
        prompts = self.int_("rollout_batch_size", "prompts per step")
        group = self.int_("n_samples_per_prompt", "group size")
        train = self.int_("train_batch_size", "samples per mini-batch")
        if (prompts * group) % train != 0:
            raise SpecError("--train_batch_size", f"{train} does not divide rollout_batch_size x n_samples_per_prompt ({prompts * group})")
        caps = self._caps()
        workload = generic_workload(prompts, group, caps[0], caps[1], self.mean, self.rec, SOURCE_KEYS)
        if "max_len" in self.values and "prompt_max_len" in self.values:
            # the deprecated --max_len beside both caps: vLLM's max_model_len, a joint cap
            total = as_int("--max_len", self.raw("max_len"))
            if total <= caps[0]:
                raise SpecError("--max_len", f"{total:,} leaves no room for a response after --prompt_max_len ({caps[0]:,})",
                                f"> {caps[0]:,}")
            if total < caps[0] + caps[1]:
                workload["max_total_tokens"] = total
            self.rec.map("--max_len", total, "workload.max_total_tokens (vLLM's max_model_len)" if total < caps[0] + caps[1]
                         else "no joint cap: prompt cap + response cap fit in it")
        return workload, prompts * group // train

    def _whole_context(self) -> bool:
        """Whether ``--max_len`` is the whole context (no ``--prompt_max_len`` beside it)."""
        return self.defaults["max_len"] is not None or ("max_len" in self.values and "prompt_max_len" not in self.values)

    def _caps(self) -> tuple[int, int]:
        """Prompt and response caps. Without ``--prompt_max_len``, a ``--max_len`` (the dotted
        ``--data.max_len``) is the whole context: the prompt cap is what the response cap
        (``--generate_max_len`` / ``--rollout.max_new_tokens``) leaves of it."""
        if self._whole_context():
            total = as_int("--max_len", self.raw("max_len"))
            if "generate_max_len" in self.values:
                response = self.int_("generate_max_len", "response cap")
            else:
                response = total - min(int(READ["prompt_max_len"]), total // 2)
                self.rec.assume(f"response cap {response} = max_len {total} - prompt cap (no max_new_tokens: OpenRLHF generates up to max_len - prompt)")
            if not 0 < response < total:
                raise SpecError("--max_len", f"{total} leaves no room for prompts beside a response cap of {response}")
            self.rec.map("--max_len", total, f"prompt cap {total - response} + response cap {response}")
            return total - response, response
        return self.int_("prompt_max_len", "prompt cap"), self.int_("generate_max_len", "response cap")

    # ------------------------------------------------------------------ placement
    def _placement(self, name: str, reward_model: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, int], bool]:
        """Cluster, placement, the GPUs of the pool of each role, and whether all is colocated."""
        self.rec.assume(f"GPU type {self.gpu} (OpenRLHF arguments do not name it)")
        nodes = self.int_("actor_num_nodes", "actor nodes")
        gpn = self.int_("actor_num_gpus_per_node", "actor GPUs per node")
        actor = nodes * gpn
        engines, vtp = self._engines()
        all_models = self.flag("colocate_all_models", "colocate all models")
        is_async = self.flag("async_train")
        if engines == 0:
            self.rec.unsupported_key("--vllm_num_engines", self.values.get("vllm_num_engines"), "generation without vLLM is costed as a vLLM-like engine on the actor's GPUs")
        if (all_models and not is_async) or engines == 0:
            if engines and engines * vtp != actor:
                raise SpecError("--vllm_num_engines", f"{engines} x tp {vtp} != actor GPUs {actor} with --colocate_all_models")
            for role in ("ref", "critic", "reward"):
                for part in ("num_nodes", "num_gpus_per_node"):
                    if f"{role}_{part}" in self.values:
                        self.rec.map(f"--{role}_{part}", self.values[f"{role}_{part}"], "shares the colocated pool")
            cluster = {"gpu": self.gpu, "num_nodes": nodes, "gpus_per_node": gpn}
            return cluster, {"kind": "colocated"}, dict.fromkeys(("generate", "actor", "critic", "ref", "reward_model"), actor), True
        pools: dict[str, int] = {"rollout": engines * vtp, "actor": actor}
        assign = {"generate": "rollout", "actor": "actor"}
        if self.has_ref:  # OpenRLHF builds a reference group iff init_kl_coef > 0
            if all_models or self.flag("colocate_actor_ref", "reference shares the actor's GPUs"):
                assign["ref"] = "actor"
            else:
                pools["ref"] = self.int_("ref_num_nodes", "reference nodes") * self.int_("ref_num_gpus_per_node", "reference GPUs per node")
                assign["ref"] = "ref"
        if name == "PPO":
            if all_models:
                assign["critic"] = "actor"
            else:
                pools["critic"] = self.int_("critic_num_nodes", "critic nodes") * self.int_("critic_num_gpus_per_node", "critic GPUs per node")
                assign["critic"] = "critic"
        if reward_model:
            if all_models:
                assign["reward_model"] = "actor"
            elif name == "PPO" and self.flag("colocate_critic_reward", "reward model shares the critic's GPUs"):
                assign["reward_model"] = "critic"
            else:
                pools["reward"] = self.int_("reward_num_nodes", "reward nodes") * self.int_("reward_num_gpus_per_node", "reward GPUs per node")
                assign["reward_model"] = "reward"
        return self._cluster(pools, assign, gpn)

    def _cluster(self, pools: dict[str, int], assign: dict[str, str], gpn: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, int], bool]:
        """Separate groups packed on nodes of the accelerator's size: ``*_num_gpus_per_node`` is
        how many GPUs a group takes on each node (Ray packs the groups' bundles onto the
        machines), not how many a machine has."""
        from rlperf.specs.hardware_catalog import load_accelerator

        node = load_accelerator(self.gpu).gpus_per_node
        gpn = max(node, gpn)
        total = sum(pools.values())
        sizes = {key: pools[pool] for key, pool in assign.items()}
        nodes, per_node = (1, total) if total <= gpn else (math.ceil(total / gpn), gpn)
        if nodes * per_node != total:
            self.rec.assume(f"{nodes * per_node - total} GPUs of the {nodes} nodes are idle")
        cluster = {"gpu": self.gpu, "num_nodes": nodes, "gpus_per_node": per_node}
        if set(pools) == {"rollout", "actor"} and nodes * per_node == total:
            placement: dict[str, Any] = {"kind": "disaggregated", "rollout_gpus": pools["rollout"]}
        else:
            placement = {"kind": "hybrid", "pools": [{"name": n, "num_gpus": g} for n, g in pools.items()], "assign": assign}
        return cluster, placement, sizes, False

    def _engines(self) -> tuple[int, int]:
        raw = self.values.get("vllm_num_engines")
        engines = 0 if raw is None else as_int("--vllm_num_engines", raw, lo=0)
        if engines:
            self.rec.map("--vllm_num_engines", engines, "engine replicas")
        vtp = self.int_("vllm_tensor_parallel_size", "engine tp")
        return engines, vtp

    # ------------------------------------------------------------------ layouts, engine, mode
    def _layouts(self, pool_gpus: dict[str, int]) -> dict[str, Any]:
        tp = self.int_("ds_tensor_parallel_size", "tp (DeepSpeed AutoTP)")
        cp = self.int_("ring_attn_size", "cp (ring attention)")
        dyn = self.flag("use_dynamic_batch", "dynamic batching")
        # OpenRLHF's budgets are per GPU of a ring x tp group: a micro-batch holds
        # max_tokens_per_gpu x ring_attn_size x ds_tensor_parallel_size tokens
        # (seqlen_balancing.get_minimum_num_micro_batch_size), every tp rank computing all of
        # them; rlperf's budget is per device of the cp group (x cp): x tp here
        per_tp = f" (x ds_tensor_parallel_size {tp}: every tp rank holds the group's micro-batch)" if tp > 1 else ""
        base: dict[str, Any] = {
            "tp": tp,
            "cp": cp,
            "cp_kind": "ring",
            "sequence_parallel": False,
            "zero_stage": self.int_("zero_stage", "ZeRO stage", lo=0),
            "recompute": "full" if self.flag("gradient_checkpointing", "recompute") else "none",
            "micro_batch_size": self.int_("micro_train_batch_size", "micro_batch_size"),
            "max_tokens_per_microbatch": tp * self.int_("train_max_tokens_per_gpu", "max_tokens_per_microbatch" + per_tp) if dyn else None,
            "offload_optimizer": self.flag("adam_offload", "CPU optimizer"),
            # OpenRLHF trains with DeepSpeed, whose ZeRO-3 coordinator (fetch_sub_module) gathers
            # each submodule's parameters from its own hook: one all-gather per linear projection.
            "gather_unit": "module",
            # make_experience's forward passes (reference, old log-probs, values, reward model):
            # --micro_rollout_batch_size, or --rollout_max_tokens_per_gpu with dynamic batching
            "forward_micro_batch_size": self._forward("micro_rollout_batch_size", not dyn),
            "forward_max_tokens_per_microbatch": self._forward("rollout_max_tokens_per_gpu", dyn, tp),
            # Without --packing_samples OpenRLHF pads each micro-batch to its longest sequence.
            "packing": "packing_samples" in self.values,
        }
        if "packing_samples" in self.values:
            self.rec.map("--packing_samples", self.values["packing_samples"], "packed sequences (no padding tokens)")
        else:
            self.rec.assume("no --packing_samples: micro-batches padded to their longest sequence")
        if "bf16" in self.values:
            self.rec.map("--bf16", True, "bf16 compute")
        layouts: dict[str, Any] = {}
        lora = self._lora()
        for role in ("actor", "critic", "ref", "reward_model"):
            gpus = pool_gpus.get(role)
            # a frozen model on the actor's pool keeps its own layout when the actor has adapters
            frozen = role in ("ref", "reward_model")
            if gpus is None or (role != "actor" and gpus == pool_gpus["actor"] and not (lora and frozen)):
                continue
            if gpus % (tp * cp) != 0:
                flag = "--ring_attn_size" if gpus % cp else "--ds_tensor_parallel_size"  # the one that does not fit
                raise SpecError(flag, f"tp·cp = {tp * cp} does not divide the {gpus} GPUs of the {role}")
            layouts[role] = {**base, "dp": gpus // (tp * cp), "lora_rank": 0 if frozen else lora}
        return layouts

    def _lora(self) -> int:
        """``--lora_rank`` (``--ds.lora.rank``): PEFT adapters on the actor and the critic
        (ppo_actor / ppo_critic pass it to their model), the reference and reward model frozen
        and whole; MoE and MLA models keep full fine-tuning and list the flag (rlperf.cost.lora)."""
        from rlperf.catalog import load_model
        from rlperf.cost.lora import adapter_params_per_layer

        rank = self.int_("lora_rank", "", lo=0)
        if rank:
            try:
                adapter_params_per_layer(load_model(self.model), rank)
            except SpecError as err:
                self.rec.unsupported_key("--lora_rank", rank, f"{err.problem}: costed as full fine-tuning")
                return 0
        self.rec.map("--lora_rank", rank, "actor and critic LoRA rank (frozen base weights)" if rank else "full fine-tuning")
        return rank

    def _forward(self, name: str, used: bool, tokens_per_gpu_times: int = 1) -> int | None:
        """A forward-pass micro-batch setting where the command line gives it (None: training's);
        a token budget per GPU is multiplied by the tp degree (as the training budget)."""
        if name not in self.values or self.values[name] is None:
            return None
        if not used:
            self.rec.map(f"--{name}", self.values[name], "unused (the other batching mode is on)")
            return None
        field = name.replace("micro_rollout_batch_size", "forward_micro_batch_size").replace("rollout_max_tokens_per_gpu", "forward_max_tokens_per_microbatch")
        if name != "rollout_max_tokens_per_gpu":
            return self.int_(name, f"forward passes: {field}")
        times = tokens_per_gpu_times
        return times * self.int_(name, f"forward passes: {field}" + (f" (x ds_tensor_parallel_size {times})" if times > 1 else ""))

    def _engine(self, gpus: int) -> dict[str, Any]:
        engines, vtp = self._engines()
        self.rec.assume("engine max_num_seqs / max_num_batched_tokens: rlperf's defaults (OpenRLHF leaves vLLM's)")
        return {
            "tp": vtp,
            "replicas": engines or gpus // vtp,
            "gpu_memory_utilization": as_float("--vllm_gpu_memory_utilization", self.raw("vllm_gpu_memory_utilization", "engine memory share"), 0.01, 1.0),
            "prefix_sharing": self.flag("enable_prefix_caching", "prefix_sharing"),
            # --enforce_eager: vLLM without CUDA graphs (vllm_engine.LLMRayActor's enforce_eager)
            "cuda_graphs": not self.flag("enforce_eager", "engine CUDA graphs off when set"),
        }

    def _mode(self) -> dict[str, Any]:
        if not self.flag("async_train", "asynchronous trainer"):
            self.flag("partial_rollout", "synchronous: nothing runs ahead to interrupt")
            return {"kind": "sync"}
        queue = self.int_("async_queue_size", "staleness bound")
        if self.flag("partial_rollout", "streaming: in-flight requests paused at each weight sync, resumed after it"):
            # The sampler keeps q batches ahead and interrupts them at a sync: streaming with
            # q batches in flight.
            return {"kind": "streaming", "staleness_threshold": float(queue)}
        return {"kind": "one_step_off"} if queue == 1 else {"kind": "async", "staleness": queue}

    def _offload(self, colocated: bool) -> bool:
        vllm = self.flag("vllm_enable_sleep", "offload between phases" if colocated else "")
        ds = self.flag("deepspeed_enable_sleep", "offload between phases" if colocated else "")
        if not colocated:
            return False
        if vllm != ds:
            self.rec.assume("only one of vllm/deepspeed sleep is on; rlperf's offload_between_phases covers both")
        return vllm or ds
