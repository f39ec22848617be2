"""tune(): MetaSchedule over the schedule rules' space, locally and over a TVM RPC tracker; the
kept records and build(schedules=...). Timings are never asserted (only that both were measured)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import slow, stop_process_tree
import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_convgrad import ConvGradError, build, dsl, layout, tune
from runners import TimedByPosition
from tvm_convgrad.compile import Workload, open_database, resolve_target, workload_key
from tvm_convgrad.isa import host_can_run
from tvm_convgrad.tuning import runner_from
from tvm_convgrad.tuning.runners import release
from tvm_convgrad.tvm import placeholder
from tvm_convgrad.tools.verify import check_kernel


def _dw(name: str, size: int = 8):
    x = placeholder(layout.shape_5hd(1, 16, size, size), name="input_x", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 16, size, size), name="out_backprop", dtype="float16")
    return dsl.conv2d_backprop_filter(x, dy, [16, 16, 3, 3], {"strides": [1, 1], "padding": [1, 1, 1, 1], "kernel_name": name})


def _dx(name: str):
    w = placeholder(layout.shape_fracz((32, 32, 3, 3)), name="filters", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 32, 14, 14), name="out_backprop", dtype="float16")
    para = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "kernel_name": name}
    return dsl.conv2d_backprop_input(w, dy, [32, 32, 3, 3], [1, 32, 14, 14], para)


@slow
def test_tune_locally_writes_the_trials_and_a_report(tmp_path, capsys):
    report = tune(_dx("tune_local_dx"), trials=4, work_dir=tmp_path / "run", seed=1, progress=False)
    assert report.trials >= 1 and not report.failures
    # XGBoost (trained on the measured trials) wherever the test extra installed it, and said so
    assert report.cost_model == ("xgb" if importlib.util.find_spec("xgboost") else "random")
    assert f"cost model {report.cost_model}" in capsys.readouterr().out
    assert report.default_ms > 0 and report.best_ms > 0
    assert len(report.curve_ms) == report.trials and report.curve_ms == sorted(report.curve_ms, reverse=True)
    trials = ms.database.JSONDatabase(work_dir=str(tmp_path / "run" / "trials"))
    assert len(trials.get_all_tuning_records()) >= report.trials
    kernel = build(_dx("tune_local_dx"), schedules=report.database)
    assert kernel.schedule == ("tuned:best" if report.kept else "default")
    assert build(_dx("tune_local_dx"), schedules=tmp_path / "run").schedule == kernel.schedule  # the work_dir given to tune()
    from tvm_convgrad.tuning import KEEP_MARGIN

    assert report.kept == (report.best_ms < report.default_ms * (1 - KEEP_MARGIN))
    assert check_kernel(kernel).ok
    assert "trials" in str(report) and "default" in str(report)


@slow
def test_the_default_schedule_is_never_kept_as_a_record(tmp_path):
    """A one-row first layer's dX (3 channels: pixel lanes, its only sample the rows per tile, of
    a single row) has one candidate on every ISA, the default: whatever the timing noise says, no
    record is written for it. (With 12 rows an AVX-512 plan samples 1-6 rows per tile, and a
    candidate other than the default may time best.)"""
    w = placeholder(layout.shape_fracz((16, 3, 1, 3)), name="filters", dtype="float16")
    dy = placeholder(layout.shape_5hd(1, 16, 1, 12), name="out_backprop", dtype="float16")
    para = {"strides": [1, 1], "padding": [0, 0, 1, 1], "dilations": [1, 1, 1, 1], "kernel_name": "tune_only_default"}
    report = tune(dsl.conv2d_backprop_input(w, dy, [16, 3, 1, 3], [1, 3, 1, 12], para), trials=2, work_dir=tmp_path, progress=False)
    assert not report.kept and report.best_ms == report.default_ms and report.speedup == 1.0
    assert not ms.database.JSONDatabase(work_dir=str(tmp_path / "best")).get_all_tuning_records()


@slow
def test_a_kept_record_is_used_by_build_under_any_kernel_name(tmp_path):
    """The record of the best trial, committed as tune() keeps one: build() applies it, for the
    same workload under another kernel_name too, and the result is still exact."""
    report = tune(_dw("tune_keep_a"), trials=2, work_dir=tmp_path / "run", seed=2, progress=False)
    trials = ms.database.JSONDatabase(work_dir=str(tmp_path / "run" / "trials"))
    best = min((r for r in trials.get_all_tuning_records() if r.run_secs), key=lambda r: float(r.run_secs[0]))
    kept = open_database(tmp_path / "kept", create=True)
    func = Workload.of(_dw("tune_keep_a")).prim_func(resolve_target("llvm"))
    kept.commit_tuning_record(ms.database.TuningRecord(best.trace, kept.commit_workload(workload_key(func)), best.run_secs))
    for name in ("tune_keep_a", "tune_keep_b"):
        kernel = build(_dw(name), schedules=tmp_path / "kept")
        assert kernel.schedule == "tuned:kept" and "tuned:kept" in repr(kernel)
        assert check_kernel(kernel).ok
    assert build(_dw("tune_keep_a", size=9), schedules=tmp_path / "kept").schedule == "default"  # another workload
    assert build(_dw("tune_keep_a"), schedules=None).schedule == "default"
    assert report.database == str(tmp_path / "run" / "best")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rpc_tracker():
    """A TVM RPC tracker and two device servers on localhost, started as a user would; ended with
    the processes they started (each serves from a worker process of its own), also when the test
    fails or is interrupted."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
    try:
        time.sleep(2)
        for i in range(2):
            server_port = _free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(server_port), "--port-end", str(server_port + 1),
                 "--tracker", f"127.0.0.1:{port}", "--key", "convgrad-test"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TVM_NUM_THREADS": "2"},
            ))  # fmt: skip
        from tvm import rpc

        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                summary = rpc.connect_tracker("127.0.0.1", port).summary()
                if summary["queue_info"].get("convgrad-test", {}).get("free", 0) == 2:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(1)
        else:
            pytest.fail("the RPC tracker did not see two servers within 60 s")
        yield port
    finally:
        for proc in reversed(procs):
            stop_process_tree(proc.pid)
            proc.wait(timeout=10)


