"""Typed readings: what each wire record says, parsed once.

The run model, its statistics, the panes, the verdict and the exports read these instead of
wire dicts: past the probe's writers, a wire key is read in this package only (and in
``perfmon_analysis.summary``, which writes and reads its own payload; ``tests/unit/test_record_keys.py``
holds every other module to it), and every key written or read here is named in ``probe/wire.py``'s
schema (``tests/unit/test_wire_keys.py``). Every field is None when the probe did not report it (unknown is never
0); utilisations are 0..1. One module per family of records: ``steps`` (steps, events), ``samples``
(hello, samples, memory, comm), ``where``, ``stall``, ``profiles`` (capture, profile), ``events`` (an
exception's line, an evaluation's forwards, ``perfmon run``'s exit status), ``layout`` (a rank's place in
the job's layout, a step's operations); ``base`` holds
the value checks they share.
"""

from __future__ import annotations

from perfmon_analysis.readings.base import dropped, num, record_time
from perfmon_analysis.readings.events import ExceptionReading, JobExit, eval_forwards, exception_reading, exit_reading
from perfmon_analysis.readings.layout import LayoutReading, Op, StepOps, layout_reading, step_ops
from perfmon_analysis.readings.profiles import (
    CaptureRecord,
    ModuleTimes,
    OpTime,
    ProfileRecord,
    capture_record,
    profile_record,
    window_cpu,
)
from perfmon_analysis.readings.samples import (
    CommOp,
    CommReading,
    ComputeReading,
    CostReading,
    DeviceReading,
    GpuReading,
    GpuRow,
    HelloReading,
    HostReading,
    MemoryReading,
    RankTrace,
    SampleReading,
    comm_reading,
    cost_reading,
    device_reading,
    gpu_reading,
    gpu_readings,
    gpu_rows,
    hello_reading,
    host_reading,
    memory_reading,
    own_gpus,
    sample_reading,
)
from perfmon_analysis.readings.stall import FlightEntry, InFlight, LoaderWorker, StallReading, stall_reading
from perfmon_analysis.readings.steps import EventReading, StepBar, StepReading, event_reading, step_cpu, step_reading
from perfmon_analysis.readings.where import SPANS, WHERE_STATES, HolderCount, WhereCount, WhereInterval, where_interval

__all__ = ['num', 'record_time', 'dropped', 'StepBar', 'StepReading', 'step_reading', 'EventReading', 'event_reading',
           'step_cpu', 'GpuReading', 'GpuRow', 'HostReading', 'RankTrace', 'gpu_reading', 'gpu_readings',
           'host_reading', 'DeviceReading', 'device_reading', 'HelloReading', 'hello_reading', 'ComputeReading',
           'CostReading', 'cost_reading', 'SampleReading', 'sample_reading', 'MemoryReading', 'memory_reading',
           'CommOp', 'CommReading', 'comm_reading', 'own_gpus', 'gpu_rows', 'HolderCount', 'WhereCount',
           'WhereInterval', 'SPANS', 'WHERE_STATES', 'where_interval', 'InFlight', 'FlightEntry', 'LoaderWorker',
           'StallReading',
           'stall_reading', 'OpTime', 'CaptureRecord', 'capture_record', 'window_cpu', 'ModuleTimes', 'ProfileRecord',
           'profile_record', 'ExceptionReading', 'exception_reading', 'eval_forwards', 'JobExit', 'exit_reading',
           'Op', 'StepOps', 'step_ops', 'LayoutReading', 'layout_reading']
