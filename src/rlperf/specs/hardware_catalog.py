"""The shipped accelerator catalog and hardware profiles, looked up by name.

``data/hardware.yaml`` holds peak capabilities (facts with sources), ``data/profiles.yaml`` the
achieved efficiencies per accelerator (each value with its derivation and source). A profile
file given by the user overrides the shipped profile field by field; the name ``calibrated``
stands for ``data/calibrated_profiles.yaml``, the generic parameters that ``rlperf validate
--calibrate`` fitted on the validation cases' calibration split (docs/validation.md).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rlperf.errors import SpecError, parse, unknown_name
from rlperf.specs.hardware import Accelerator, Cluster, HardwareProfile

PROFILE_FIELDS = frozenset(HardwareProfile.model_fields) - {"accelerator", "source", "provenance"}


def normalize(name: str) -> str:
    """Catalog key of a user-typed name: case-insensitive, '-' and ' ' read as '_'."""
    return name.strip().lower().replace("-", "_").replace(" ", "_")


# libyaml's safe loader where PyYAML has it (the same documents, about 10x faster than the pure
# Python reader on these ~120 KB of shipped data: ~0.15 CPU-s of every command that reads a
# profile); the pure Python one otherwise. Every reader of rlperf's shipped YAML uses it.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_data(filename: str) -> Any:
    text = resources.files("rlperf").joinpath("data").joinpath(filename).read_text(encoding="utf-8")
    return yaml.load(text, Loader=SAFE_LOADER)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Accelerator]:
    records = _read_data("hardware.yaml")["accelerators"]
    out: dict[str, Accelerator] = {}
    for rec in records:
        acc = parse(Accelerator, rec, where=f"hardware.yaml[{rec.get('id', '?')}]")
        assert acc.id not in out, f"duplicate accelerator id {acc.id}"
        out[acc.id] = acc
    return out


@lru_cache(maxsize=1)
def _aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for acc in _catalog().values():
        for key in (acc.id, *acc.aliases):
            k = normalize(key)
            assert table.get(k, acc.id) == acc.id, f"alias {k} names two accelerators"
            table[k] = acc.id
    return table


def list_accelerators() -> list[str]:
    """Ids of all shipped accelerators, in catalog order."""
    return list(_catalog())


def load_accelerator(name: str) -> Accelerator:
    """An accelerator by id or alias ("H100" -> h100_sxm, "A100" -> a100_80gb_sxm)."""
    aid = _aliases().get(normalize(name))
    if aid is None:
        raise unknown_name("gpu", name, _aliases())
    return _catalog()[aid]


def _split_entries(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Profile fields may be plain values or {value, rule, from, url}; split off provenance."""
    values: dict[str, Any] = {}
    prov: dict[str, str] = {}
    for key, entry in raw.items():
        if isinstance(entry, dict) and "value" in entry:
            values[key] = entry["value"]
            prov[key] = "; ".join(str(entry[k]) for k in ("rule", "from", "url") if entry.get(k))
        elif key == "matmul_efficiency_by_dtype" and isinstance(entry, dict):
            sub: dict[str, Any] = {}
            for dt, e in entry.items():
                if isinstance(e, dict) and "value" in e:
                    sub[dt] = e["value"]
                    prov[f"{key}.{dt}"] = "; ".join(str(e[k]) for k in ("rule", "from", "url") if e.get(k))
                else:
                    sub[dt] = e
            values[key] = sub
        else:
            values[key] = entry
    return values, prov


@lru_cache(maxsize=1)
def _shipped_profiles() -> dict[str, HardwareProfile]:
    data = _read_data("profiles.yaml")
    _, generic_prov = _split_entries(data["generic"])
    out: dict[str, HardwareProfile] = {}
    for aid, raw in data["profiles"].items():
        values, prov = _split_entries(raw)
        # A field the profile leaves out takes the generic value (HardwareProfile's default):
        # it keeps the generic block's provenance, so a breakdown can still name the source.
        for key, where in generic_prov.items():
            if key not in values:
                prov[key] = f"generic: {where}"
        out[aid] = parse(
            HardwareProfile,
            {"accelerator": aid, **values, "provenance": prov, "source": "rlperf/data/profiles.yaml"},
            where=f"profiles.yaml[{aid}]",
        )
    return out


def generic_profile_values() -> dict[str, Any]:
    """The ``generic:`` fallback block of profiles.yaml (HardwareProfile's defaults mirror it)."""
    values, _ = _split_entries(_read_data("profiles.yaml")["generic"])
    return values


CALIBRATED_PROFILE = "calibrated"
"""The profile-file name of the shipped calibrated profiles (``--hardware-profile calibrated``)."""


def profile_file(path: str | Path) -> Path:
    """The file a profile path names: the shipped calibrated profiles for ``calibrated``, the
    path itself otherwise."""
    if str(path) == CALIBRATED_PROFILE:
        return Path(str(resources.files("rlperf").joinpath("data").joinpath("calibrated_profiles.yaml")))
    return Path(path)


def _read_user_file(path: Path) -> dict[str, Any]:
    from rlperf.errors import show_path
    from rlperf.inputs import load_json, load_yaml

    data = load_json(path, "hardware_profile") if path.suffix.lower() == ".json" else load_yaml(path, "hardware_profile")
    if not isinstance(data, dict):
        raise SpecError("<root>", "not a mapping", "a mapping of profile fields", show_path(path))
    return data


# Top-level keys of a profile file kept for the record, not profile fields (``rlperf calibrate``
# writes its raw micro-benchmark numbers there, ``rlperf validate --calibrate`` its fit).
RECORD_KEYS = ("measurements", "calibration")


