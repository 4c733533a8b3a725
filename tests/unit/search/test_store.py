"""The trial store's study as Optuna's own tools read it: params, distributions, importances, the recommendation.

Each test drives the real ``Search`` in-process with the fake runner of ``tests/fakes.py``
over an SQLite study in ``tmp_path``, then reads the study the way a user of Optuna would.
"""

from __future__ import annotations

import json
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner
from trainopt.contract.protocol import SCHEMA_VERSION, TrialResult
from trainopt.contract.spec import spec_from_dict
from trainopt.decide.plan import settings_hash
from trainopt.search.search import Search
from trainopt.search.store import TrialStore, param_space, param_value

SEARCH = {"amp": ["off", "bf16"], "num_workers": [0, 2], "tf32": [None, True], "batch_size": {"max": 128}}
EFFECTS = {("amp", "bf16"): 1.5, ("num_workers", 2): 1.2}


def make_spec(tmp_path, search=None, **overrides):
    return spec_from_dict(tiny_spec_dict(search=search or SEARCH, measure={"pairs": 4, "max_pairs": 8}, **overrides),
                          "t.yaml", tmp_path)


def url_of(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'trials.db'}"


def run_search(tmp_path, spec, store, seed=1) -> dict[str, Any]:
    return Search(spec, tmp_path, FakeRunner(EFFECTS, seed=seed), store).run()


@pytest.fixture
def searched(tmp_path):
    """A finished fake search whose store was given the spec's space, with its recommendation marked."""
    spec = make_spec(tmp_path)
    store = TrialStore(url_of(tmp_path), spec.name, spec.fingerprint(), space=param_space(spec))
    doc = run_search(tmp_path, spec, store)
    store.record_recommendation(doc["best"])
    store.close()
    study = optuna.load_study(study_name=spec.name, storage=url_of(tmp_path))
    return spec, doc, study


def test_the_space_covers_the_baseline_and_every_candidate_with_one_type_per_knob(tmp_path):
    spec = make_spec(tmp_path, search={"num_workers": [4, 2], "tf32": [True], "amp": ["bf16"], "batch_size": {"max": 512}},
                     baseline={"batch_size": 16, "num_workers": 1, "threads": 1})
    space = param_space(spec)
    assert space["num_workers"] == CategoricalDistribution([1, 2, 4])  # numbers stay numbers, sorted
    assert space["tf32"] == CategoricalDistribution(["null", "true"])  # the text YAML writes
    assert space["amp"] == CategoricalDistribution(["off", "bf16"])
    # Probe sizes are not known in advance: a range up to the spec's maximum holds every one.
    assert space["batch_size"] == IntDistribution(1, 512)
    assert "grad_accum" not in space and "threads" not in space  # never varied
    assert param_value(space["tf32"], None) == "null" and param_value(space["tf32"], False) is None
    assert param_value(space["num_workers"], 4) == 4 and param_value(space["num_workers"], 3) is None
    assert param_value(space["batch_size"], 296) == 296 and param_value(space["batch_size"], 513) is None


def test_grad_accum_gets_a_range_when_the_effective_batch_ties_it_to_batch_size(tmp_path):
    spec = make_spec(tmp_path, search={"batch_size": {"max": 64}}, baseline={"batch_size": 16, "grad_accum": 4, "threads": 1},
                     limits={"effective_batch": 64})
    assert param_space(spec)["grad_accum"] == IntDistribution(1, 64)


def test_every_finished_trial_carries_its_knobs_as_params_with_one_distribution_each(searched):
    spec, doc, study = searched
    space = param_space(spec)
    df = study.trials_dataframe()
    assert {f"params_{name}" for name in space} <= set(df.columns)
    finished = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    assert len(finished) == len(doc["trials"])
    for t in finished:
        settings = json.loads(t.user_attrs["result"])["settings"]
        assert set(t.params) == set(space), t.number
        assert t.distributions == space
        assert t.params["amp"] == settings["amp"] and t.params["batch_size"] == settings["batch_size"]
        assert t.params["tf32"] == {None: "null", True: "true"}[settings["tf32"]]
        # What the trial was for stays in user attributes, not in params.
        assert t.user_attrs["role"] == json.loads(t.user_attrs["meta"])["role"]
    # Every arm measured in a session names it (a candidate that cannot apply here ran in none).
    arms = [t for t in finished if t.user_attrs["role"] in ("screen", "confirm") and t.user_attrs["status"] != "not_applicable"]
    assert arms and all(t.user_attrs["session"].startswith(t.user_attrs["role"] + "/") for t in arms)
    # The probes and both values of every listed knob appear in the column.
    assert set(df["params_amp"].dropna()) == {"off", "bf16"}
    assert len(set(df["params_batch_size"].dropna())) > 2


def test_param_importances_name_the_knobs_that_changed_the_throughput(searched):
    spec, _, study = searched
    importances = optuna.importance.get_param_importances(study)
    assert importances and set(importances) <= set(param_space(spec))
    assert sum(importances.values()) == pytest.approx(1.0)


