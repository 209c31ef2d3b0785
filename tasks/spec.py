"""The typed release spec: the one parameter of the `release` flow.

Everything in it is PUBLIC: the dataset's location and schema, the attribute bounds, the release's
parameters and privacy budget. Nothing in a spec may be read off the sensitive data.
Relative paths are taken relative to the working directory of the process that runs the flow.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, ValidationError, model_validator

from tasks import settings
from tasks.errors import SpecError
from tasks.kinds import REGISTRY
from tasks.kinds.uncertainty import NOT_MEASURED
from tasks.params import ID_PATTERN, DaskSpec, DatasetSpec, Strict
from tasks.specfile import SpecFileError, read_mapping

#: The `release:` section: the parameters model of one registered kind, chosen by its `kind` field.
ReleaseParams = Annotated[Union[tuple(k.Params for k in REGISTRY.values())], Field(discriminator="kind")]


class ReleaseSpec(Strict):
    """One release: dataset, release kind and parameters, budget, where outputs go."""
    dataset: DatasetSpec = Field(description="where the sensitive data is and its public schema")
    release: ReleaseParams = Field(description="the release kind (`kind`) and its parameters, its epsilon included")
    output_dir: str = Field("dprelease-runs", description="folder of the run folders (<output_dir>/<release_id>/)")
    release_id: str | None = Field(None, pattern=ID_PATTERN,
                                   description="reuse an id to resume a release without spending again")
    dask: DaskSpec = Field(DaskSpec(), description="size of the local dask cluster (when the operator names no "
                                                   "scheduler)")
    evaluate: bool = Field(True, description="compute the internal utility evaluation against raw data")
    mode: Literal["production", "test"] = Field(
        "production", description="test: seeded noise, NOT private, writes test-output/, charges nothing; only where "
                                  "the operator allows it (DPRELEASE_TEST_MODE)")
    seed: int | None = Field(None, description="only in mode 'test': reproducible noise, recorded as such")

    @model_validator(mode="before")
    @classmethod
    def _no_ledger_section(cls, data):
        if isinstance(data, dict) and "ledger" in data:
            raise ValueError("the ledger and lifetime budgets are operator configuration, not spec fields: remove "
                             "`ledger:` (budgets: `dprelease budget set DATASET --epsilon E --delta D`; the ledger: "
                             "$DPRELEASE_LEDGER)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _public_defaults(cls, data):
        """A kind's defaults that follow from the dataset's public schema (`ReleaseKind.public_defaults`)."""
        if isinstance(data, dict) and isinstance(data.get("release"), dict) and isinstance(data.get("dataset"), dict):
            kind = REGISTRY.get(data["release"].get("kind"))
            if kind is not None:
                data = {**data, "release": kind.public_defaults(data["release"], data["dataset"])}
        return data

    @model_validator(mode="after")
    def _seed_only_in_test_mode(self):
        if self.seed is not None and self.mode != "test":
            raise ValueError("a seed is accepted only with mode: test (production noise is seeded from the OS)")
        if self.mode == "test" and not settings.current().test_mode:
            # A seeded run reads the real data without a charge and its noise can be replayed from the seed:
            # only an operator's machine setting allows it (never a spec or a UI parameter).
            raise ValueError(f"mode: test is disabled on this machine (an operator enables it for test data with "
                             f"{settings.env_of('test_mode')}=allowed)")
        return self

    @model_validator(mode="after")
    def _columns_fit_the_kind(self):
        REGISTRY[self.release.kind].check_dataset(self.dataset)
        REGISTRY[self.release.kind].check_release(self.dataset, self.release)
        return self

    @property
    def test_mode(self) -> bool:
        return self.mode == "test"

    def fingerprint(self) -> str:
        """Hash of everything that determines the DP measurements; a resumed release must match it."""
        basis = {"dataset": self.dataset.id, "path": self.dataset.path, "numeric": self.dataset.numeric,
                 "bounds": self.dataset.bounds, "categories": self.dataset.categories,
                 "weight": [self.dataset.weight_column, self.dataset.max_weight, self.dataset.weights_count_records],
                 "items": [self.dataset.items_column, self.dataset.item_count, self.dataset.user_column],
                 "release": self.release.model_dump(exclude=NOT_MEASURED), "mode": self.mode,
                 "seed": self.seed}
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def load_spec(path: str | Path, **overrides) -> ReleaseSpec:
    """Read a YAML or JSON spec file; keyword overrides replace top-level fields (None is ignored)."""
    path = Path(path)
    try:
        data = read_mapping(path)
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist") from None
    except SpecFileError as exc:
        raise SpecError(str(exc)) from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_spec(data, source=str(path))


def parse_spec(data: dict, source: str = "spec") -> ReleaseSpec:
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{_where(e['loc'])}: {_clean(e['msg'])}" for e in exc.errors())
        raise SpecError(f"invalid release spec ({source}): {problems}") from None


def _where(loc: tuple) -> str:
    # The discriminated union puts the kind into the location (release.kmeans.epsilon): drop it.
    parts = [str(p) for i, p in enumerate(loc) if not (i == 1 and loc[0] == "release" and p in REGISTRY)]
    return ".".join(parts) or "spec"


def _clean(msg: str) -> str:
    return re.sub(r"^Value error, ", "", msg)
