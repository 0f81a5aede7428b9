"""The workload a bench run sends to every layout: from flags or a `[bench]` TOML table.

One `Workload` describes the whole layout's load (all prompts, the total request rate); the
runner splits it across the serving instances (split.py) and each share becomes one client's
flags (`client_flags`).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

DATASETS = ("random", "sharegpt")


class WorkloadError(ValueError):
    """A workload that cannot run; the message names the file and key and says what to change."""


@dataclass(frozen=True)
class Workload:
    num_prompts: int = 200
    input_len: int | None = 512  # random dataset only; sharegpt prompts come from the file
    output_len: int | None = 128
    request_rate: float = math.inf  # requests/s over the whole layout; inf = all at once
    dataset: str = "random"
    dataset_path: str | None = None
    seed: int = 0

    def check(self, where: str = "the workload") -> Workload:
        """Raise WorkloadError for values vLLM's client would refuse or misread."""
        if self.num_prompts < 1:
            raise WorkloadError(f"{where}: num_prompts must be at least 1, not {self.num_prompts}")
        for key in ("input_len", "output_len"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise WorkloadError(f"{where}: {key} must be at least 1, not {v}")
        if not self.request_rate > 0:
            raise WorkloadError(
                f"{where}: request_rate must be > 0 (requests/s; inf sends all at once), "
                f"not {self.request_rate}"
            )
        if self.dataset not in DATASETS:
            raise WorkloadError(
                f"{where}: dataset must be one of {', '.join(DATASETS)}, not {self.dataset!r}"
            )
        if self.dataset == "sharegpt":
            if not self.dataset_path:
                raise WorkloadError(
                    f"{where}: the sharegpt dataset needs its file: --dataset sharegpt FILE "
                    "(or dataset_path in [bench])"
                )
            if not Path(self.dataset_path).is_file():
                raise WorkloadError(f"{where}: dataset file {self.dataset_path} does not exist")
        elif self.dataset_path:
            raise WorkloadError(
                f"{where}: the random dataset takes no file; drop {self.dataset_path} or use "
                "--dataset sharegpt FILE"
            )
        return self

    def with_overrides(self, **values: Any) -> Workload:
        """This workload with the values that are not None replaced (flags over a file)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return doc

    def client_flags(self, num_prompts: int, request_rate: float, seed: int) -> list[str]:
        """The `vllm bench serve` flags of one client's share of this workload."""
        flags = ["--dataset-name", self.dataset, "--num-prompts", str(num_prompts)]
        if self.dataset_path:
            flags += ["--dataset-path", str(Path(self.dataset_path).absolute())]
        # The dataset's own length flags: the general --input-len/--output-len are recent
        # (the GPU kit's vLLM 0.26 was run with these; --input-len is not checked there).
        if self.input_len is not None and self.dataset == "random":
            flags += ["--random-input-len", str(self.input_len)]
        if self.output_len is not None:
            flags += [f"--{self.dataset}-output-len", str(self.output_len)]
        flags += ["--request-rate", "inf" if math.isinf(request_rate) else repr(request_rate)]
        flags += ["--seed", str(seed)]
        return flags


KEYS = {f.name for f in fields(Workload)}


def load_workload(path: str | Path) -> Workload:
    """The `[bench]` table of a TOML file (its other tables are ignored). Keys as in
    `Workload`, also with dashes (`num-prompts`); `request_rate = "inf"` is allowed."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as exc:
        raise WorkloadError(f"cannot read {p}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{p}: not valid TOML ({exc})") from None
    table = doc.get("bench")
    if not isinstance(table, dict):
        raise WorkloadError(
            f"{p}: no [bench] table; add one, e.g. [bench] num_prompts = 200, input_len = 512"
        )
    values: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        where = f"{p}: [bench] key '{raw_key}'"
        if key not in KEYS:
            raise WorkloadError(f"{where}: unknown key; use one of {', '.join(sorted(KEYS))}")
        values[key] = _typed(key, value, where)
    if "dataset_path" in values:
        dp = Path(values["dataset_path"]).expanduser()
        values["dataset_path"] = str(dp if dp.is_absolute() else p.parent / dp)
    return Workload(**values).check(f"{p}: [bench]")


def _typed(key: str, value: Any, where: str) -> Any:
    if key in ("num_prompts", "input_len", "output_len", "seed"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadError(f"{where}: must be an integer, not {value!r}")
        return value
    if key == "request_rate":
        if value == "inf":
            return math.inf
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkloadError(f'{where}: must be a number of requests/s or "inf"')
        return float(value)
    if not isinstance(value, str):
        raise WorkloadError(f"{where}: must be a string, not {value!r}")
    return value
