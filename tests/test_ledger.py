import dp_accounting
import pytest

from dpalgos import dpkmeans
from dpalgos.plan import Mechanism, Plan
from tasks.admission import require_budget, require_public
from tasks.errors import BudgetExceeded, NoBudget, ReleaseConflict, ReleaseError
from tasks.ledger import PrivacyLedger, data_source, public_copy
from tests.ledger_races import Racers, one_budget, one_release_id, open_each

BUDGET = (1.0, 1e-6)


def _charge(ledger, release_id, eps, fingerprint="f", dataset="d", budget=BUDGET):
    """Charge a DP k-means release; the dataset's budget is registered first when it has none (an operator's)."""
    if ledger.budget(dataset) is None:
        ledger.set_budget(dataset, *budget)
    return ledger.charge(dataset_id=dataset, release_id=release_id, kind="kmeans", fingerprint=fingerprint,
                         plan=dpkmeans.plan(epsilon=eps, iterations=5))


def test_spends_compose_and_the_budget_refuses_before_noise(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    a = _charge(ledger, "r1", 0.4)
    assert a.state == "charged" and a.release.epsilon == pytest.approx(0.4) and a.release.delta == 0.0
    b = _charge(ledger, "r2", 0.6)
    # Never more than basic composition; at delta = 1e-6 the PLD accountant proves less.
    assert b.total.epsilon <= 1.0 + 1e-9
    assert b.remaining_epsilon == pytest.approx(1.0 - b.total.epsilon)
    with pytest.raises(BudgetExceeded, match="would exceed the lifetime budget"):
        _charge(ledger, "r3", 0.5)
    assert [r["release_id"] for r in ledger.releases("d")] == ["r1", "r2"]
    assert ledger.spent("d").epsilon <= 1.0 + 1e-9


def test_a_dry_run_refuses_as_the_charge_would_and_records_nothing(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    _charge(ledger, "r1", 0.6)
    kw = dict(dataset_id="d", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.3, iterations=5),
              dry_run=True)
    assert ledger.charge(release_id="r2", **kw).state == "charged"
    assert [r["release_id"] for r in ledger.releases("d")] == ["r1"]
    with pytest.raises(BudgetExceeded, match="would exceed the lifetime budget"):
        ledger.charge(release_id="r2", **{**kw, "plan": dpkmeans.plan(epsilon=0.9, iterations=5)})
    with pytest.raises(ReleaseConflict, match="already used"):
        ledger.charge(release_id="r1", **{**kw, "fingerprint": "g"})
    assert [r["release_id"] for r in ledger.releases("d")] == ["r1"]
    assert ledger.spent("d").epsilon == pytest.approx(0.6, rel=1e-2)


def test_charging_the_same_release_again_is_free(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    _charge(ledger, "r1", 0.9)
    again = _charge(ledger, "r1", 0.9)
    assert again.state == "already charged"
    assert len(ledger.releases("d")) == 1


def test_reusing_a_release_id_with_other_parameters_is_refused(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    _charge(ledger, "r1", 0.5, fingerprint="a")
    with pytest.raises(ReleaseConflict, match="different data or parameters"):
        _charge(ledger, "r1", 0.5, fingerprint="b")


def test_budgets_are_set_by_an_operator_only(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    with pytest.raises(NoBudget, match="budget set unregistered"):
        ledger.charge(dataset_id="unregistered", release_id="x", kind="kmeans", fingerprint="f",
                      plan=dpkmeans.plan(epsilon=0.5, iterations=5))
    assert ledger.releases("unregistered") == []
    _charge(ledger, "r1", 0.5)
    with pytest.raises(BudgetExceeded):
        _charge(ledger, "r2", 2.0)
    with pytest.raises(ReleaseConflict, match="raising it needs a reason"):  # an exhausted budget raised unseen
        ledger.set_budget("d", 5.0, 1e-6)
    assert ledger.budget("d") == BUDGET
    ledger.set_budget("d", 5.0, 1e-6, reason="the data owner approved 5 for 2027")
    _charge(ledger, "r2", 2.0)
    assert ledger.budget("d") == (5.0, 1e-6)
    ledger.set_budget("d", 4.0, 1e-6)  # lowering it needs none
    history = [(h["old_epsilon"], h["new_epsilon"], h["reason"]) for h in ledger.budget_history("d")]
    assert history == [(None, 1.0, None), (1.0, 5.0, "the data owner approved 5 for 2027"), (5.0, 4.0, None)]
    assert ledger.budget_history("d")[1]["spent_epsilon"] == pytest.approx(0.5, rel=0.01)
    for bad in ((float("inf"), 0.0), (0.0, 0.0), (1.0, 1.0), (float("nan"), 0.0), (1e308, 0.0), (100.5, 0.0)):
        with pytest.raises(ValueError):
            ledger.set_budget("d", *bad)


def test_status_advances(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    _charge(ledger, "r1", 0.5)
    assert ledger.status("r1") == "charged"
    ledger.mark("r1", "measured")
    assert ledger.status("r1") == "measured"
    with pytest.raises(ReleaseConflict):
        ledger.mark("nope", "measured")


def test_corrupt_ledger_is_a_clear_error(tmp_path):
    bad = tmp_path / "l.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ReleaseError, match="unusable"):
        PrivacyLedger(bad)


@pytest.fixture(scope="module")
def racers():
    pool = Racers(2)
    yield pool
    pool.close()


RACE_TRIALS = [10, pytest.param(500, marks=pytest.mark.slow)]


@pytest.mark.parametrize("trials", RACE_TRIALS)
def test_concurrent_releases_cannot_both_pass_the_budget_check(racers, ledger_location, trials):
    """Two releases race one budget that holds one of them: in every trial exactly one is charged."""
    ledger = PrivacyLedger(ledger_location)
    for t in range(trials):
        ledger.set_budget(f"b{t}", *BUDGET)
    outcomes = racers.race(one_budget, ledger_location, trials)
    wins = [o.count("won") for o in outcomes]
    print(f"\n{_backend(ledger_location)}: {racers.n} releases raced one budget in {trials} trials; one won in "
          f"{wins.count(1)}, more than one in {sum(w > 1 for w in wins)}")
    assert wins == [1] * trials
    assert all(len(ledger.releases(f"b{t}")) == 1 and ledger.spent(f"b{t}").epsilon <= 1.0 for t in range(trials))


@pytest.mark.parametrize("trials", RACE_TRIALS)
def test_two_runs_racing_one_release_id_draw_it_once(racers, ledger_location, trials):
    """Two runs of one release id (two hosts, two run folders) race its charge and its lease to draw: in every trial
    exactly one may draw, and the release is charged once."""
    ledger = PrivacyLedger(ledger_location)
    for t in range(trials):
        ledger.set_budget(f"i{t}", *BUDGET)
    outcomes = racers.race(one_release_id, ledger_location, trials)
    wins = [o.count("won") for o in outcomes]
    print(f"\n{_backend(ledger_location)}: {racers.n} runs raced one release id in {trials} trials; one drew in "
          f"{wins.count(1)}, more than one in {sum(w > 1 for w in wins)}")
    assert wins == [1] * trials
    for t, o in enumerate(outcomes):
        winner = f"/runs/host-{o.index('won')}"
        assert [(r["status"], r["attempts"], r["location"]) for r in ledger.releases(f"i{t}")] == \
            [("drawing", 1, winner)]


def test_hosts_opening_a_new_database_at_once_create_its_tables_once(racers, postgres):
    """CREATE TABLE IF NOT EXISTS is not safe against a concurrent one: the schema is made under an advisory lock."""
    trials = 5
    databases = [postgres.new_database() for _ in range(trials)]
    assert racers.race(open_each, databases, trials) == [["opened", "opened"]] * trials
    assert all(PrivacyLedger(url).budget("none") is None for url in databases)


def _backend(location: str) -> str:
    return "postgresql" if location.startswith("postgresql://") else "sqlite"


def test_gaussian_spends_compose_with_dp_accounting(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    plan = Plan((Mechanism("g", "a query", "gaussian", 1.0, "by construction", 4.0, per_step_generator=True),))
    assert plan.event() == dp_accounting.GaussianDpEvent(4.0)
    ledger.set_budget("g", 2.0, 1e-5)
    c1 = ledger.charge(dataset_id="g", release_id="g1", kind="x", fingerprint="f", plan=plan)
    c2 = ledger.charge(dataset_id="g", release_id="g2", kind="x", fingerprint="f", plan=plan)
    assert c1.release.delta == 1e-5
    # Two Gaussian releases compose sub-additively under PLD / RDP.
    assert c1.release.epsilon < c2.total.epsilon < 2 * c1.release.epsilon


def test_a_retry_after_noise_was_drawn_is_charged_again(ledger_location):
    """The redraw rule: a failed attempt that had drawn noise counts as a run of the mechanism."""
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", *BUDGET)
    first = ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True,
                          plan=dpkmeans.plan(epsilon=0.3, iterations=2))
    assert first.state == "charged"
    # the attempt failed before drawing: the retry is free
    again = ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True,
                          plan=dpkmeans.plan(epsilon=0.3, iterations=2))
    assert again.state == "already charged" and ledger.spent("d").epsilon == pytest.approx(0.3, rel=0.01)
    ledger.mark("r", "drawing")  # the next attempt drew noise, then failed before its commit
    third = ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True,
                          plan=dpkmeans.plan(epsilon=0.3, iterations=2))
    assert third.state.startswith("charged again") and ledger.spent("d").epsilon == pytest.approx(0.6, rel=0.01)
    assert ledger.releases("d")[0]["attempts"] == 2
    # ... and once committed, a resume is free again
    ledger.mark("r", "measured")
    assert ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=False,
                         plan=dpkmeans.plan(epsilon=0.3, iterations=2)).state \
        == "already charged"
    ledger.mark("r", "drawing")
    with pytest.raises(BudgetExceeded):
        for _ in range(3):
            ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True,
                          plan=dpkmeans.plan(epsilon=0.3, iterations=2))
            ledger.mark("r", "drawing")


def test_a_charged_release_whose_public_input_is_corrected_before_any_draw_is_recharged(ledger_location):
    """The charge is for the release, not the typo: before any noise, a rerun with corrected parameters replaces
    the event (against the budget); after noise, other parameters are refused."""
    ledger = PrivacyLedger(ledger_location)
    _charge(ledger, "r", 0.9, fingerprint="typo")
    fixed = ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="fixed", redraw=True,
                          plan=dpkmeans.plan(epsilon=0.5, iterations=5))
    assert fixed.state.startswith("charged (parameters corrected")
    assert [r["epsilon"] for r in ledger.releases("d")] == [pytest.approx(0.5)]
    ledger.mark("r", "drawing")
    with pytest.raises(ReleaseConflict, match="already used"):
        ledger.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="again", redraw=True,
                      plan=dpkmeans.plan(epsilon=0.5, iterations=5))


