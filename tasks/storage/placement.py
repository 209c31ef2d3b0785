"""Where the scratch location may be: never inside the public output location, nor around it.

The scratch holds raw-derived records (the data as ingested, scaled, encoded); the output location is published
whole (a bucket or folder others read, its catalogue listing what is there). With one inside the other, the raw
records land under the public prefix, or a release's public files under the private one (where their removal after
publication would take them). Refused before anything runs, for every entry point (`tasks.admission.admit_run`).
"""

from __future__ import annotations

from tasks import settings
from tasks.errors import Refused
from tasks.storage.locations import canonical, within


def check_apart(output_dir: str) -> None:
    """Refuse (one line) a scratch location inside the public output location (the operator's `output`, else the
    spec's `output_dir`) or around it."""
    operator = settings.current()
    if operator.scratch is None:
        return
    scratch = canonical(operator.scratch)
    output = canonical(operator.output or output_dir)
    named = (f"the output location {output} ({settings.env_of('output')})" if operator.output else
             f"the output folder {output} (the spec's output_dir)")
    if within(scratch, output):
        raise Refused(f"the scratch location {scratch} ({settings.env_of('scratch')}) is inside {named}, which is "
                      f"published: raw-derived records would be published with the releases. Set the scratch "
                      f"outside it. Nothing was run")
    if within(output, scratch):
        raise Refused(f"{named[0].upper() + named[1:]} is inside the scratch location {scratch} "
                      f"({settings.env_of('scratch')}): releases would be written among raw-derived records (and "
                      f"removed with them). Set the scratch apart from it. Nothing was run")
