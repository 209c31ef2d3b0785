"""Where the scratch location and the contracts' project may be: never inside the public output location, nor
around it.

The scratch holds raw-derived records (the data as ingested, scaled, encoded), and the great-expectations project
(`gx_folder`) raw-derived counts (its validation results and Data Docs); the output location is published whole (a
bucket or folder others read, its catalogue listing what is there). With one inside the other, the raw-derived files
land under the public prefix, or a release's public files under the private one (where their removal after
publication would take them). Refused before anything runs, for every entry point (`tasks.admission.admit_run`).
"""

from __future__ import annotations

from tasks import settings
from tasks.errors import Refused
from tasks.storage.locations import canonical, within


def check_apart(output_dir: str) -> None:
    """Refuse (one line) a scratch location or a `gx_folder` inside the public output location (the operator's
    `output`, else the spec's `output_dir`) or around it."""
    operator = settings.current()
    output = canonical(operator.output or output_dir)
    named = (f"the output location {output} ({settings.env_of('output')})" if operator.output else
             f"the output folder {output} (the spec's output_dir)")
    for field, what in (("scratch", "raw-derived records"), ("gx_folder", "the contracts' raw-derived counts")):
        location = getattr(operator, field)
        if location is None:
            continue
        private = canonical(location)
        if within(private, output):
            raise Refused(f"the {field} location {private} ({settings.env_of(field)}) is inside {named}, which is "
                          f"published: {what} would be published with the releases. Set it outside. Nothing was run")
        if within(output, private):
            raise Refused(f"{named[0].upper() + named[1:]} is inside the {field} location {private} "
                          f"({settings.env_of(field)}): releases would be written among {what}. Set it apart. "
                          f"Nothing was run")