def _ch(ledger, release_id="r", eps=0.5, fingerprint="f", location="/runs/a", owner="A", redraw=True):
    return ledger.charge(dataset_id="d", release_id=release_id, kind="kmeans", fingerprint=fingerprint,
                         plan=dpkmeans.plan(epsilon=eps, iterations=5), redraw=redraw, location=location,
                         owner=owner)


def test_a_measured_release_is_never_drawn_again_when_its_folder_is_gone(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", 10.0, 1e-6)
    _ch(ledger)
    ledger.begin_draw("r", "A")
    ledger.mark("r", "measured")
    with pytest.raises(ReleaseConflict, match="measured .its noise committed. but its measurements are not"):
        _ch(ledger)  # same folder, measurements deleted (git clean, a lost disk)
    ledger.mark("r", "published")
    with pytest.raises(ReleaseConflict):
        _ch(ledger, location="/runs/b")
    assert [(r["status"], r["attempts"]) for r in ledger.releases("d")] == [("published", 1)]


def test_correcting_parameters_after_a_charged_retry_keeps_every_charge(ledger_location):
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", 10.0, 1e-6)
    _ch(ledger, eps=1.0)
    ledger.begin_draw("r", "A")            # attempt 1 drew, then crashed
    _ch(ledger, eps=1.0, owner="B")        # the retry is charged again ...
    with pytest.raises(ReleaseConflict, match="already used"):
        _ch(ledger, eps=0.01, fingerprint="g", owner="C")  # ... and cannot be swapped for a cheaper event
    assert [(r["epsilon"], r["attempts"]) for r in ledger.releases("d")] == [(pytest.approx(1.0), 2)]
    assert ledger.spent("d").epsilon > 1.5  # two eps = 1 runs composed (at the budget's delta)


def test_only_one_run_of_a_release_id_draws(ledger_location):
    """Run A is charged and still computing; run B takes the id over (same or another folder): A is refused at
    its first draw, before drawing anything; B draws. With other parameters B's event replaces A's."""
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", 10.0, 1e-6)
    _ch(ledger, eps=1.0, owner="A", location="/runs/x")
    _ch(ledger, eps=0.01, fingerprint="g", owner="B", location="/runs/y")
    with pytest.raises(ReleaseConflict, match="taken over by another run"):
        ledger.begin_draw("r", "A")
    ledger.begin_draw("r", "B")
    with pytest.raises(ReleaseConflict):   # A retries in its own folder: the id is B's, drawn in /runs/y
        _ch(ledger, eps=0.01, fingerprint="g", owner="A2", location="/runs/x")
    assert [(r["status"], r["attempts"], r["location"]) for r in ledger.releases("d")] == [
        ("drawing", 1, "/runs/y")]


def test_a_dataset_id_spends_the_budget_of_its_own_data_only(tmp_path, ledger_location):
    """The audit's attack: an exhausted dataset's data published under another id's budget."""
    ledger = PrivacyLedger(ledger_location)
    data = tmp_path / "data"
    (data / "2026-11").mkdir(parents=True)
    ledger.set_budget("d", *BUDGET, source=str(data))
    kw = dict(dataset_id="d", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.1, iterations=5))
    ledger.charge(release_id="r1", source=str(data / "2026-11" / "part.csv"), **kw)  # inside the bound folder
    for other in (tmp_path / "other.csv", tmp_path / "data-2"):
        with pytest.raises(ReleaseConflict, match="is bound to the data"):
            ledger.charge(release_id="r2", source=str(other), **kw)
        with pytest.raises(ReleaseConflict, match="is bound to the data"):
            require_budget("d", source=str(other))
    assert [r["release_id"] for r in ledger.releases("d")] == ["r1"]
    ledger.set_budget("d", 2.0, 1e-6, reason="more releases planned")  # a new budget keeps the bound source
    assert ledger.source("d") == str(data.resolve())


