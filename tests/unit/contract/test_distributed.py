"""The pure parts of data-parallel trials: spec block, applicability, effective batch,
the launch command, fault classification, global figures, settings and exports."""

from __future__ import annotations

import signal

import pytest
import yaml

from tests.conftest import tiny_spec_dict
from trainopt.contract import distributed
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.spec import SpecError, spec_from_dict
from trainopt.decide import batch, plan
from trainopt.execute import ddp_launch as launch
from trainopt.knobs import catalog as knobs
from trainopt.knobs import kwargs as apply
from trainopt.settings.export import render_settings
from trainopt.settings.production import TrainSettings, settings_from_dict
from trainopt.settings.record import SettingsError
from trainopt.trial.applier import Applier


def _problems(**overrides) -> list[str]:
    with pytest.raises(SpecError) as exc:
        spec_from_dict(tiny_spec_dict(**overrides))
    return exc.value.problems


# ---- spec --------------------------------------------------------------------------------


def test_distributed_block_defaults_and_world_size():
    spec = spec_from_dict(tiny_spec_dict(distributed={"nproc_per_node": 2}))
    assert spec.resolved()["distributed"] == {"nproc_per_node": 2, "backend": "auto"}
    assert spec.world_size == 2
    plain = spec_from_dict(tiny_spec_dict())
    assert plain.distributed is None and plain.world_size == 1 and plain.resolved()["distributed"] is None


@pytest.mark.parametrize(
    "block, expected",
    [
        ({"nproc_per_node": 0}, "distributed.nproc_per_node: got 0; input should be greater than or equal to 1"),
        ({"nproc_per_node": 2, "backend": "mpi"}, "distributed.backend: got 'mpi'; input should be 'auto', 'nccl' or 'gloo'"),
        ({"nproc_per_node": 2, "nnodes": 2}, "distributed.nnodes: unknown key; remove it or check its spelling"),
        ({"backend": "gloo"}, "distributed.nproc_per_node: required field is missing"),
    ],
)
def test_bad_distributed_block_names_field_value_and_allowed(block, expected):
    assert _problems(distributed=block) == [expected]


def test_effective_batch_counts_every_rank():
    problems = _problems(distributed={"nproc_per_node": 2}, limits={"effective_batch": 16})
    assert problems == [
        "baseline: batch_size 16 x grad_accum 1 x 2 ranks = 32, but limits.effective_batch is 16; batch_size 16 "
        "does not divide 8; use a batch_size that does (1, 2, 4, 8) (per rank: limits.effective_batch 16 / 2 ranks = 8)"
    ]
    fixable = _problems(distributed={"nproc_per_node": 2}, limits={"effective_batch": 64})
    assert "set baseline.grad_accum to 2" in fixable[0]
    odd = _problems(distributed={"nproc_per_node": 2}, limits={"effective_batch": 33})
    assert "use a limits.effective_batch that is a multiple of 2" in odd[0]
    grad = _problems(distributed={"nproc_per_node": 2}, limits={"effective_batch": 32}, search={"grad_accum": [1, 2]})
    assert grad[0].startswith("search.grad_accum: got [1, 2]") and "2 would give batch_size 16 x grad_accum x 2 ranks != 32" in grad[0]
    spec = spec_from_dict(tiny_spec_dict(distributed={"nproc_per_node": 2}, limits={"effective_batch": 32}))
    assert distributed.effective_batch(spec.baseline, spec.world_size) == 32


def test_ddp_knob_in_a_single_process_baseline_is_refused():
    assert _problems(baseline={"ddp_static_graph": True}) == [
        "baseline: ddp_static_graph applies to data-parallel trials only; add a 'distributed: {nproc_per_node: N}' "
        "block to the spec to measure it"
    ]


def test_ddp_knobs_are_searchable_with_checked_values():
    spec = spec_from_dict(
        tiny_spec_dict(distributed={"nproc_per_node": 2}, search={"ddp_bucket_cap_mb": [None, 1, 100], "ddp_static_graph": [True]})
    )
    assert spec.search["ddp_bucket_cap_mb"] == [None, 1, 100]
    assert _problems(search={"ddp_bucket_cap_mb": [0]}) == ["search.ddp_bucket_cap_mb[0]: 0 is too small; use an integer >= 1 or null"]


# ---- applicability -----------------------------------------------------------------------


@pytest.mark.parametrize("knob, value", [("ddp_bucket_cap_mb", 50), ("ddp_gradient_as_bucket_view", True),
                                         ("ddp_static_graph", True), ("ddp_find_unused_parameters", True),
                                         ("ddp_broadcast_buffers", False)])
