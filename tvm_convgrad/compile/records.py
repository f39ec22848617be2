"""Tuning records at build time: which MetaSchedule database a build looks its workload up in, and
the schedule a record gives.

Records are stored under the workload's PrimFunc with its ``kernel_name`` replaced by ``main``
(:func:`workload_key`), so the same gradient under another name finds them. The databases shipped
with the package live in the top-level ``schedules/`` folder (installed as the data package
``tvm_convgrad_schedules``), one per target (:func:`schedule_key`); :func:`tvm_convgrad.tune`
writes new ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import tvm
from tvm_ffi.serialization import from_json_graph_str
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from ..errors import ConvGradError
from ..dsl.compute.stages import FORMULATION
from ..isa import isa_plan
from ..schedule.base import mads
from ..schedule.cuda.intrinsics import cuda_intrinsics

__all__ = ["SHIPPED", "WORKLOAD", "database_folder", "open_database", "schedule_key", "shipped_schedules", "tuned_schedule", "workload_key"]

SHIPPED = "shipped"
"""``build(..., schedules=SHIPPED)``: the tuned records shipped for the target, if any."""


def schedule_key(target: Target) -> str:
    """The name of a target's shipped database: ``<kind>-<mcpu>-<plan>`` (``llvm-znver4-avx512``)."""
    if target.kind.name == "llvm":
        return f"llvm-{target.attrs.get('mcpu', 'generic')}-{isa_plan(target).name}"
    return f"{target.kind.name}-{target.attrs.get('arch', 'generic')}"


def shipped_schedules(target: Target) -> str | None:
    """The folder of the records shipped for ``target`` (``schedules/<schedule_key>``), or None."""
    from importlib import resources

    try:
        folder = resources.files("tvm_convgrad_schedules").joinpath(schedule_key(target))
    except ModuleNotFoundError:
        return None
    return str(folder) if folder.joinpath("database_workload.json").is_file() else None



WORKLOAD = "main"
"""The function name every record is stored under (traces name it)."""


def workload_key(func: tirx.PrimFunc) -> tvm.IRModule:
    """The module a gradient's records are stored under: the PrimFunc with its ``kernel_name``
    (the global symbol and the result stage's attribute) replaced by ``main``, so that the same
    workload under another name finds the same records, and without its mads' formulation
    attributes (a hint to the schedule rules: records made before they existed still match)."""
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else WORKLOAD
    sch = s_tir.Schedule(func)
    for block, _ in mads(sch):  # the mads' kind is the schedule rules' hint, not part of the workload
        sch.unannotate(block, FORMULATION)
    text = tvm.ir.save_json(sch.mod["main"].with_attr("global_symbol", name)).replace(json.dumps(name), json.dumps(WORKLOAD))
    return tvm.IRModule({WORKLOAD: from_json_graph_str(text)})  # (tvm.ir.load_json would first "upgrade" it, 5x the time)



_DATABASES: dict[str, ms.database.Database] = {}


def database_folder(path: str | Path) -> Path:
    """The database folder ``path`` names: ``path`` itself when it holds a MetaSchedule JSON
    database, else the kept records of a :func:`tvm_convgrad.tune` ``work_dir`` (``path/best``)."""
    path = Path(path)
    if not (path / "database_workload.json").exists() and (path / "best" / "database_workload.json").exists():
        return path / "best"
    return path


def open_database(path: str | Path, create: bool = False) -> ms.database.Database:
    """The JSON database in folder ``path``, or in the kept records of the tune ``work_dir`` ``path``
    (cached)."""
    path = Path(path) if create else database_folder(path)
    key = str(path.resolve())
    if key not in _DATABASES:
        if not create and not (path / "database_workload.json").exists():
            raise ConvGradError("build", "schedules", str(path), "must be a folder holding a MetaSchedule JSON database "
                                "(database_workload.json, database_tuning_record.json), or the work_dir of a tune() run "
                                "(its kept records are in best/)")  # fmt: skip
        path.mkdir(parents=True, exist_ok=True)
        _DATABASES[key] = ms.database.JSONDatabase(work_dir=str(path))
    return _DATABASES[key]


def tuned_schedule(func: tirx.PrimFunc, target: Target, path: str | Path) -> s_tir.Schedule | None:
    """The schedule of ``func`` from the best record of the database at ``path``, or None."""
    database = open_database(path)
    key = workload_key(func)
    if not database.has_workload(key):
        return None
    record = database.query_tuning_record(key, target, WORKLOAD)
    if record is None:
        return None
    if target.kind.name == "cuda":
        cuda_intrinsics()  # the trace tensorizes with them
    sch = s_tir.Schedule(tvm.IRModule({WORKLOAD: func}))
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch
