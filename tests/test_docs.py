"""The documentation cannot rot: its commands run, its tables are the code's.

The shell blocks of the tutorial and the how-to guides that a reader copies are run here, in order, in a temporary
folder, with the operator's ledger, config and state in that folder and DPRELEASE_TEST_MODE unset (a production
machine). A block is run when the line before its opening fence is a marker:

    <!-- test -->            run it in the default suite
    <!-- test: exit 2 -->    run it and expect that exit code (a refusal the page shows)
    <!-- test: slow -->      run it only with `pytest -m slow` (a real Prefect server and worker, a dask scheduler)

The blocks of one page run in one bash process (`set -euo pipefail`), so that an `export` carries over as it does
for a reader. A page that reads what another page made says so on a line of its own, `<!-- test-needs: PAGE -->`:
the pages share one folder, and a needed page is run first. The reference tables are generated at build time by
docs/hooks/reference.py; the tests below check that the README and the pages use the generated tables, not copies.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^<!-- test(?::\s*(?P<opts>[^>]*?))?\s*-->\n```(?:bash|sh)\n(?P<code>.*?)^```", re.S | re.M)
NEEDS = re.compile(r"^<!-- test-needs: (\S+) -->$", re.M)
#: The pages whose commands are run, in the order a reader meets them; `slow`: pages whose every block is slow.
PAGES = ["tutorial.md", "how-to/public-inputs.md", "how-to/od-tables.md", "how-to/downstream.md", "how-to/resume.md",
         "how-to/dask-cluster.md", "how-to/schedule.md"]


@dataclass
class Block:
    page: str
    index: int
    code: str
    exit: int = 0
    slow: bool = False


def blocks(page: str) -> list[Block]:
    out = []
    for i, match in enumerate(BLOCK.finditer((DOCS / page).read_text())):
        opts = (match.group("opts") or "").split()
        exit_code = int(opts[opts.index("exit") + 1]) if "exit" in opts else 0
        out.append(Block(page, i, match.group("code"), exit_code, "slow" in opts))
    return out


def needs(page: str) -> list[str]:
    return NEEDS.findall((DOCS / page).read_text())


def script(page_blocks: list[Block]) -> str:
    """One bash script: every block in order, each expected exit code checked."""
    lines = ["set -euo pipefail"]
    for b in page_blocks:
        lines.append(f"echo '>>> {b.page} block {b.index + 1}' >&2")
        if b.exit == 0:
            lines.append(b.code)
        else:
            lines += ["set +e", "(", b.code, ")", "rc=$?", "set -e",
                      f"if [ $rc -ne {b.exit} ]; then echo '{b.page} block {b.index + 1}: exit '$rc', the page "
                      f"says {b.exit}' >&2; exit 97; fi"]
    return "\n".join(lines) + "\n"


def environment(folder: Path) -> dict:
    """A reader's shell on a production machine whose operator state is all in `folder`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRELEASE_")}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                # the tutorial's own `export`, for the pages that come after it in the same folder
                "DPRELEASE_LEDGER": str(folder / "privacy-ledger.sqlite"),
                "XDG_CONFIG_HOME": str(folder / ".config"), "XDG_STATE_HOME": str(folder / ".state"),
                "PREFECT_HOME": str(folder / ".prefect-home"), "DPRELEASE_REPO": str(ROOT)})
    return env


#: What a page's slow test needs around it: the repository's folders it names, linked into the workspace (the
#: schedule guide runs "from the repository root"), and fixed ports it uses, replaced by free ones (another test or
#: another user of the machine may hold 4200 or 8786).
SETUP = {"how-to/schedule.md": {"links": ("deployments", "flows"), "ports": ("4200",)},
         "how-to/dask-cluster.md": {"links": (), "ports": ("8786",)}}


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Workspace:
    """The folder the pages' commands run in, and which pages have run there."""

    def __init__(self, folder: Path):
        self.folder, self.done = folder, set()

    def run(self, page: str, slow: bool) -> None:
        for needed in needs(page):
            if needed not in self.done:
                self.run(needed, slow=False)
        self.done.add(page)
        chosen = [b for b in blocks(page) if slow or not b.slow]
        if not chosen:
            return
        code = script(chosen)
        setup = SETUP.get(page, {}) if slow else {}
        for name in setup.get("links", ()):
            if not (self.folder / name).exists():
                (self.folder / name).symlink_to(ROOT / name)
        for port in setup.get("ports", ()):
            code = code.replace(port, _free_port())
        log = self.folder / f"{page.replace('/', '-')}.log"
        # Output to a file, not a pipe: the servers a page starts in the background (&) hold its streams.
        with open(log, "w") as out:
            shell = subprocess.Popen(["bash", "-c", code], cwd=self.folder, env=environment(self.folder),
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = shell.wait(timeout=900)
            finally:
                _stop_group(shell.pid)
        assert returncode == 0, (f"{page}: a documented command failed (exit {returncode})\n"
                                 f"{log.read_text()[-8000:]}")


def _stop_group(pgid: int) -> None:
    """Stop what the page's shell started in the background (its own process group, made for it above): TERM
    twice, as Prefect workers ignore the first, then KILL."""
    import signal
    import time

    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("docs"))


