"""The deployments as the Prefect UI shows them before any run: tags of each deployment (which its scheduled runs
carry before they start), the flow's parameter descriptions, and the job variables."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _deployments() -> list[dict]:
    return yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]


def test_every_deployment_is_tagged_with_its_specs_dataset_and_kind():
    """Prefect gives a deployment's tags to the runs its schedule creates: an upcoming run shows its dataset."""
    for deployment in _deployments():
        spec = yaml.safe_load((REPO / deployment["parameters"]["spec_file"]).read_text())
        assert deployment["tags"] == [f"dataset:{spec['dataset']['id']}", f"kind:{spec['release']['kind']}"], \
            deployment["name"]


def test_every_flow_parameter_has_a_description_in_the_ui():
    """Prefect reads the descriptions from the flow's docstring (its Args section) into the parameter schema the UI
    shows beside each field."""
    from prefect.utilities.callables import parameter_schema

    from flows.release import release

    schema = parameter_schema(release.fn).model_dump()["properties"]
    assert set(schema) == {"spec", "spec_file", "release_id", "period"}
    assert all(len(p.get("description") or "") > 30 for p in schema.values()), schema


def test_the_job_variables_are_the_process_defaults():
    """And the flow runs' heartbeat, which only deployment runs need (the zombie-run automation watches it)."""
    from flows.environment import DEFAULTS

    pool = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["definitions"]["work_pool"]
    assert pool["job_variables"]["env"] == {**DEFAULTS, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}


def test_the_zombie_run_automation_crashes_a_run_only_after_heartbeats_stopped():
    """Prefect's proactive "flow run heartbeat" trigger (Prefect 3.9's schema): after a heartbeat, expect another
    heartbeat or a final state within the window, per flow run, else change the run's state to Crashed. The window
    leaves room for at least two missed heartbeats on a loaded machine (a heartbeat is a thread of the flow
    process): a run alive but slow to beat must not be crashed."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.schemas.automations import AutomationCore, Posture

    pool = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["definitions"]["work_pool"]
    heartbeat = int(pool["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"])
    [zombie] = [AutomationCore.model_validate(a) for a in
                yaml.safe_load((REPO / "deployments" / "zombie-runs.yaml").read_text())["automations"]]
    trigger = zombie.trigger
    assert trigger.posture == Posture.Proactive and trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
            "prefect.flow-run.Crashed", "prefect.flow-run.Cancelled"} == trigger.expect
    assert trigger.for_each == {"prefect.resource.id"} and trigger.threshold == 1
    assert 30 <= heartbeat and trigger.within.total_seconds() >= 3 * heartbeat
    [action] = zombie.actions
    assert action.type == "change-flow-run-state" and action.state == StateType.CRASHED
