"""Tuning records shipped with tvm_convgrad, one MetaSchedule JSON database per target.

Installed as the data package ``tvm_convgrad_schedules``; each folder is named by
:func:`tvm_convgrad.compile.schedule_key` (``llvm-<mcpu>-<vector ISA plan>``) and holds
``database_workload.json`` and ``database_tuning_record.json``. :func:`tvm_convgrad.build` looks a
workload up in the folder of its target and falls back to the schedule rule's default.
"""
