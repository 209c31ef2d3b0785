"""What a release shows in the Prefect UI: artifacts and events.

Everything here leaves `internal/`: it is stored by the Prefect server and shown to whoever can open the UI.
So it carries only what the release itself publishes or what is public by construction — the release id,
kind, dataset id, the privacy spend and the dataset's budget (functions of the plans and the operator's
budget), the mechanisms (the plan), contract results as passed/failed with their expectation counts (a
function of the spec), stage timings (Prefect shows task durations anyway) and the path of release/.
Never the evaluation's figures (they are computed on the raw data), unless the operator of the machine
allows it with DPRELEASE_UI_EVALUATION=allowed (never a spec or a flow parameter: whoever writes a spec
could otherwise read raw-data statistics off the UI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.assets import Asset, AssetProperties, add_asset_metadata, materialize
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.runtime import deployment, flow_run

from tasks import intervals_report, settings, storage

#: The operator's setting that lets the internal evaluation's headline into the UI.
UI_EVALUATION_ENV = settings.env_of("ui_evaluation")


def key(*parts: str) -> str:
    """An artifact key (Prefect allows lowercase letters, digits and dashes) from ids such as 'Adult_v2.1'."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def contract_rows(contracts_dir: Path) -> list[dict]:
    """Per stage: expectations checked and the result; no row counts (they are raw-derived)."""
    rows = []
    for path in sorted(contracts_dir.glob("*.json"), key=lambda p: p.stat().st_mtime):
        c = json.loads(path.read_text())
        rows.append({"stage": c["stage"], "expectations": c.get("expectations", 0),
                     "result": "passed" if c["success"] else "FAILED"})
    return rows


def privacy_lines(privacy: dict) -> list[str]:
    """The guarantee of a release (and the test-mode warning), as the report and the UI's report state it."""
    lines = ["## Privacy", "", f"This release: epsilon = {privacy['epsilon']:.6g}, delta = {privacy['delta']:.3g} "
                                f"({privacy['accounting']}).", ""]
    return lines + ([f"**{privacy['warning']}**", ""] if not privacy["private"] else [])


def report_markdown(summary: dict, manifest: dict, contracts: list[dict], evaluation_headline: str | None) -> str:
    privacy = manifest["privacy"]
    budget = privacy.get("dataset_budget")
    lines = [f"# Release `{summary['release_id']}`", "",
             f"Kind `{summary['kind']}` on dataset `{summary['dataset_id']}`: **{summary['status']}** "
             f"at {manifest['created_at']}.", "",
             f"Published files: `{published(summary)}`", "",
             *_data_docs_lines(summary),
             *privacy_lines(privacy)]
    if budget:
        lines += [f"Dataset budget: spent epsilon = {budget['spent_epsilon']:.6g} of {budget['epsilon']:g}, "
                  f"remaining {budget['remaining_epsilon']:.6g} (delta budget {budget['delta']:g}).", ""]
    lines += markdown_table(["mechanism", "query", "sensitivity", "distribution", "repetitions"],
                    [[m["name"], m["query"], f"{m['norm'].upper()} {m['sensitivity']}", m["distribution"],
                      m["repetitions"]] for m in privacy["mechanisms"]])
    lines += _uncertainty(summary, manifest)
    lines += ["", "## Data contracts", ""]
    lines += markdown_table(["stage", "expectations", "result"], [[c["stage"], c["expectations"], c["result"]]
                                                         for c in contracts])
    if summary.get("timings"):
        lines += ["", "## Stage timings", ""]
        lines += markdown_table(["stage", "seconds"], [[k, f"{v:.2f}"] for k, v in summary["timings"].items()])
    lines += ["", "## Evaluation", ""]
    lines.append(evaluation_headline if evaluation_headline is not None else
                 f"Internal (computed on the raw data): see `{summary['internal_dir']}/report.md` on the worker. "
                 f"An operator can show its headline here with {UI_EVALUATION_ENV}=allowed.")
    return "\n".join(lines) + "\n"