def test_each_ddp_knob_needs_a_distributed_block(knob, value):
    settings = {**knobs.default_settings(), knob: value}
    reason = knobs.not_applicable_reason(settings, "cpu")
    assert reason and knob in reason and "distributed" in reason
    assert knobs.not_applicable_reason(settings, "cpu", world_size=2) is None


def test_defaults_apply_everywhere_and_static_graph_refuses_accumulation():
    assert knobs.not_applicable_reason(knobs.default_settings(), "cpu") is None
    s = {**knobs.default_settings(), "ddp_static_graph": True, "grad_accum": 2}
    assert "pytorch#143580" in knobs.not_applicable_reason(s, "cpu", world_size=2)
    assert knobs.not_applicable_reason({**s, "grad_accum": 1}, "cpu", world_size=2) is None


def test_ddp_knobs_are_in_the_catalog_in_their_own_stage():
    names = list(apply.DDP_KWARGS)
    assert [n for n, k in knobs.KNOBS.items() if k.stage == "distributed"] == names
    order = plan.knob_order({"compile": ["off"], "ddp_bucket_cap_mb": [1], "cudnn_benchmark": [True]})
    assert order == ["cudnn_benchmark", "ddp_bucket_cap_mb", "compile"]


# ---- what the knobs mean ------------------------------------------------------------------


def test_ddp_kwargs_name_every_knob_and_follow_the_buffer_rename():
    s = {**knobs.default_settings(), "ddp_bucket_cap_mb": 50, "ddp_broadcast_buffers": False}
    assert apply.ddp_kwargs(s) == {
        "bucket_cap_mb": 50,
        "gradient_as_bucket_view": False,
        "static_graph": False,
        "find_unused_parameters": False,
        "broadcast_buffers": False,
    }
    new = apply.ddp_kwargs(knobs.default_settings(), forward_sync_buffers=True)
    assert "bucket_cap_mb" not in new and new["forward_sync_buffers"] is True and "broadcast_buffers" not in new


def test_backend_auto_and_nccl_on_cpu():
    assert distributed.resolve_backend("auto", "cuda") == "nccl"
    assert distributed.resolve_backend("auto", "cpu") == "gloo"
    with pytest.raises(ValueError, match="distributed.backend: 'nccl' needs CUDA"):
        distributed.resolve_backend("nccl", "cpu")


def test_effective_batch_helpers_and_batch_candidates_per_rank():
    assert distributed.grad_accum_for(64, 8, 2) == 4
    assert distributed.grad_accum_for(64, 24, 2) is None
    # Only per-rank sizes whose batch x world divides the effective batch are candidates.
    assert batch.throughput_candidates(8, 64, 8, effective_batch=64, world_size=2) == [16, 32]
    assert batch.throughput_candidates(8, 64, 8, effective_batch=64) == [16, 32, 64]


def test_rank_threads_are_always_explicit():
    assert distributed.rank_threads(3, 2, cpu_count=16) == 3
    assert distributed.rank_threads(None, 2, cpu_count=16) == 8
    assert distributed.rank_threads(None, 4, cpu_count=2) == 1


def test_launch_command_is_torchrun_standalone_with_no_restarts(tmp_path):
    request = TrialRequest(
        spec={"distributed": {"nproc_per_node": 3, "backend": "gloo"}},
        source_dir=".",
        settings={**knobs.default_settings(), "threads": 2},
        mode="measure",
        result_path=str(tmp_path / "0001-screen-amp.result.json"),
    )
    req = tmp_path / "0001-screen-amp.request.json"
    lch = launch.DistributedLaunch.for_request(request, req, "/py")
    assert lch.command == [
        "/py", "-m", "trainopt.trial.torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=3", "--max-restarts=0",
        "-m", "trainopt.trial.ddp_rank", str(req),
    ]
    # No fixed rendezvous port: --standalone picks a free one, so concurrent trials never share it.
    assert not any("port" in a or "rdzv" in a for a in lch.command)
    assert lch.env() == {"OMP_NUM_THREADS": "2", "TRAINOPT_LAUNCH_STATUS": str(tmp_path / "0001-screen-amp.launch.json")}
    assert distributed.rank_status_path(request.result_path, 1) == tmp_path / "0001-screen-amp.rank1.json"
    assert distributed.launch_command(3) == "torchrun --standalone --nnodes=1 --nproc-per-node=3 --max-restarts=0 train.py"


def test_torchrun_wrapper_parses_exactly_torchrun_options():
    from torch.distributed.run import parse_args

    args = parse_args([*distributed.torchrun_args(2), "-m", "trainopt.trial.ddp_rank", "req.json"])
    assert (args.standalone, args.nnodes, args.nproc_per_node, args.max_restarts) == (True, "1", "2", 0)
    assert args.module and args.training_script == "trainopt.trial.ddp_rank" and args.training_script_args == ["req.json"]