def test_a_budget_bound_to_no_data_is_bound_by_its_first_release_not_by_a_dry_run(tmp_path, ledger_location):
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", *BUDGET)
    kw = dict(dataset_id="d", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.1, iterations=5))
    ledger.charge(release_id="r1", source=str(tmp_path / "a.csv"), dry_run=True, **kw)
    assert ledger.source("d") is None
    ledger.charge(release_id="r1", source=str(tmp_path / "a.csv"), **kw)
    assert ledger.source("d") == str(tmp_path / "a.csv")
    with pytest.raises(ReleaseConflict):
        ledger.charge(release_id="r2", source=str(tmp_path / "b.csv"), **kw)
    assert data_source("builtin:example-sensors") == "builtin:example-sensors"


def test_a_public_input_is_one_the_operator_declared_public_and_unchanged_since(tmp_path, ledger_location):
    """The audit's attack: a dataset's own file named as its public marginals released its exact table."""
    ledger = PrivacyLedger(ledger_location)
    data, public = tmp_path / "data.csv", tmp_path / "m1.csv"
    data.write_text("a\nu\n")
    public.write_text("a,count\nu,1\n")
    ledger.set_budget("d", *BUDGET, source=str(data))
    with pytest.raises(ReleaseConflict, match="holds the data of dataset 'd'"):
        ledger.register_public(str(data), "the data itself")
    with pytest.raises(ReleaseConflict, match="was not declared public"):
        require_public([str(data)])
    with pytest.raises(ReleaseConflict, match="was not declared public"):
        require_public([str(public)])
    ledger.register_public(str(public), "census 2021")
    require_public([str(public)])
    public.write_text("a,count\nu,2\n")
    with pytest.raises(ReleaseConflict, match="changed since it was declared public"):
        require_public([str(public)])