def published(summary: dict) -> str:
    """Where readers find the release: its published location (a store's URL, or the operator's output folder), else
    (a test-mode run, published nowhere) the run folder's release/. Never the worker's working copy of a published
    release."""
    return summary.get("published_at") or summary["release_dir"]


def link(location: str) -> str:
    """A location as a link: a store's URL as it is, a local path as a file:// URI."""
    return location if storage.is_url(location) else Path(location).resolve().as_uri()


def _data_docs_lines(summary: dict) -> list[str]:
    """The contracts' Data Docs (great-expectations' site of the dataset's history), where the release recorded them."""
    docs = summary.get("data_docs")
    return [f"Data contracts' history (great-expectations Data Docs): [{docs}]({link(docs)})", ""] if docs else []


def _uncertainty(summary: dict, manifest: dict) -> list[str]:
    """The published values' intervals (release/ only: published, so fit for the UI)."""
    uncertainty = manifest.get("uncertainty")
    lines = ["", "## Uncertainty of the published values", "", *intervals_report.summary_lines(uncertainty),
             *intervals_report.caveat_lines(manifest)]
    header, rows = intervals_report.table(Path(summary["release_dir"]), uncertainty)
    return lines + (["", *markdown_table(header, rows)] if rows else [])


def publish_artifacts(summary: dict, manifest: dict, contracts_dir: Path, ledger_rows: list[dict],
                      evaluation_headline: str | None) -> None:
    """The report (keyed per dataset, so the UI keeps its history), budget, ledger, contract and timing
    tables, and a link to release/."""
    ds = summary["dataset_id"]
    contracts = contract_rows(contracts_dir)
    shown = evaluation_headline if settings.current().ui_evaluation else None
    create_markdown_artifact(report_markdown(summary, manifest, contracts, shown), key=key("release-report", ds),
                             description=f"Release report of dataset {ds}")
    budget = manifest["privacy"].get("dataset_budget")
    if budget:
        create_table_artifact([{"dataset": ds, "lifetime_epsilon": budget["epsilon"],
                                "lifetime_delta": budget["delta"], "spent_epsilon": budget["spent_epsilon"],
                                "remaining_epsilon": budget["remaining_epsilon"],
                                "this_release_epsilon": manifest["privacy"]["epsilon"]}],
                              key=key("budget", ds), description=f"Privacy budget of dataset {ds}")
        create_table_artifact([{k: r[k] for k in ("release_id", "kind", "epsilon", "delta", "status", "attempts",
                                                 "created_at")} for r in ledger_rows],
                              key=key("ledger", ds), description=f"Privacy ledger entries of dataset {ds}")
    create_table_artifact(contracts, key=key("contracts", ds), description="Data contracts, per stage")
    if summary.get("timings"):
        create_table_artifact([{"stage": k, "seconds": v} for k, v in summary["timings"].items()],
                              key=key("timings", ds), description="Stage timings (seconds)")
    where = published(summary)
    create_link_artifact(link(where), link_text=where, key=key("release", ds),
                         description=f"Published files of release {summary['release_id']}")
    if summary.get("data_docs"):
        create_link_artifact(link(summary["data_docs"]), link_text=summary["data_docs"], key=key("data-docs", ds),
                             description=f"Data Docs of dataset {ds}'s contracts (great-expectations)")


class StageProgress:
    """A progress artifact of the flow run: the share of the release's stages done."""

    def __init__(self, stages: list[str]):
        self.stages = stages
        self.id = create_progress_artifact(0.0, description="release stages done")

    def done(self, stage: str) -> None:
        if stage in self.stages:
            update_progress_artifact(self.id, 100.0 * (self.stages.index(stage) + 1) / len(self.stages),
                                     description=f"stage '{stage}' done")

    def within(self, stage: str, fraction: float) -> None:
        """The running stage is `fraction` done (a tick of its progress bar: a tenth of its work)."""
        if stage in self.stages:
            update_progress_artifact(self.id, 100.0 * (self.stages.index(stage) + fraction) / len(self.stages),
                                     description=f"stage '{stage}': {round(100 * fraction)}%")