# ---- classification ----------------------------------------------------------------------

TERM = -int(signal.SIGTERM)


@pytest.mark.parametrize(
    "statuses, failures, expected",
    [
        # A rank killed by a signal, its peer torn down by torchrun.
        ({0: {"state": "started"}, 1: {"state": "started"}}, {1: -11, 0: TERM}, ("crashed", "rank 1 of 2 was killed by SIGSEGV")),
        # A bare exit code without a report.
        ({0: {"state": "started"}, 1: {"state": "started"}}, {1: 3}, ("crashed", "rank 1 of 2 exited with code 3 without reporting an error")),
        # A crash wins over the peer's consequential error report.
        ({0: {"state": "failed", "status": "error", "error": "Connection closed by peer", "time": 1.0}, 1: {"state": "started"}},
         {0: 1, 1: -9}, ("crashed", "rank 1 of 2 was killed by SIGKILL")),
        # The first report names the fault; the peer's later connection error does not.
        ({0: {"state": "failed", "status": "error", "error": "Connection closed by peer", "time": 2.0},
          1: {"state": "failed", "status": "oom", "error": "out of memory", "time": 1.0}},
         {0: 1, 1: 1}, ("oom", "rank 1 of 2: out of memory")),
        ({0: {"state": "started"}, 1: {"state": "failed", "status": "error", "error": "ValueError: bad", "time": 1.0}},
         {1: 1, 0: TERM}, ("error", "rank 1 of 2: ValueError: bad")),
        ({0: {"state": "failed", "status": "nonfinite", "error": "loss nan", "time": 1.0}}, {0: 1}, ("nonfinite", "rank 0 of 2: loss nan")),
    ],
)
def test_classify_names_the_failing_rank(statuses, failures, expected):
    assert launch.classify(2, statuses, failures, 1) == expected


def test_classify_a_launcher_that_failed_by_itself():
    status, message = launch.classify(2, {}, {}, 1)
    assert status == "crashed" and "ranks 0, 1 did not finish" in message
    assert launch.classify(2, {}, {}, -9) == ("crashed", "the launcher was killed by SIGKILL")


# ---- global figures ----------------------------------------------------------------------


def test_combine_ranks_uses_the_slowest_clock_per_window():
    per_rank = [
        {"rank": 0, "window_times": [1.0, 1.0, 1.0, 1.0], "window_waits": [0.1] * 4, "peak_memory_bytes": 100},
        {"rank": 1, "window_times": [1.0, 2.0, 1.0, 1.0], "window_waits": [0.2] * 4, "peak_memory_bytes": 300},
    ]
    g = distributed.combine_ranks(per_rank, window_steps=10, samples_per_step=4)
    assert g["windows"] == [80.0, 40.0, 80.0, 80.0]
    kept = range(g["steady_from"], 4)
    assert g["samples_per_s"] == pytest.approx(2 * 40 * len(kept) / sum([1.0, 2.0, 1.0, 1.0][i] for i in kept))
    assert g["peak_memory_bytes"] == 300
    assert [r["rank"] for r in g["per_rank"]] == [0, 1]
    assert g["per_rank"][0]["samples_per_s"] >= g["per_rank"][1]["samples_per_s"]
    assert g["data_wait_fraction"] == pytest.approx((g["per_rank"][0]["data_wait_fraction"] + g["per_rank"][1]["data_wait_fraction"]) / 2)


# ---- settings and exports ----------------------------------------------------------------


def _ddp_settings(**settings) -> TrainSettings:
    doc = {"kind": "trainopt-settings", "device": "auto", "settings": {"batch_size": 32, "grad_accum": 2, **settings},
           "distributed": {"nproc_per_node": 2}}
    return settings_from_dict(doc, source="best.yaml")


def test_settings_carry_the_distributed_block():
    s = _ddp_settings(ddp_bucket_cap_mb=50)
    assert s.distributed == {"nproc_per_node": 2, "backend": "auto"}
    assert s.launch_command("train.py") == distributed.launch_command(2)
    assert s.sampler_kwargs(seed=3) == {"shuffle": True, "drop_last": True, "seed": 3}
    assert TrainSettings().launch_command() is None