def test_how_a_dataset_is_read_is_bound_by_its_first_release(tmp_path, ledger_location):
    """The audit's attack: a delimiter of the spec's choice turned the parser's refusals into substring queries
    on the data ("has 4 fields per line" counted a digit of the first record)."""
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", *BUDGET, source=str(tmp_path / "d.csv"))
    reading = {"format": "csv", "header": False, "delimiter": None, "user_column": None, "weight_column": None,
               "weights_count_records": False}
    kw = dict(dataset_id="d", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.1, iterations=5),
              source=str(tmp_path / "d.csv"))
    ledger.charge(release_id="r1", reading=reading, **kw)
    for change in ({"delimiter": "5"}, {"header": True}, {"weights_count_records": True}):
        with pytest.raises(ReleaseConflict, match="is read as bound to its budget"):
            ledger.charge(release_id="r2", reading={**reading, **change}, **kw)
        with pytest.raises(ReleaseConflict, match="is read as bound to its budget"):
            require_budget("d", reading={**reading, **change})
    assert ledger.charge(release_id="r2", reading=reading, **kw).state == "charged"


def test_the_operator_binds_the_reading_and_may_change_it_until_the_first_release(tmp_path, ledger_location):
    ledger = PrivacyLedger(ledger_location)
    reading = {"format": "csv", "header": True, "delimiter": ",", "user_column": None, "weight_column": None,
               "weights_count_records": False}
    ledger.set_budget("d", *BUDGET, source=str(tmp_path), reading=reading)  # a folder
    assert ledger.reading("d") == reading
    kw = dict(dataset_id="d", kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.1, iterations=5),
              source=str(tmp_path / "d.csv"))
    with pytest.raises(ReleaseConflict, match="is read as bound to its budget"):
        ledger.bind("d", str(tmp_path / "d.csv"), {**reading, "delimiter": ";"})  # a first run's check
    changed = {**reading, "header": False}
    ledger.set_budget("d", *BUDGET, reading=changed)  # no release yet: the operator may correct it
    ledger.set_budget("d", *BUDGET)  # a budget change keeps it
    assert ledger.reading("d") == changed
    ledger.charge(release_id="r1", reading=changed, **kw)
    with pytest.raises(ReleaseConflict, match="The dataset has releases"):
        ledger.set_budget("d", *BUDGET, reading=reading)
    ledger.set_budget("d", *BUDGET, reading=changed)
    assert ledger.reading("d") == changed
    exact = {**changed, "path": data_source(str(tmp_path / "d.csv"))}
    ledger.set_budget("d", *BUDGET, reading=exact)  # naming the exact path changes no privacy unit
    with pytest.raises(ReleaseConflict, match="is read as bound to its budget \\(path="):
        ledger.charge(release_id="r2", reading=changed, **{**kw, "source": str(tmp_path / "d2.csv")})
    assert ledger.charge(release_id="r2", reading=changed, **kw).state == "charged"
    ledger.set_budget("d", *BUDGET, reading={**exact, "columns": {"a": "numeric", "b": "categorical"}})
    for columns in ({"a": "categorical"}, {"c": "numeric"}):  # another parse of a column, a column not declared
        with pytest.raises(ReleaseConflict, match="whose columns are a \\(numeric\\), b \\(categorical\\)"):
            require_budget("d", source=str(tmp_path / "d.csv"), reading={**changed, "columns": columns})
    require_budget("d", source=str(tmp_path / "d.csv"), reading={**changed, "columns": {"b": "categorical"}})