def accelerator_from_file(path: str | Path) -> Accelerator | None:
    """The accelerator a profile file *defines* (an ``accelerator:`` mapping, as ``rlperf
    calibrate`` writes for a device outside the catalog), or None if it defines none."""
    p = profile_file(path)
    spec = _read_user_file(p).get("accelerator")
    if not isinstance(spec, dict):
        return None
    try:
        return parse(Accelerator, spec, where="accelerator")
    except SpecError as err:  # the profile file's, not the scenario's that names it
        raise err.in_source(p) from None


def _defined_accelerator(name: str, path: str | Path | None) -> Accelerator | None:
    """The accelerator defined in the profile file at ``path`` if ``name`` is its id or alias."""
    if path is None:
        return None
    acc = accelerator_from_file(path)
    if acc is not None and normalize(name) in {normalize(k) for k in (acc.id, *acc.aliases)}:
        return acc
    return None


def load_profile(accelerator_id: str, path: str | Path | None = None) -> HardwareProfile:
    """The shipped profile of an accelerator, with fields overridden from a YAML/JSON file.

    The file holds profile fields (plain values or ``{value: ..., url: ...}``), optionally an
    ``accelerator:`` key that must match, or a ``profiles: {<id>: {...}}`` mapping like the
    shipped file. Fields it omits keep their shipped values. A file whose ``accelerator:`` is a
    mapping defines a new accelerator (:func:`accelerator_from_file`); its fields then override
    the generic profile."""
    defined = _defined_accelerator(accelerator_id, path)
    if defined is not None:
        aid = defined.id
        shipped = HardwareProfile(accelerator=aid, source="generic defaults (data/profiles.yaml generic:)")
    else:
        aid = load_accelerator(accelerator_id).id
        found = _shipped_profiles().get(aid)
        assert found is not None, f"profiles.yaml has no profile for {aid}"
        shipped = found
    if path is None:
        return shipped
    p = profile_file(path)
    try:
        return _profile_from_file(shipped, aid, defined, p)
    except SpecError as err:  # the profile file's, not the scenario's that names it
        raise err.in_source(p) from None


def _profile_from_file(shipped: HardwareProfile, aid: str, defined: Accelerator | None, p: Path) -> HardwareProfile:
    data = _read_user_file(p)
    if "profiles" in data:
        profiles = data["profiles"]
        if not isinstance(profiles, dict):
            raise SpecError("hardware_profile.profiles", f"a {type(profiles).__name__}, not a mapping",
                            "a mapping of accelerator id to profile fields")
        if aid not in profiles:
            have = ", ".join(profiles) if isinstance(profiles, dict) else "none"
            raise SpecError("hardware_profile", f"{p.name} has no profile for {aid}", have)
        data = profiles[aid]
        if not isinstance(data, dict):
            raise SpecError(f"hardware_profile.profiles.{aid}", f"a {type(data).__name__}, not a mapping", "profile fields")
    data = {k: v for k, v in data.items() if k not in RECORD_KEYS}
    named = data.pop("accelerator", None)
    if isinstance(named, dict):
        if defined is None:
            raise SpecError("hardware_profile.accelerator", f"{p.name} defines {named.get('id')!r}, not {aid!r}")
    elif named is not None and load_accelerator(str(named)).id != aid:
        raise SpecError("hardware_profile.accelerator", f"{p.name} is for {named!r}, not {aid!r}")
    values, prov = _split_entries(data)
    merged = shipped.model_dump()
    merged.update(values)
    merged["provenance"] = {**shipped.provenance, **{k: prov.get(k, f"override from {p}") for k in values}}
    merged["source"] = f"{shipped.source} + overrides from {p}"
    return parse(HardwareProfile, merged, where="hardware_profile")


def _positive(field: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecError(field, f"must be a positive integer, got {value!r}")


def make_cluster(
    gpu: str,
    num_gpus: int | None = None,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    profile_path: str | Path | None = None,
) -> Cluster:
    """A cluster of one accelerator kind.

    ``gpus_per_node`` defaults to the accelerator's node size (its scale-up domain). With only
    ``num_gpus``: fewer GPUs than a node make one partial node; more fill whole nodes and
    a partial last one (a GB200 job of 128 GPUs: one NVL72 rack and 56 GPUs of a second).
    Without either count: one full node. ``gpu`` may also name the accelerator that the profile
    file defines (e.g. ``local``, written by ``rlperf calibrate``)."""
    for field, value in (("num_gpus", num_gpus), ("num_nodes", num_nodes), ("gpus_per_node", gpus_per_node)):
        _positive(field, value)
    acc = _defined_accelerator(gpu, profile_path) or load_accelerator(gpu)
    gpn = gpus_per_node if gpus_per_node is not None else acc.gpus_per_node
    if num_gpus is None:
        nodes = num_nodes if num_nodes is not None else 1
    elif num_nodes is not None:
        if num_gpus != num_nodes * gpn:
            raise SpecError(
                "num_gpus",
                f"{num_gpus} != num_nodes {num_nodes} x gpus_per_node {gpn}",
                f"{num_nodes * gpn} or leave one of them out",
            )
        nodes = num_nodes
    elif num_gpus <= gpn:
        nodes, gpn = 1, num_gpus
    else:  # whole nodes, the last one possibly partial (e.g. 128 GPUs on NVL72 racks: 72 + 56)
        nodes = -(-num_gpus // gpn)
        last = num_gpus - (nodes - 1) * gpn
        return Cluster(
            accelerator=acc, profile=load_profile(acc.id, profile_path), num_nodes=nodes, gpus_per_node=gpn,
            last_node_gpus=None if last == gpn else last,
        )
    return Cluster(
        accelerator=acc,
        profile=load_profile(acc.id, profile_path),
        num_nodes=nodes,
        gpus_per_node=gpn,
    )
