"""`dprelease spec check`: every admission rule a run would meet, up to the dry run of its charge, without running
anything."""

from __future__ import annotations

import json

from flows.cli.accuracy import plan_accuracy
from flows.cli.run import new_release_id
from tasks import admission


def add_parsers(sub) -> None:
    spec = sub.add_parser("spec", help="work with release spec files")
    ssub = spec.add_subparsers(dest="spec_command", required=True)
    check = ssub.add_parser("check", help="validate a spec file without running anything",
                            description="Validate a release spec: schema, bounds, seed mode, and that its input "
                                        "files (data, public sample, public marginals) exist. Exit 2 otherwise.")
    check.add_argument("spec", help="release spec file (YAML or JSON)")
    check.add_argument("--json", action="store_true", help="machine-readable output (with the accuracy planner's "
                                                           "expected errors at the spec's epsilon)")
    check.set_defaults(func=cmd_spec_check)


def cmd_spec_check(args) -> int:
    """Every admission rule a run would meet, up to the dry run of its charge, without running anything."""
    spec = admission.admit_spec(admission.admit_file(args.spec), source=args.spec)
    release_id = spec.release_id or new_release_id(spec.dataset.id)
    admission.admit_run(spec.model_copy(update={"release_id": release_id}), release_id)
    if args.json:
        print(json.dumps({"spec": args.spec, "valid": True, "kind": spec.release.kind, "dataset_id": spec.dataset.id,
                          "columns": spec.dataset.columns, "epsilon": spec.release.epsilon,
                          "fingerprint": spec.fingerprint(), "confidence": spec.release.confidence,
                          "accuracy": plan_accuracy(spec, spec.release.epsilon)}))
        return 0
    print(f"{args.spec}: valid {spec.release.kind} release of dataset '{spec.dataset.id}' "
          f"(columns {spec.dataset.columns}, epsilon={spec.release.epsilon:g}); its input files exist and the ledger "
          f"would charge it")
    return 0
