"""`dprelease accuracy SPEC [--epsilon E ...] [--records N] [--json]`: the accuracy planner. Before any budget is
spent, the expected error of each published quantity of the spec's release at each epsilon, from the plan and
the spec's public parameters alone: it reads neither the data nor the ledger (the spec file only). Each row says
how it was obtained (exact from the noise law, exact for a linear postprocessing, or simulated on public data)
and what it assumes where the error depends on the unknown data (a cluster's size, counts far from zero)."""

from __future__ import annotations

import json

from flows.cli.arguments import positive_finite, positive_int
from tasks.errors import SpecError


def add_parsers(sub) -> None:
    acc = sub.add_parser("accuracy", help="expected error of each published quantity, per epsilon, before spending",
                         description="The accuracy planner: the expected error (standard deviation and interval "
                                     "half-width at the spec's confidence) of each quantity the spec's release "
                                     "publishes, for each epsilon, from the plan alone. Reads neither the data nor "
                                     "the ledger; states its assumptions where the error depends on the data.")
    acc.add_argument("spec", help="release spec file (YAML or JSON)")
    acc.add_argument("--epsilon", type=positive_finite, nargs="+", help="epsilons to plan (default: the spec's)")
    acc.add_argument("--records", type=positive_int, help="a public guess of the number of records, for quantities "
                                                          "whose error depends on it (a cluster's size, a core weight)")
    acc.add_argument("--json", action="store_true", help="machine-readable output")
    acc.set_defaults(func=cmd_accuracy)


def with_epsilon(spec, epsilon: float):
    """The spec with another epsilon, validated as a spec is (the uncertainty fields, left out of dumps, kept)."""
    from pydantic import ValidationError

    release = spec.release
    data = {**release.model_dump(), "epsilon": epsilon, "confidence": release.confidence,
            "replicates": release.replicates}
    try:
        return spec.model_copy(update={"release": type(release).model_validate(data)})
    except ValidationError as exc:
        raise SpecError(f"epsilon {epsilon:g}: {exc.errors()[0]['msg']}") from None


def plan_accuracy(spec, epsilon: float, records: int | None = None) -> list[dict]:
    """The planner's rows for `spec` at `epsilon` (JSON-able)."""
    from dpalgos.accounting import CalibrationError
    from tasks.kinds import kind_of

    try:
        return [row.to_json() for row in kind_of(with_epsilon(spec, epsilon)).accuracy(records)]
    except CalibrationError as exc:  # public parameters only: the spec's problem
        raise SpecError(f"epsilon {epsilon:g}: {exc}") from None


def cmd_accuracy(args) -> int:
    from tasks.admission.footprint import check_fits
    from tasks.spec import load_spec

    spec = load_spec(args.spec)  # the schema only: no data, no ledger
    # A release the machine cannot run is not planned either: the planner reruns its postprocessing at the spec's
    # sizes (a 2^30-bin histogram's plan took 22 GB before the kernel killed it).
    check_fits(spec)
    epsilons = args.epsilon or [spec.release.epsilon]
    tables = {eps: plan_accuracy(spec, eps, args.records) for eps in epsilons}
    if args.json:
        print(json.dumps({"spec": args.spec, "kind": spec.release.kind, "confidence": spec.release.confidence,
                          "records": args.records, "epsilons": [{"epsilon": e, "quantities": rows}
                                                                for e, rows in tables.items()]}, indent=2))
        return 0
    print(format_tables(args.spec, spec, tables))
    return 0


def format_tables(path: str, spec, tables: dict) -> str:
    c = spec.release.confidence
    lines = [(f"{path}: {spec.release.kind} release of dataset '{spec.dataset.id}'; expected error of each published "
              f"quantity (standard deviation, and the half-width of its {c:g} interval), from the plan alone")]
    for eps, rows in tables.items():
        lines += ["", f"epsilon = {eps:g}", f"  {'quantity':58s} {'std':>11s} {'+/-':>11s}  basis; assumption"]
        for r in rows:
            lines.append(f"  {r['quantity']:58s} {_num(r['std'])} {_num(r['half_width'])}  {r['basis']}"
                         + (f"; {r['assumption']}" if r["assumption"] else ""))
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return f"{'-':>11s}" if x is None else f"{x:11.4g}"