def test_the_recommendation_is_marked_on_the_study_with_the_trials_that_measured_it(searched):
    _, doc, study = searched
    attrs = study.user_attrs
    assert attrs["recommended_settings"] == doc["best"]["settings"]
    assert attrs["recommended_source"] == doc["best"]["source"]
    wanted = settings_hash(doc["best"]["settings"])
    measured = sorted(
        t.number for t in study.get_trials(states=(TrialState.COMPLETE,))
        if settings_hash(json.loads(t.user_attrs["result"])["settings"]) == wanted
    )
    assert measured and attrs["recommended_trials"] == measured
    # The kept changes are what the fake runner made faster, whatever arm Optuna calls best.
    assert doc["best"]["settings"]["amp"] == "bf16"


def test_a_resumed_study_keeps_the_space_it_was_first_given(tmp_path):
    spec = make_spec(tmp_path)
    first = TrialStore(url_of(tmp_path), spec.name, spec.fingerprint(), space=param_space(spec))
    first.close()
    other = {"amp": CategoricalDistribution(["off", "bf16", "fp16"])}
    again = TrialStore(url_of(tmp_path), spec.name, spec.fingerprint(), space=other)
    assert again.space == param_space(spec)
    run_search(tmp_path, spec, again)  # Optuna would refuse a second categorical under the same name
    again.close()


def test_a_value_outside_the_space_is_left_out_and_the_trial_stays_valid(tmp_path):
    spec = make_spec(tmp_path)
    store = TrialStore(url_of(tmp_path), spec.name, spec.fingerprint(), space=param_space(spec))
    settings = {**spec.baseline, "batch_size": 4096, "amp": "fp16"}
    handle = store.begin("odd", {"role": "probe", "knob": "batch_size", "stage": "batch"})
    store.finish(handle, "odd", {"role": "probe"}, TrialResult(status="ok", settings=settings, samples_per_s=10.0))
    (trial,) = store.study.get_trials()
    assert trial.state == TrialState.COMPLETE
    assert trial.params == {"num_workers": 0, "tf32": "null"}
    store.close()


class LegacyStore:
    """The trial store as the previous version drove it: trials with user attributes only.

    The same calls in the same order (study attributes, ``ask``, the key and meta, the
    result and status, ``tell``), with no params, no space and no per-field attributes.
    """

    def __init__(self, url: str, study_name: str, fingerprint: str):
        self.study = optuna.create_study(storage=url, study_name=study_name, direction="maximize", load_if_exists=True)
        self.study.set_user_attr("spec_fingerprint", fingerprint)
        self.study.set_user_attr("schema_version", SCHEMA_VERSION)
        self.stale = 0
        self._records: list[dict[str, Any]] = []

    def lookup(self, key: str) -> TrialResult | None:
        return None

    def begin(self, key: str, meta: dict[str, Any]) -> optuna.trial.Trial:
        trial = self.study.ask()
        trial.set_user_attr("key", key)
        trial.set_user_attr("meta", json.dumps(meta, default=str))
        return trial

    def finish(self, trial: optuna.trial.Trial, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        trial.set_user_attr("result", json.dumps(result.to_dict(), default=str))
        trial.set_user_attr("status", result.status)
        if result.ok and result.samples_per_s is not None:
            self.study.tell(trial, result.samples_per_s)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self._records.append({"number": trial.number, "key": key, **meta, "result": result})

    def records(self) -> list[dict[str, Any]]:
        return list(self._records)

    def close(self) -> None:
        pass


class StopAfter(FakeRunner):
    """Interrupted like Ctrl-C once ``sessions`` sessions have been measured."""

    def __init__(self, *args, sessions: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.left = sessions

    def run_session(self, *args, **kwargs):
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return super().run_session(*args, **kwargs)


def test_a_study_from_the_previous_version_resumes_and_its_new_trials_carry_params(tmp_path):
    spec = make_spec(tmp_path)
    legacy = LegacyStore(url_of(tmp_path), spec.name, spec.fingerprint())
    with pytest.raises(KeyboardInterrupt):
        Search(spec, tmp_path, StopAfter(EFFECTS, seed=1, sessions=6), legacy).run()
    old = legacy.study.get_trials()
    old_finished = [t for t in old if t.state == TrialState.COMPLETE or t.state == TrialState.FAIL]
    assert len(old_finished) > 10 and all(t.params == {} for t in old)
    assert any(t.state == TrialState.RUNNING for t in old)  # the session in flight when it stopped
    assert "param_space" not in legacy.study.user_attrs

    store = TrialStore(url_of(tmp_path), spec.name, spec.fingerprint(), space=param_space(spec))
    assert store.stale >= 1
    doc = run_search(tmp_path, spec, store, seed=2)
    store.record_recommendation(doc["best"])
    store.close()
    assert doc["complete"] and doc["counts"]["trials_reused"] == len(old_finished)
    assert doc["best"]["settings"]["amp"] == "bf16"

    study = optuna.load_study(study_name=spec.name, storage=url_of(tmp_path))
    assert study.user_attrs["param_space"]
    new = [t for t in study.get_trials() if t.number >= len(old) and t.state == TrialState.COMPLETE]
    assert new and all(set(t.params) == set(param_space(spec)) for t in new)
    assert all(study.trials[t.number].params == {} for t in old)
    assert {f"params_{name}" for name in param_space(spec)} <= set(study.trials_dataframe().columns)
    # The earlier trials have no params, so importances are asked of the params the new ones have.
    assert optuna.importance.get_param_importances(study, params=sorted(param_space(spec)))
    assert study.user_attrs["recommended_trials"]
