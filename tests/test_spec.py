import pytest

from tasks.spec import SpecError, load_spec, parse_spec
from tests.conftest import spec_dict


def _spec(tmp_path, **changes):
    d = spec_dict(tmp_path, tmp_path / "data.csv")
    for path, value in changes.items():
        node = d
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        if value is ...:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return d


@pytest.mark.parametrize("change, message", [
    ({"release.epsilon": 0.0}, "release.epsilon"),
    ({"release.epsilon": -1.0}, "release.epsilon"),
    ({"release.epsilon": float("inf")}, "epsilon must be finite"),
    ({"release.epsilon": 1e308}, "at most 100"),
    ({"release.k": 0}, "release.k"),
    ({"release.seeding": "oversampled", "release.iterations": 1}, "needs iterations >= 2"),
    ({"release.seeding": "oversampled", "release.min_centroid_distance": 0.2}, "needs seeding: none"),
    ({"dataset.bounds": {}}, "bounds are missing"),
    ({"dataset.bounds": ...}, "bounds are missing"),
    ({"dataset.bounds": {"x": [5, 5]}}, "need lower < upper"),
    ({"dataset.bounds": {"x": [9, 1]}}, "need lower < upper"),
    ({"ledger": {"lifetime_epsilon": 1e6}}, "operator configuration, not spec fields"),
    ({"release": {"kind": "contingency", "epsilon": 1, "public_marginals": "m.csv"},
      "dataset": {"id": "c", "path": "c", "categories": {"a": ["x", "y"]}}}, "public_marginals_source"),
    ({"dataset.weight_column": "w"}, "exactly one of: the public max_weight"),
    ({"seed": 3}, "only with mode: test"),
    ({"release_id": "../escape"}, "release_id"),
    ({"release.kind": "nope"}, "release"),
    ({"release": {"kind": "contingency", "epsilon": 1}}, "contingency releases need categorical columns"),
    ({"release": {"kind": "histogram", "epsilon": 1, "bins": 100, "strategy": "tree"}},
     "must be a power of the branching factor"),
    ({"release": {"kind": "histogram", "epsilon": 1, "bins": 256, "branching": 4}}, "exactly one numeric column"),
    ({"dataset.categories": {"c": ["a", "a"]}}, "without repeats"),
    ({"unknown": 1}, "unknown"),
    ({"release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1}}, "need set-valued records"),
    ({"dataset": {"id": "c", "path": "c", "items_column": "t", "item_count": 9},
      "release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1, "clip": "dpnorm"}}, "take a numeric clip"),
    ({"dataset": {"id": "c", "path": "c", "items_column": "t", "item_count": 9},
      "release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1, "budget_shares": [0.5, 0.5, 0.5]}},
     "budget_shares"),
    ({"dataset": {"id": "c", "path": "c", "items_column": "t", "item_count": 9},
      "release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1, "q": 0}}, "release.q"),
])
def test_bad_specs_are_refused_with_the_field_named(tmp_path, change, message):
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        parse_spec(_spec(tmp_path, **change))


def test_seed_accepted_in_test_mode_and_fingerprint_tracks_parameters(tmp_path):
    a = parse_spec(_spec(tmp_path, seed=3, mode="test"))
    b = parse_spec(_spec(tmp_path, **{"release.epsilon": 0.5}))
    assert a.seed == 3 and a.fingerprint() != b.fingerprint()
    assert parse_spec(_spec(tmp_path)).fingerprint() == parse_spec(_spec(tmp_path)).fingerprint()


def test_kmeans_seeding_default_is_a_rule_of_public_parameters(tmp_path):
    from tasks.kinds.kmeans import seeded

    assert seeded(parse_spec(_spec(tmp_path, **{"release.iterations": 2})))
    assert not seeded(parse_spec(_spec(tmp_path, **{"release.iterations": 1})))
    assert not seeded(parse_spec(_spec(tmp_path, **{"release.min_centroid_distance": 0.2})))
    assert not seeded(parse_spec(_spec(tmp_path, **{"release.seeding": "none"})))


def test_load_spec_from_yaml_with_overrides(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("dataset: {id: d, path: x.csv, bounds: {a: [0, 1]}}\n"
                 "release: {kind: kmeans, k: 2, epsilon: 0.5}\n")
    spec = load_spec(f, release_id="r-1", output_dir=None)
    assert spec.release_id == "r-1" and spec.release.iterations == 5 and spec.dataset.columns == ["a"]
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("dataset: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")


def test_shipped_specs_are_valid():
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[1] / "deployments" / "specs").glob("*.yaml"))
    assert specs
    for f in specs:
        load_spec(f)


def test_test_mode_needs_the_operator_setting(tmp_path, monkeypatch):
    """A seeded run reads the real data unmetered: a spec or a UI parameter cannot ask for it on a machine
    whose operator has not allowed it."""
    monkeypatch.delenv("DPRELEASE_TEST_MODE")
    with pytest.raises(SpecError, match="mode: test is disabled on this machine"):
        parse_spec(_spec(tmp_path, mode="test", seed=3))


@pytest.mark.parametrize("items, release, k", [
    (16, {}, 4), (32, {}, 4), (48, {}, 6), (64, {}, 8), (16470, {}, 8),  # items // 8, kept in [4, 8]
    (200, {"max_items": 60}, 8),                                         # max_items no longer moves it
    (16470, {"k": 3}, 3),                                                # a spec's own k is kept
])
def test_synthetic_k_defaults_from_the_public_item_count(items, release, k):
    spec = parse_spec({"dataset": {"id": "c", "path": "c", "items_column": "t", "item_count": items},
                       "release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1, **release}})
    assert spec.release.k == k


def test_synthetic_k_default_leaves_bad_item_counts_to_validation():
    with pytest.raises(SpecError, match=r"dataset\.item_count"):
        parse_spec({"dataset": {"id": "c", "path": "c", "items_column": "t", "item_count": "many"},
                    "release": {"kind": "synthetic", "epsilon": 1, "gamma": 0.1}})