@pytest.mark.parametrize(
    "doc, problem",
    [
        ({"settings": {"ddp_static_graph": True}}, "settings: ddp_static_graph applies to data-parallel trials only"),
        ({"settings": {}, "distributed": {"nproc_per_node": 0}}, "distributed.nproc_per_node: got 0; use an integer >= 1"),
        ({"settings": {}, "distributed": {"nproc_per_node": 2, "backend": "mpi"}}, "distributed.backend: got 'mpi'; use one of auto, nccl, gloo"),
        ({"settings": {}, "distributed": {"nproc_per_node": 2, "nprocs": 2}}, "distributed.nprocs: unknown key"),
        ({"settings": {"ddp_static_graph": True, "grad_accum": 2}, "distributed": {"nproc_per_node": 2}}, "pytorch#143580"),
    ],
)
def test_bad_distributed_settings_are_named(doc, problem):
    with pytest.raises(SettingsError) as exc:
        settings_from_dict({"kind": "trainopt-settings", **doc})
    assert any(problem in p for p in exc.value.problems), exc.value.problems


def test_no_sync_only_on_accumulation_steps():
    class Model:
        def no_sync(self):
            return "no_sync"

    s = _ddp_settings(batch_size=32, grad_accum=3)
    s.applier.ddp_model = Model()  # as wrap_ddp leaves it
    assert [s.no_sync(step) == "no_sync" for step in range(6)] == [True, True, False, True, True, False]
    # Counted by the applier when no step is given: it follows backward_and_step's micro-steps.
    s.applier.micro_steps = 4
    assert s.no_sync() == "no_sync"
    assert TrainSettings(settings={"grad_accum": 3}).no_sync(0).__class__.__name__ == "nullcontext"


@pytest.mark.parametrize("fmt", ["torch", "lightning", "hf", "yaml"])
def test_exports_say_how_to_launch_and_name_every_ddp_knob(fmt):
    s = _ddp_settings(ddp_bucket_cap_mb=50, ddp_gradient_as_bucket_view=True, ddp_find_unused_parameters=True)
    text = render_settings(s, fmt)
    assert distributed.launch_command(2) in text
    for knob in apply.DDP_KWARGS:
        assert knob in text, f"{knob} missing from {fmt}"
    if fmt == "torch":
        compile(text, "export.py", "exec")
        assert "bucket_cap_mb=50," in text and "DistributedSampler(dataset, shuffle=True, drop_last=True, seed=0)" in text
        assert "model.no_sync()" in text and "dist.init_process_group(" in text
        # The group is destroyed last, after DDP's reducer is collected.
        end = text.rstrip().splitlines()[-3:]
        assert end == ["del model, optimizer", "gc.collect()", "dist.destroy_process_group()"]
    elif fmt == "lightning":
        compile(text, "export.py", "exec")
        assert "strategy=DDPStrategy(" in text and "devices=2," in text and "find_unused_parameters=True," in text
    elif fmt == "hf":
        compile(text, "export.py", "exec")
        assert "ddp_bucket_cap_mb=50," in text and "ddp_find_unused_parameters=True," in text
        # TrainingArguments has no field for these: listed as a comment, not dropped.
        assert "# ddp_gradient_as_bucket_view: true" in text
    else:
        doc = yaml.safe_load(text)
        assert doc["distributed"] == {"nproc_per_node": 2, "backend": "auto"}
        assert settings_from_dict(doc).distributed == s.distributed


def test_single_process_exports_list_the_ddp_knobs_as_unused():
    text = render_settings(TrainSettings(device="cpu"), "torch")
    assert "measured as one process (no distributed block)" in text and "DistributedDataParallel" not in text


# ---- the applier under a real (one-process) process group ---------------------------------


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_applier_wraps_with_every_knob_and_skips_sync_on_accumulation_steps(one_process_group):
    import torch

    settings = {**knobs.default_settings(), "grad_accum": 2, "ddp_bucket_cap_mb": 7, "ddp_gradient_as_bucket_view": True,
                "ddp_find_unused_parameters": True, "ddp_broadcast_buffers": False}
    a = Applier(settings, torch.device("cpu"), data_parallel=True)
    forward = a.prepare_model(torch.nn.Linear(4, 2))
    ddp = a.ddp_model
    assert forward is ddp and isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert ddp.bucket_bytes_cap == 7 * 1024 * 1024
    assert ddp.gradient_as_bucket_view and ddp.find_unused_parameters and not ddp.static_graph
    assert getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None)) is False
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen = []
    for _ in range(4):
        with a.no_sync():
            seen.append(ddp.require_backward_grad_sync)
            a.backward_and_step(ddp(torch.randn(3, 4)).sum(), optimizer)
    assert seen == [False, True, False, True]
    assert a.optimizer_steps == 2
    sampler = a.sampler(list(range(10)), seed=5)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.drop_last, sampler.seed) == (1, 0, True, True, 5)


def test_single_process_applier_does_not_wrap():
    import torch

    a = Applier({**knobs.default_settings(), "grad_accum": 2}, torch.device("cpu"))
    model = a.prepare_model(torch.nn.Linear(4, 2))
    assert a.ddp_model is None and not isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert a.no_sync().__class__.__name__ == "nullcontext"