def test_every_marked_block_is_a_shell_block_of_a_listed_page():
    """A marker before a block that is not bash, or on a page this module does not run, would be a silent skip."""
    for md in DOCS.rglob("*.md"):
        page = str(md.relative_to(DOCS))
        text = md.read_text()
        markers = len(re.findall(r"^<!-- test(?::[^>]*)?\s*-->$", text, re.M))
        assert markers == len(blocks(page)), f"{page}: a test marker is not right before a ```bash block"
        assert not markers or page in PAGES, f"{page} has test markers but is not in tests/test_docs.py PAGES"
    for page in PAGES:
        assert blocks(page), f"{page}: no command of the page is tested"


@pytest.mark.parametrize("page", [p for p in PAGES if any(not b.slow for b in blocks(p))])
def test_the_documented_commands_run(page, workspace):
    """The page's default blocks (the tutorial's release is the one expensive command, ~20 s)."""
    workspace.run(page, slow=False)


@pytest.mark.slow  # a real Prefect server, a worker and a deployment run; a dask scheduler and workers; a kill
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.slow for b in blocks(p))])
def test_the_documented_slow_commands_run(page, tmp_path):
    Workspace(tmp_path).run(page, slow=True)


# ---- the tables are the code's ----------------------------------------------------------------------------------
def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sites_kinds_and_settings_tables_are_generated_from_the_code():
    from flows.cli.kinds import kinds_table
    from tasks.settings import table

    hook = _hook()
    kinds_page = (DOCS / "reference" / "kinds.md").read_text()
    settings_page = (DOCS / "reference" / "settings.md").read_text()
    assert "<!-- generated: kinds -->" in kinds_page and "<!-- generated: settings -->" in settings_page
    assert kinds_table() in hook.render(kinds_page) and table() in hook.render(settings_page)
    # No hand-made copy of either table anywhere in the site (a copy is what goes stale).
    for md in DOCS.rglob("*.md"):
        text = md.read_text()
        assert "| kind | data | method |" not in text and "| setting (config.toml key) |" not in text, md


def test_every_operator_variable_the_docs_name_is_a_setting():
    """A variable renamed or removed in tasks/settings.py must not live on in a page or the README."""
    from dataclasses import fields

    from tasks.settings import OperatorSettings

    known = {f.metadata["env"] for f in fields(OperatorSettings)} | {"DPRELEASE_REPO"}  # prefect.yaml's checkout
    # The benchmarks' own variables (not operator settings) count where a benchmark script still reads them.
    known |= {v for s in (ROOT / "tests" / "benchmarks").glob("*.py")
              for v in re.findall(r"[\"'](DPRELEASE_[A-Z_]*[A-Z])[\"']", s.read_text())}
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    named = {(v, p.name) for p in pages for v in re.findall(r"DPRELEASE_[A-Z_]*[A-Z]", p.read_text())}
    assert {v for v, _ in named} <= known, sorted((v, p) for v, p in named if v not in known)


def test_every_documented_cli_command_exists():
    """`dprelease WORDS ...` in a shell block of a page or the README names a real (sub)command."""
    import argparse

    from flows.cli import build_parser

    def subcommands(parser) -> dict:
        return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})

    for md in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for code in re.findall(r"```(?:bash|sh)\n(.*?)```", md.read_text(), re.S):
            for call in re.findall(r"(?:^|[\s;&|(])dprelease((?: [a-z]+)+)", code):
                parser = build_parser()
                for word in call.split():
                    choices = subcommands(parser)
                    if not choices:
                        break
                    assert word in choices, f"{md.relative_to(ROOT)}: `dprelease{call}`: no command '{word}'"
                    parser = choices[word]


def test_the_readmes_links_into_the_docs_exist():
    """The README is read on the forge, outside the site: its relative links are checked here."""
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(((?!https?://|#)[^)#]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
