"""What a store's fsspec filesystem is built with beyond its standard environment: fsspec's own configuration
(`fsspec.config.conf`, which every fsspec filesystem of the process applies when it is made, pyarrow's, dask's and
great-expectations' reads through fsspec included, and which fsspec fills from `FSSPEC_<PROTOCOL>_<KEY>` variables and
`~/.config/fsspec/*.json`), given defaults from one of two places:

- the operator's Prefect block (the `aws_credentials_block` setting): the `AwsCredentials` block of `prefect-aws`
  under that name, loaded from the Prefect API once per process (every host, the dask workers included, loads it
  where it first opens an `s3://` location), its keys, region and endpoint as s3fs's options;
- options given for this process (`dprelease query --storage-options JSON`: an analyst's endpoint or profile).

Neither set, nothing changes: each store's standard environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...) gives
the credentials, as before. Options are never logged, written or put in a message: they may hold secrets.
"""

from __future__ import annotations

import functools
import json

from tasks import settings
from tasks.errors import Refused

#: The protocols s3fs registers: a block's options apply to all of them.
S3_PROTOCOLS = ("s3", "s3a")


def use(options: dict, scheme: str) -> None:
    """`options` (s3fs's, gcsfs's, adlfs's keyword arguments) for every filesystem of `scheme` this process makes."""
    import fsspec.config

    for protocol in S3_PROTOCOLS if scheme in S3_PROTOCOLS else (scheme,):
        fsspec.config.conf.setdefault(protocol, {}).update(options)


def parse(text: str, what: str = "--storage-options") -> dict:
    """A JSON object of storage options, or one line saying why not (the text itself is not quoted: it may hold a
    secret)."""
    try:
        options = json.loads(text)
    except ValueError:
        raise Refused(f"{what} is not valid JSON (expected an object such as "
                      f"'{{\"client_kwargs\": {{\"endpoint_url\": \"http://host:9000\"}}}}')") from None
    if not isinstance(options, dict):
        raise Refused(f"{what} must be a JSON object of the store's options, got a {type(options).__name__}")
    return options


def configure() -> None:
    """Apply the operator's credentials block, if a setting names one (once per process and block)."""
    name = settings.current().aws_credentials_block
    if name is not None:
        _apply_block(name)


@functools.lru_cache(maxsize=4)
def _apply_block(name: str) -> None:
    use(block_options(name), "s3")


def block_options(name: str) -> dict:
    """s3fs's options from the `AwsCredentials` block `name` (keys, session token, region, endpoint, profile)."""
    where = f"the Prefect block aws-credentials/{name} ({settings.env_of('aws_credentials_block')})"
    try:
        from prefect_aws import AwsCredentials
    except ImportError:
        raise Refused(f"{where} needs prefect-aws: pip install \"dprelease[aws]\"") from None
    try:
        block = AwsCredentials.load(name)
    except ValueError:  # Prefect's "Unable to find block document named ..."
        raise Refused(f"{where} does not exist on the Prefect API this process uses") from None
    secret = block.aws_secret_access_key
    options = {"key": block.aws_access_key_id, "secret": secret.get_secret_value() if secret else None,
               "token": block.aws_session_token, "profile": block.profile_name}
    client = {"region_name": block.region_name, "endpoint_url": block.aws_client_parameters.endpoint_url}
    options = {k: v for k, v in options.items() if v}
    client = {k: v for k, v in client.items() if v}
    return {**options, **({"client_kwargs": client} if client else {})}