@slow
def test_tune_over_an_rpc_tracker(rpc_tracker, tmp_path):
    report = tune(_dw("tune_rpc_dw"), trials=2, work_dir=tmp_path / "rpc", runner=f"rpc://127.0.0.1:{rpc_tracker}/convgrad-test",
                  seed=3, progress=False)  # fmt: skip
    assert report.runner.startswith("rpc://") and report.trials >= 1 and not report.failures
    records = ms.database.JSONDatabase(work_dir=str(tmp_path / "rpc" / "trials")).get_all_tuning_records()
    assert records and all(r.run_secs and float(r.run_secs[0]) > 0 for r in records)
    assert report.default_ms > 0 and report.best_ms > 0


VNNI_CPUS = ["znver4", "cascadelake", "sapphirerapids"]


@pytest.mark.parametrize("mcpu", VNNI_CPUS)
def test_the_tuning_space_initializes_on_cpus_with_vnni(mcpu):
    """Where tuning failed on every CPU with AVX-512 VNNI (``TensorIntrin 'dot_16x4_vnni' is not
    registered``): MetaSchedule's ``TuneContext`` built the x86 default rules, which ask for the VNNI
    intrinsic, for the rules' space. The space names its mutators, so none is built; any host."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_convgrad.schedule import rule_for
    from tvm_convgrad.tuning.space import design_space, tensor_intrinsics_quickly

    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 2})
    assert "avx512vnni" in tvm.target.codegen.llvm_get_cpu_features(target)
    mod = tvm.IRModule({"main": Workload.of(_dw(f"space_vnni_{mcpu}")).prim_func(target, "main")})
    with tensor_intrinsics_quickly(target):
        context = ms.TuneContext(mod=mod, target=target, space_generator=design_space(rule_for(target), target, []), task_name="main")
    (space,) = context.generate_design_space()
    assert "sample_perfect_tile" in str(space.trace)


@pytest.mark.slow
@pytest.mark.parametrize("mcpu", VNNI_CPUS[:1])
def test_tune_on_cpus_with_vnni(mcpu, tmp_path):
    """A whole tuning run for an x86 target with AVX-512 VNNI, whatever the host: the candidates are
    compiled for the target; a runner that times by position stands in for the machine that would
    run them."""
    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 2}
    report = tune(_dw(f"tune_vnni_{mcpu}"), target=target, trials=4, work_dir=tmp_path, runner=TimedByPosition(), seed=4, progress=False)
    assert report.trials >= 1 and not report.failures, report.failures
    assert mcpu in report.target


def _workers() -> list:
    return [p for p in psutil.Process().children(recursive=True) if "popen_worker" in " ".join(p.cmdline())]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, pytest.param(RuntimeError, marks=slow)])
def test_tune_ends_its_worker_processes_on_ctrl_c_and_on_errors(tmp_path, monkeypatch, interruption):
    """The runner's workers (started before the search: the default is timed first) end with tune(),
    whatever ends it."""
    seen = []

    def interrupted(*args, **kwargs):
        seen.extend(_workers())
        raise interruption("stopped")

    monkeypatch.setattr(ms, "tune_tir", interrupted)  # what tune() calls the search through
    try:
        tune(_dw("tune_interrupted"), trials=2, work_dir=tmp_path, progress=False)
    except interruption:  # checked while the exception (and tune's frame in its traceback) is alive
        assert seen, "the runner had started no worker before the search"
        alive = [p.pid for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"tune() left its workers {alive} running"
    else:
        pytest.fail("tune() did not raise")


def test_tune_and_build_reject_bad_arguments(tmp_path):
    with pytest.raises(ConvGradError, match="runner"):
        runner_from("tcp://host:1/key")
    with pytest.raises(ConvGradError, match="trials"):
        tune(_dw("tune_bad"), trials=0, work_dir=tmp_path)
    with pytest.raises(ConvGradError, match="target = 'opencl': must be an llvm or a cuda target"):
        tune(_dw("tune_bad"), target={"kind": "opencl"}, trials=1, work_dir=tmp_path)
    if not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
        with pytest.raises(ConvGradError, match="runner = 'local': needs a CUDA GPU on this machine"):
            tune(_dw("tune_bad"), target="cuda", trials=1, work_dir=tmp_path)
    with pytest.raises(ConvGradError, match="schedules.*or the work_dir of a tune"):
        build(_dw("tune_bad"), schedules=tmp_path / "no-database-here")
    foreign = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}
    if not host_can_run(tvm.target.Target(foreign)):  # code this host cannot run is timed over RPC
        with pytest.raises(ConvGradError, match="runner = 'local': cannot time llvm-neoverse-n1-neon code on this machine"):
            tune(_dw("tune_bad"), target=foreign, trials=1, work_dir=tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_tune_command_rejects_an_empty_selection(tmp_path, capsys):
    from tvm_convgrad.cli import main

    assert main(["tune", "--filter", "no-such-layer", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "no benchmark case matches" in capsys.readouterr().err
    if not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):  # CUDA with nowhere to measure: stops at once, no traceback
        assert main(["tune", "--target", "cuda", "--suite", "all", "--out", str(tmp_path), "--no-progress"]) == 2
        assert "runner = 'local': needs a CUDA GPU on this machine" in capsys.readouterr().err


@slow
def test_tune_command_goes_on_after_a_kernel_fails(tmp_path, capsys, monkeypatch):
    """A long run is not lost to one kernel: the failure is named, the others tuned, the exit
    status says something failed."""
    import json

    from tvm_convgrad.cli import main
    from tvm_convgrad import tuning
    from tvm_convgrad.tuning import TuneReport

    module = tuning
    calls = []

    def fake_tune(outputs, target, trials, work_dir, runner, database, progress):
        calls.append(work_dir.name)
        if len(calls) == 1:
            raise RuntimeError("parallel_for_dynamic error with Check failed: (7 vs. 6)")
        return TuneReport(work_dir.name, "llvm", runner, "random", trials, 2.0, 1.0, True, str(database), str(work_dir), 1.0)

    monkeypatch.setattr(module, "tune", fake_tune)
    args = ["tune", "--suite", "all", "--filter", r"dw144_s1", "--batch", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert calls == ["mobilenet_v2.dw144_s1.n1.filter", "mobilenet_v2.dw144_s1.n1.input"]
    assert "mobilenet_v2.dw144_s1.n1 filter" in err and "(7 vs. 6)" in err
    assert [r["name"] for r in json.loads((tmp_path / "tune.json").read_text())] == ["mobilenet_v2.dw144_s1.n1.input"]


@slow
def test_local_runner_times_on_every_core():
    """The local runner's workers start TVM's thread pool on every core, as the package's own
    processes do (TVM's default, half the cores, would time a 2-core kernel on one)."""
    from tvm_convgrad import usable_cores
    from tvm_convgrad.tuning.runners import use_every_core

    runner = runner_from("local")
    try:
        assert runner.pool._initializer is use_every_core
    finally:
        release(runner)
    code = "import os; from tvm_convgrad.tuning.runners import use_every_core; use_every_core(); print(os.environ['TVM_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout.split()
    assert out == [str(usable_cores())]


SHIPPED = sorted(p for p in (Path(__file__).parent.parent / "schedules").iterdir() if (p / "database_workload.json").is_file())


@slow
@pytest.mark.skipif(not SHIPPED, reason="no tuning records are shipped yet")
@pytest.mark.parametrize("folder", SHIPPED or [None], ids=[p.name for p in SHIPPED] or ["none"])
def test_shipped_records_build_exact_kernels(folder):
    """Every bench kernel with a record in a shipped database builds from it (for that database's
    target, wherever this host can run its ISA) and matches the float64 reference; and every record
    is one such kernel's (a change to a compute that alters its PrimFunc leaves the record stale:
    the kernel would build with the rule's default, silently)."""
    from tvm.target import Target

    from tvm_convgrad.compile import schedule_key
    from tvm_convgrad.tools import bench
    from tvm_convgrad.isa import host_can_run, x86_triple

    kind, mcpu, isa = folder.name.split("-")
    target = Target({"kind": kind, "mtriple": x86_triple(), "mcpu": mcpu, "num-cores": 2})
    assert schedule_key(target) == folder.name
    if not host_can_run(target):
        pytest.skip(f"this host cannot run {isa} code")
    tuned = 0
    for case in bench.load_cases("all", (1, 8)):
        for op in ("filter", "input"):
            kernel = build(bench.tbe_result(case, op), target=target, schedules=folder)
            if kernel.schedule != "default":
                tuned += 1
                assert check_kernel(kernel).ok, f"{case.name} {op}"
    assert tuned == len(open_database(folder).get_all_tuning_records()), "a shipped record no longer matches its workload's PrimFunc"


@slow
@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_every_bench_case_tunable_trace_replays_with_any_decisions(mcpu):
    """MetaSchedule's search replays the design space's trace with fresh decisions: every
    instruction must give the same outputs whatever the samples (a ``get_loops`` after a
    ``compute_at`` whose loops depend on a sampled chunk did not, and the search stopped)."""
    from tvm import s_tir

    from tvm_convgrad.tools import bench
    from tvm_convgrad.schedule import rule_for

    target = resolve_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 2})
    for case in bench.load_cases("all", (1, 8)):
        for op in ("filter", "input"):
            func = Workload.of(bench.tbe_result(case, op)).prim_func(target, "main")
            sch = s_tir.Schedule(func)
            rule_for(target).schedule(sch, target, tunable=True)
            free = s_tir.Trace(sch.trace.insts, {})
            for seed in range(1, 5):
                free.apply_to_schedule(s_tir.Schedule(func, seed=seed), remove_postproc=False)