def test_one_data_source_is_one_dataset_id(tmp_path, ledger_location):
    """The same records under two ids would have two budgets (the shipped Adult specs had three)."""
    ledger = PrivacyLedger(ledger_location)
    (tmp_path / "data").mkdir()
    ledger.set_budget("a", *BUDGET, source=str(tmp_path / "data"))
    for other in (tmp_path / "data", tmp_path / "data" / "part.csv", tmp_path):
        with pytest.raises(ReleaseConflict, match="is dataset 'a''s"):
            ledger.set_budget("b", *BUDGET, source=str(other))
    ledger.set_budget("c", *BUDGET)  # no source yet: its first release binds it, under the same rule
    kw = dict(kind="kmeans", fingerprint="f", plan=dpkmeans.plan(epsilon=0.1, iterations=5))
    with pytest.raises(ReleaseConflict, match="is dataset 'a''s"):
        ledger.charge(dataset_id="c", release_id="r", source=str(tmp_path / "data" / "x.csv"), **kw)
    ledger.charge(dataset_id="c", release_id="r", source=str(tmp_path / "elsewhere.csv"), **kw)


def test_a_public_input_is_read_from_a_checked_private_copy(tmp_path, ledger_location):
    """The audit's attack: the registered marginals swapped for the data mid-run, after the check at the start."""
    ledger = PrivacyLedger(ledger_location)
    public, data = tmp_path / "m1.csv", tmp_path / "data.csv"
    public.write_text("a,count\nu,1\n")
    data.write_text("a,count\nu,7\n")
    ledger.register_public(str(public), "census")
    (tmp_path / "c1").mkdir()
    assert public_copy(str(public), tmp_path / "c1", ledger).read_text() == "a,count\nu,1\n"
    public.unlink()
    public.symlink_to(data)  # swapped after its registration
    (tmp_path / "c2").mkdir()
    with pytest.raises(ReleaseConflict, match="not, or no longer, what the operator declared public"):
        public_copy(str(public), tmp_path / "c2", ledger)
    public.unlink()
    public.write_text("a,count\nu,7\n")  # or rewritten in place
    (tmp_path / "c3").mkdir()
    with pytest.raises(ReleaseConflict, match="not, or no longer, what the operator declared public"):
        public_copy(str(public), tmp_path / "c3", ledger)


