"""What a release kind provides to the generic pipeline (`tasks.stages`, `flows.release`).

The pipeline is the same for every kind: ingest -> prepare (per-record, on dask) -> DP measurement (written
once, after the ledger's charge) -> postprocessing (reads the measurements only) -> publish -> evaluate.
A kind supplies the steps that depend on the mathematics, and the contracts of their outputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from dp_accounting import dp_event as dpe

from data_contracts.suites import Contract
from tasks.ingest import StageOutput
from tasks.run import RunPaths
from tasks.spec import ReleaseSpec


@dataclass(frozen=True)
class Draw:
    """Noisy measurements drawn in memory: `write(folder)` stores their files; `meta` goes into
    measurements.json (with the pipeline's own fields: release id, kind, fingerprint, dp event)."""
    write: Callable[[Path], None]
    meta: dict


class ReleaseKind(ABC):
    name: str
    #: contract stage name of the prepared data; None: no prepare stage (the ingested data are used as they are)
    prepared_stage: str | None

    def check_feasible(self, spec: ReleaseSpec, prepared: StageOutput) -> None:
        """Refuse a release that cannot be made (e.g. K > N) before anything is charged."""

    @abstractmethod
    def prepare(self, spec: ReleaseSpec, ingested: StageOutput, run: RunPaths, log) -> StageOutput:
        """Per-record transformation of the ingested data on dask (raw-derived: written under internal/)."""

    @abstractmethod
    def prepared_contract(self, spec: ReleaseSpec) -> Contract: ...

    @abstractmethod
    def event(self, spec: ReleaseSpec) -> dpe.DpEvent:
        """The dp_accounting description of the measurement, charged before any noise is drawn."""

    @abstractmethod
    def draw(self, spec: ReleaseSpec, prepared: StageOutput, rng: np.random.Generator, log) -> Draw:
        """The DP measurement: aggregates from dask, noise added on the driver."""

    @abstractmethod
    def measurements_contract(self, spec: ReleaseSpec) -> tuple[str, Contract]:
        """(file inside measurements/, its contract)."""

    @abstractmethod
    def postprocess(self, spec: ReleaseSpec, measurements: Path, staging: Path, internal: Path, log) -> list[str]:
        """Release products computed from the measurements and public parameters ONLY, into `staging`;
        diagnostics of the computation may go to `internal`."""

    @abstractmethod
    def release_contract(self, spec: ReleaseSpec) -> tuple[str, Contract]:
        """(file inside release/, its contract)."""

    @abstractmethod
    def mechanisms(self, spec: ReleaseSpec) -> list[dict]:
        """Human-readable noise calls with their sensitivities, for the manifest."""

    @abstractmethod
    def evaluate(self, spec: ReleaseSpec, run: RunPaths, prepared: StageOutput, log) -> dict:
        """Internal utility report against the raw data (never published). Must hold a 'headline' string."""


class IngestedAsPrepared(ReleaseKind, ABC):
    """A kind whose records need no prepare stage (set-valued records are normalised at ingest)."""
    prepared_stage = None

    def prepare(self, spec: ReleaseSpec, ingested: StageOutput, run: RunPaths, log) -> StageOutput:
        return ingested

    def prepared_contract(self, spec: ReleaseSpec) -> Contract:
        raise NotImplementedError(f"{self.name} has no prepare stage")