def _resource(release_id: str, dataset_id: str, kind: str) -> dict:
    return {"prefect.resource.id": f"dprelease.release.{release_id}", "prefect.resource.name": release_id,
            "dprelease.dataset": dataset_id, "dprelease.kind": kind}


def _related() -> list[dict]:
    """The flow run and deployment, so automations can act on them ('inferred' sources)."""
    related = []
    if flow_run.get_id():
        related.append({"prefect.resource.id": f"prefect.flow-run.{flow_run.get_id()}",
                        "prefect.resource.role": "flow-run"})
    if deployment.get_id():
        related.append({"prefect.resource.id": f"prefect.deployment.{deployment.get_id()}",
                        "prefect.resource.role": "deployment"})
    return related


def emit_published(summary: dict) -> None:
    emit_event("dprelease.release.published", _resource(summary["release_id"], summary["dataset_id"],
                                                        summary["kind"]), related=_related(),
               payload={"epsilon": summary["epsilon"], "delta": summary["delta"],
                        "release_dir": summary["release_dir"], "published_at": published(summary)})


def emit_failed(release_id: str, dataset_id: str, kind: str, error: str) -> None:
    """`error` is the pipeline's own message (vetted: no raw values) or an exception's type name."""
    emit_event("dprelease.release.failed", _resource(release_id, dataset_id, kind), related=_related(),
               payload={"error": error})


def emit_if_budget_low(summary: dict) -> bool:
    budget = summary.get("dataset_budget")
    threshold = settings.current().low_budget_fraction
    if not budget or budget["remaining_epsilon"] > threshold * budget["epsilon"]:
        return False
    emit_event("dprelease.budget.low", {"prefect.resource.id": f"dprelease.dataset.{summary['dataset_id']}",
                                        "prefect.resource.name": summary["dataset_id"]}, related=_related(),
               payload={"remaining_epsilon": budget["remaining_epsilon"], "lifetime_epsilon": budget["epsilon"],
                        "threshold_fraction": threshold})
    return True


@materialize("dprelease://lineage", name="lineage", cache_policy=NO_CACHE, persist_result=False)
def _materialise(metadata: dict[str, dict]) -> None:
    for key, values in metadata.items():
        add_asset_metadata(key, values)


def asset_key(location: str) -> str:
    """A location as a Prefect asset key: a store's URL as it is, a local path as file://PATH (unescaped: as_uri()
    escapes the "=" of the hive-style folders)."""
    canonical = storage.canonical(location)
    return canonical if storage.is_url(canonical) else f"file://{canonical}"


def record_lineage(manifest: dict, table: str, location: str, source: str | None) -> None:
    """A new materialisation of the release's stable asset, `table` (the dataset and kind's location, where every
    release of them reads as one table), by this flow run, from the dataset's input asset `source`: the UI's asset
    graph draws input -> dataset/kind, one node each however many releases, and each materialisation carries the
    release id, its location and privacy spend, the manifest's digest and files as metadata. Public facts only (the
    manifest's; the input's location is the operator's binding, not its contents), as every artifact."""
    about = {"release_id": manifest["release_id"], "dataset_id": manifest["dataset_id"], "kind": manifest["kind"],
             "period": manifest.get("period"), "epsilon": manifest["privacy"]["epsilon"],
             "delta": manifest["privacy"]["delta"], "manifest_sha256": manifest["manifest_sha256"]["sha256"],
             "files": [*sorted(manifest["files"]), "manifest.json"], "location": location}
    target = asset_key(table)
    if not _valid_key(target):  # a path Prefect will not take as a key (a space, a '#'): no lineage for it
        return
    name = f"{manifest['dataset_id']} / {manifest['kind']}"
    asset = Asset(key=target, properties=AssetProperties(
        name=name, description=f"Every DP release of dataset {manifest['dataset_id']}, kind {manifest['kind']}"))
    upstream = [Asset(key=k) for k in ([asset_key(source)] if source else []) if _valid_key(k)]
    _materialise.with_options(assets=[asset], asset_deps=upstream)({target: about})


def _valid_key(key: str) -> bool:
    try:
        Asset(key=key)
    except ValueError:
        return False
    return True