def test_a_run_refused_while_reading_still_fixes_how_the_dataset_is_read(tmp_path, ledger_location):
    """The third audit probed with one delimiter after another, each refused while reading (never charged), until
    a release first succeeded: the binding is committed by the run's check, before it reads the data."""
    ledger = PrivacyLedger(ledger_location)
    ledger.set_budget("d", *BUDGET, source=str(tmp_path / "d.csv"))
    reading = {"format": "csv", "header": False, "delimiter": ";", "user_column": None, "weight_column": None,
               "weights_count_records": False}
    ledger.bind("d", str(tmp_path / "d.csv"), {**reading, "columns": {"x": "numeric"}})  # the probe's check; its
    assert ledger.reading("d") == reading and ledger.releases("d") == []  # read then fails, no charge; no columns
    with pytest.raises(ReleaseConflict, match="is read as bound to its budget"):
        ledger.bind("d", str(tmp_path / "d.csv"), {**reading, "delimiter": "|"})


def test_the_ledger_and_the_folder_it_makes_are_its_owners_only(tmp_path):
    """A review found the ledger created world-readable (0644): it names every dataset, its data and its spends."""
    path = tmp_path / "state" / "dprelease" / "ledger.sqlite"
    PrivacyLedger(path).set_budget("d", *BUDGET)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700 and (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    path.chmod(0o644)  # an older ledger, or one an operator copied
    PrivacyLedger(path)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_copy_of_a_datasets_data_under_another_path_is_refused_a_budget_of_its_own(tmp_path, ledger_location):
    """A review bound a byte-identical copy of a dataset, under another path, to a fresh budget."""
    ledger = PrivacyLedger(ledger_location)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "part-0.csv").write_text("x\n1\n2\n")
    ledger.set_budget("a", *BUDGET, source=str(tmp_path / "a"))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "part-0.csv").write_text("x\n1\n2\n")
    with pytest.raises(ReleaseConflict, match="holds the same content as dataset 'a''s"):
        ledger.set_budget("b", *BUDGET, source=str(copy))
    (tmp_path / "one.csv").write_text("x\n1\n")
    ledger.set_budget("f", *BUDGET, source=str(tmp_path / "one.csv"))
    (tmp_path / "renamed.csv").write_text("x\n1\n")  # same bytes, another name
    with pytest.raises(ReleaseConflict, match="holds the same content as dataset 'f''s"):
        ledger.set_budget("g", *BUDGET, source=str(tmp_path / "renamed.csv"))
    with pytest.raises(ReleaseConflict, match="holds the data of dataset 'f'"):
        ledger.register_public(str(tmp_path / "renamed.csv"), "a copy of the data called public")
    ledger.set_budget("h", *BUDGET)  # bound by its first release: the same rule there
    with pytest.raises(ReleaseConflict, match="holds the same content"):
        ledger.bind("h", str(tmp_path / "renamed.csv"), None)
    (copy / "part-0.csv").write_text("x\n1\n3\n")
    ledger.set_budget("b", *BUDGET, source=str(copy))  # other content: another dataset
