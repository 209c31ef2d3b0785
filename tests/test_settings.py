"""The operator's settings: one object (`tasks.settings`), read from the environment, then config.toml, then the
default; every DPRELEASE_* variable is read there and nowhere else, and the documentation's table is generated
from it."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from tasks import settings
from tasks.errors import ReleaseError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for f in fields(settings.OperatorSettings):
        monkeypatch.delenv(f.metadata["env"], raising=False)
    path = tmp_path / "xdg" / "dprelease" / "config.toml"
    path.parent.mkdir(parents=True)
    return path


def test_environment_then_config_file_then_default(config, monkeypatch):
    assert settings.current().task_timeout_seconds == 4 * 3600
    config.write_text("task_timeout_seconds = 60\ntest_mode = \"allowed\"\n")
    assert settings.current().task_timeout_seconds == 60 and settings.current().test_mode
    monkeypatch.setenv("DPRELEASE_TASK_TIMEOUT_SECONDS", "5")
    assert settings.current().task_timeout_seconds == 5


def test_read_once_per_configuration(config, monkeypatch):
    first = settings.current()
    assert settings.current() is first
    monkeypatch.setenv("DPRELEASE_LOW_BUDGET_FRACTION", "0.5")
    assert settings.current() is not first and settings.current().low_budget_fraction == 0.5


@pytest.mark.parametrize("env, value, expected", [
    ("DPRELEASE_LEDGER", "relative/ledger.sqlite", "DPRELEASE_LEDGER must be an absolute path"),
    ("DPRELEASE_TEST_MODE", "yes", "DPRELEASE_TEST_MODE must be \"allowed\""),
    ("DPRELEASE_LOW_BUDGET_FRACTION", "2", "must be a fraction in [0, 1]"),
    ("DPRELEASE_TASK_TIMEOUT_SECONDS", "soon", "must be a number of seconds"),
    ("DPRELEASE_SPEC_FOLDERS", "specs", "DPRELEASE_SPEC_FOLDERS must be an absolute path"),
    ("DPRELEASE_DASK_TLS_CERT", "/etc/cert.pem", "the dask TLS settings go together"),
])
def test_a_bad_value_is_one_line_naming_the_variable(config, monkeypatch, env, value, expected):
    monkeypatch.setenv(env, value)
    with pytest.raises(ReleaseError) as refused:
        settings.current()
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_the_ledger_is_a_sqlite_file_or_a_postgresql_database_its_password_never_shown(config, monkeypatch):
    for url in ("postgresql://releases:pw@db.internal:5432/ledger", "postgres://db.internal/ledger?sslmode=require"):
        monkeypatch.setenv("DPRELEASE_LEDGER", url)
        assert settings.current().ledger == url and settings.is_database(settings.current().ledger)
    for bad in ("postgresql://releases:pw@db.internal:5432/", "postgresql://releases:pw@db.internal:port/ledger",
                "postgres:/releases:pw@db.internal/ledger", "host=db.internal password=pw"):
        monkeypatch.setenv("DPRELEASE_LEDGER", bad)
        with pytest.raises(ReleaseError, match="^DPRELEASE_LEDGER must") as refused:
            settings.current()
        assert ":pw" not in str(refused.value) and "=pw" not in str(refused.value) and "***" in str(refused.value)
    assert settings.masked("postgresql://u:p@ss@h/db?password=x&sslmode=require") == \
        "postgresql://u:***@h/db?password=***&sslmode=require"


def test_an_unknown_key_in_the_config_file_is_refused(config):
    config.write_text('legder = "/var/lib/ledger.sqlite"\n')
    with pytest.raises(ReleaseError, match="unknown setting.*legder"):
        settings.current()


def test_the_table_lists_every_setting_with_its_variable():
    rows = [line for line in settings.table().splitlines()[2:]]
    assert len(rows) == len(fields(settings.OperatorSettings))
    for f, row in zip(fields(settings.OperatorSettings), rows):
        assert f"`{f.name}`" in row and f"`{f.metadata['env']}`" in row and f.metadata["doc"] in row


def test_operator_variables_are_read_in_the_settings_module_only():
    """Eight variables were read in five modules, one of them undocumented (an attacker's review)."""
    sources = [f for p in ("tasks", "flows", "dpalgos", "data_contracts") for f in sorted((ROOT / p).rglob("*.py"))]
    readers = [str(f.relative_to(ROOT)) for f in sources
               if re.search(r"environ(\.get)?[(\[]\s*[\"']DPRELEASE_|getenv\(\s*[\"']DPRELEASE_", f.read_text())]
    assert readers == []
    documented = {f.metadata["env"] for f in fields(settings.OperatorSettings)}
    named = {v for f in sources for v in re.findall(r"DPRELEASE_[A-Z_]+[A-Z]", f.read_text())}
    assert named <= documented, f"variables named in the code but not settings: {sorted(named - documented)}"
