"""From a layout's instances to the pulls they need, and from a pull to the specs that start.

An instance is pulled when its model is a hub id, its `pull` key is true (the default) and
neither its env nor the daemon's sets HF_HUB_OFFLINE (offline means: do not ask the hub; vLLM
then finds the model in the cache by itself, as before vsup pulled). Instances naming the same
model, revision, cache and load format share one pull.

`resolve` reads the cache only: a model complete in it gets `model_path` (its snapshot) on
every instance that names it, so vLLM starts from the local files with HF_HUB_OFFLINE=1; the
others are returned as pulls to do (`allow_pull`) or left as written (vLLM downloads them).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsup.layout.modelpath import is_local_model
from vsup.layout.spec import InstanceSpec
from vsup.pull import cache as cache_mod
from vsup.pull.errors import PullError
from vsup.pull.run import PullRequest

OFFLINE_VALUES = ("1", "true", "yes", "on")


def is_offline(env: Mapping[str, str]) -> bool:
    return str(env.get("HF_HUB_OFFLINE", "")).strip().lower() in OFFLINE_VALUES


def instance_env(spec: InstanceSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the instance's vLLM sees for the hub: the daemon's, then the layout's."""
    env = dict(os.environ if base is None else base)
    env.update({k: str(v) for k, v in spec.env.items()})
    return env


def pulls_hub_model(spec: InstanceSpec) -> bool:
    """A hub model with `pull` on: vsup pulls it unless the instance runs offline."""
    # a hub id is `org/name` (or a legacy bare `name`); local paths start with / ./ ../ ~
    return spec.pull and not is_local_model(spec.model) and spec.model.count("/") <= 1


def wants_pull(spec: InstanceSpec, base: Mapping[str, str] | None = None) -> bool:
    """Whether vsup pulls this instance's model (see the module's docstring)."""
    return pulls_hub_model(spec) and not is_offline(instance_env(spec, base))


@dataclass(frozen=True)
class PullTarget:
    """One pull and the instances waiting for it."""

    model: str
    revision: str | None
    cache_dir: Path
    load_format: str | None
    token_env: str | None
    instances: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (
            self.model,
            self.revision or cache_mod.DEFAULT_REVISION,
            str(self.cache_dir),
            (self.load_format or "auto").lower(),
        )

    @property
    def label(self) -> str:
        return self.model if self.revision is None else f"{self.model}@{self.revision}"

    def request(self) -> PullRequest:
        return PullRequest(
            self.model, self.revision, self.cache_dir, self.load_format, self.token_env
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision or cache_mod.DEFAULT_REVISION,
            "cache_dir": str(self.cache_dir),
            "load_format": self.load_format,
            "token_env": self.token_env,
            "instances": list(self.instances),
        }


def _revision(spec: InstanceSpec) -> str | None:
    if spec.revision:
        return spec.revision
    value = spec.arg("revision")
    return str(value) if isinstance(value, str) and value else None


def _load_format(spec: InstanceSpec) -> str | None:
    value = spec.arg("load-format")
    return str(value) if isinstance(value, str) and value else None


def target_of(spec: InstanceSpec, base: Mapping[str, str] | None = None) -> PullTarget:
    """The pull an instance needs (whether or not it is complete in the cache)."""
    download_dir = spec.arg("download-dir")
    cache = cache_mod.hub_cache_dir(
        instance_env(spec, base), str(download_dir) if download_dir else None
    )
    return PullTarget(
        spec.model, _revision(spec), cache, _load_format(spec), spec.hf_token_env, (spec.name,)
    )


def group(targets: Iterable[PullTarget]) -> list[PullTarget]:
    """One target per (model, revision, cache, load format), with all its instances."""
    merged: dict[tuple[str, str, str, str], PullTarget] = {}
    for t in targets:
        prev = merged.get(t.key)
        if prev is None:
            merged[t.key] = t
        else:
            merged[t.key] = dataclasses.replace(
                prev,
                instances=prev.instances + t.instances,
                token_env=prev.token_env or t.token_env,
            )
    return list(merged.values())


def pulled_spec(spec: InstanceSpec, snapshot: Path | str) -> InstanceSpec:
    """The spec that starts vLLM from a pulled snapshot (offline, under the model's name)."""
    return dataclasses.replace(spec, model_path=str(snapshot))


@dataclass(frozen=True)
class Resolution:
    """`resolve`'s answer: specs to apply, and the pulls that must end first."""

    specs: tuple[InstanceSpec, ...]
    pulls: tuple[PullTarget, ...]  # models not complete in the cache (empty: start at once)

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(n for t in self.pulls for n in t.instances)


def resolve(
    specs: Sequence[InstanceSpec],
    base: Mapping[str, str] | None = None,
    allow_pull: bool = True,
    home: Path | None = None,
) -> Resolution:
    """Specs with `model_path` where the cache holds the model complete; the pulls that the
    others need (`allow_pull` False: none, those go to vLLM as written). Disk reads only."""
    out: list[InstanceSpec] = []
    needed: list[PullTarget] = []
    for spec in specs:
        spec = dataclasses.replace(spec, model_path=None)
        if not wants_pull(spec, base):
            out.append(spec)
            continue
        target = target_of(spec, base)
        snap = cache_mod.complete_snapshot(target.cache_dir, spec.model, target.revision, home)
        if snap is not None:
            out.append(pulled_spec(spec, snap))
            continue
        out.append(spec)
        if allow_pull:
            needed.append(target)
    return Resolution(tuple(out), tuple(group(needed)))


def apply_pulled(
    specs: Sequence[InstanceSpec], snapshots: Mapping[str, Path | str]
) -> list[InstanceSpec]:
    """`specs` with each instance named in `snapshots` (name -> snapshot) started from it."""
    return [pulled_spec(s, snapshots[s.name]) if s.name in snapshots else s for s in specs]


def token_for(target: PullTarget, env: Mapping[str, str] | None = None) -> str | None:
    """The token a pull sends: `$hf_token_env` when the layout names one (PullError no_token
    when it is unset), else None (huggingface_hub then uses HF_TOKEN or `hf auth login`'s)."""
    if not target.token_env:
        return None
    value = (os.environ if env is None else env).get(target.token_env)
    if not value:
        raise PullError(
            "no_token",
            f"hf_token_env names {target.token_env}, which is not set where the pull runs: "
            f"export it (for `vsup up`: in the daemon's environment - the daemon inherits the "
            "environment of the command that started it; `vsup down`, export, `vsup up`)",
        )
    return value
