"""Where the steps go, probe side: the training thread's CPU time in step records, and
the ``where`` sampler's attribution of step time to the user's lines, with real threads."""

from __future__ import annotations

import os
import sysconfig
import threading
import time
import types

import probe
from probe import fetches, records, where, wire
from tests.integration.streamutil import connect, read_until, step_seen, wait_for


class FakeProbe:
    """The part of ``Probe`` the sampler reads: the training thread, inside a step unless told otherwise
    (``steps``: steps ended so far; between steps once one has)."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.in_step = True
        self.steps = 0
        self.ended = 0.0          # perf_counter of the last step's end
        self.errors: list = []

    def progress(self):
        return self.steps, self.ended, self.in_step, self.thread_id, None

    def report_error(self, where_, exc):
        self.errors.append((where_, exc))


def sleeper(stop: threading.Event) -> None:
    # a long sleep: off CPU through every look. A short one wakes between looks, and on a loaded
    # machine waits for a core on waking, which the sampler rightly counts as busy
    while not stop.is_set():
        time.sleep(0.5)                                                    # SLEEP_LINE


def spinner(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1                                                             # SPIN_LINE


def event_waiter(stop: threading.Event) -> None:
    while not stop.is_set():
        stop.wait(0.005)                                                   # EVENT_LINE


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker) and "def " not in text)


def _sample(target, looks: int = 30) -> dict:
    """Run ``target`` in a real thread, look ``looks`` times, return the interval's record."""
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), daemon=True)
    thread.start()
    out: list = []
    fake = FakeProbe(thread.ident)
    sampler = where.WhereSampler(fake, out.append, hz=19.0)
    try:
        for _ in range(looks):
            sampler.tick()
            time.sleep(0.003)
    finally:
        stop.set()
        thread.join()
    record = sampler.flush()
    assert fake.errors == []
    assert out == [record]
    return record


def test_a_sleeping_thread_is_waiting_at_its_sleep_line_and_a_spinning_one_busy_at_its_loop():
    slept = _sample(sleeper)
    assert slept["samples"] == 30 and slept["hz"] == 19.0 and slept["t0"] <= slept["t1"]
    top = slept["lines"][0]
    assert (top["file"], top["line"], top["function"], top["state"]) == (__file__, _line_of("# SLEEP_LINE"),
                                                                        "sleeper", "waiting")
    assert top["call"] == "time.sleep(0.5)                                                    # SLEEP_LINE"[:80]
    assert "lib" not in top                 # time.sleep is C: the user's line is the innermost frame
    assert top["n"] >= 24                   # the rest: the loop's other line
    spun = _sample(spinner)
    busy = sum(line["n"] for line in spun["lines"] if line["function"] == "spinner" and line["state"] == "busy")
    assert busy >= 0.8 * spun["samples"]
    assert spun["lines"][0]["line"] in (_line_of("# SPIN_LINE"), _line_of("# SPIN_LINE") - 1)


def test_library_frames_fold_under_the_users_line_and_name_the_innermost_library_call():
    got = _sample(event_waiter)
    top = got["lines"][0]
    assert (top["line"], top["function"], top["state"]) == (_line_of("# EVENT_LINE"), "event_waiter", "waiting")
    # Event.wait -> Condition.wait (threading.py, stdlib): folded under the user's line
    assert top["lib"] == "threading.Condition.wait"
    assert top["call"].startswith("stop.wait(0.005)")


def test_places_tell_the_users_files_from_the_stdlib_installed_packages_and_perfmon():
    places = where.Places()
    assert places.is_user(__file__)
    assert not places.is_user(threading.__file__)
    assert not places.is_user(os.path.join(sysconfig.get_paths()["purelib"], "torch", "nn", "modules", "linear.py"))
    assert not places.is_user("/opt/x/lib/python3.11/dist-packages/numpy/core/fromnumeric.py")
    assert not places.is_user(where.__file__) and not places.is_user(records.__file__)
    assert not places.is_user("<frozen importlib._bootstrap>")
    assert places.is_user("<string>") and places.is_user("/home/me/train.py")


def _frame(filename: str, line: int, function: str, back=None, module: str = "user"):
    return types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=filename, co_name=function,
                                                              co_qualname=function),
                                 f_lineno=line, f_back=back, f_globals={"__name__": module})


def test_a_record_lists_the_twenty_largest_lines_and_the_rest_as_other():
    places = where.Places(roots=("/lib/",))
    tally = where.Tally(0.0)
    for i in range(30):                       # line i sampled i + 1 times
        for _ in range(i + 1):
            tally.add(_frame("/u/train.py", 100 + i, "step"), "busy", places)
    rec = tally.record(1.0, 19.0)
    assert rec["samples"] == sum(range(1, 31))
    assert [line["line"] for line in rec["lines"]] == [129 - i for i in range(20)]
    assert rec["other"] == sum(range(1, 11))           # lines 100..109: 1 + ... + 10 samples
    assert rec["other"] + sum(line["n"] for line in rec["lines"]) == rec["samples"]
    wire.validate(rec)


def test_the_most_frequent_library_call_of_a_line_is_named_and_the_keys_are_bounded():
    places = where.Places(roots=("/lib/",))
    tally = where.Tally(0.0)
    user = _frame("/u/train.py", 21, "fetch_from_service")
    for _ in range(5):
        tally.add(_frame("/lib/requests/api.py", 9, "get", user, module="requests.api"), "waiting", places)
    tally.add(_frame("/lib/json/decoder.py", 3, "decode", user, module="json.decoder"), "waiting", places)
    tally.add(_frame("/lib/x.py", 1, "f", _frame("/lib/y.py", 2, "g")), None, places)   # no user frame at all
    rec = tally.record(1.0, 19.0)
    first, second = rec["lines"]
    assert (first["file"], first["line"], first["n"], first["lib"], first["state"]) == \
        ("/u/train.py", 21, 6, "requests.api.get", "waiting")
    assert (second["file"], second["line"], "lib" in second, "state" in second) == ("/lib/x.py", 1, False, False)
    bounded = where.Tally(0.0)
    for i in range(where.MAX_KEYS + 10):
        bounded.add(_frame("/u/train.py", i, "step"), "busy", places)
    assert len(bounded.lines) == where.MAX_KEYS and bounded.other == 10 and bounded.samples == where.MAX_KEYS + 10


def spin_forever(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += sum(i for i in range(3))                                      # HOG_LINE


def gil_waiter(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.0001)     # each wake-up needs the GIL back: with a Python hog beside, it waits for it


def fetching(stop: threading.Event) -> None:
    """A batch fetch through the DataLoader wrapper whose innermost user frame is the dataset's own code."""
    fetches._wrap_next(lambda it: sleeper(stop))(None)


def _threads(*targets, names=()) -> tuple[threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    threads = [threading.Thread(target=t, args=(stop,), daemon=True, name=n) for t, n in
               zip(targets, list(names) + [None] * len(targets))]
    for t in threads:
        t.start()
    return stop, threads


def test_between_steps_samples_are_sent_once_the_next_step_begins_and_none_after_the_last_step():
    stop, (thread,) = _threads(sleeper)
    out: list = []
    fake = FakeProbe(thread.ident)
    fake.in_step, fake.steps = False, 1          # after the first step's end
    sampler = where.WhereSampler(fake, out.append, hz=19.0)
    try:
        for _ in range(10):
            sampler.tick()
        assert sampler.flush() is None          # the gap has not ended: it may be the script's end
        fake.steps = 2                           # the next step began and ended
        for _ in range(2):
            sampler.tick()
        record = sampler.flush()
        assert record["samples"] == 0 and record["lines"] == []
        assert record["between_samples"] >= 10 and record["between_other"] == 0
        top = record["between"][0]
        assert (top["line"], top["function"], top["state"]) == (_line_of("# SLEEP_LINE"), "sleeper", "waiting")
        wire.validate(record)
        for _ in range(5):                       # after the last step: held, never sent
            sampler.tick()
        sampler.stop_event.set()
        sampler.run()
        assert out == [record]
    finally:
        stop.set()
        thread.join()


def test_a_batch_fetch_between_steps_is_the_data_wait_not_sampled_even_inside_the_users_dataset():
    stop, (thread,) = _threads(fetching)
    fake = FakeProbe(thread.ident)
    fake.in_step, fake.steps = False, 1
    sampler = where.WhereSampler(fake, lambda rec: None, hz=19.0)
    try:
        for _ in range(8):
            sampler.tick()
        assert sampler.pending.samples == 0
        fake.in_step = True                      # inside a step the same stack is the step's
        for _ in range(8):
            sampler.tick()
        assert sampler.tally.samples >= 6
    finally:
        stop.set()
        thread.join()


def test_a_look_that_got_the_gil_only_after_a_step_ended_is_left_out():
    """The look was due inside the step; Python held the GIL past the step's end: the stack it finds is
    the gap's, the time it stands for the step's. Late without a step ending, or on time, it counts."""
    stop, (thread,) = _threads(sleeper)
    fake = FakeProbe(thread.ident)
    fake.in_step, fake.steps = False, 1
    sampler = where.WhereSampler(fake, lambda rec: None, hz=19.0)
    try:
        due = time.perf_counter() - 0.004
        fake.ended = due + 0.002                  # the step ended 2 ms after the look was due
        sampler.tick(due)
        assert sampler.pending.samples == 0
        fake.ended = due - 0.001
        sampler.tick(due)                          # late, but the step had ended before
        sampler.tick(time.perf_counter())          # on time
        assert sampler.pending.samples == 2
    finally:
        stop.set()
        thread.join()


def test_a_fetch_that_opened_the_next_step_counts_its_time_as_the_steps():
    stop, (thread,) = _threads(sleeper)
    fake = FakeProbe(thread.ident)
    fake.in_step, fake.steps = False, 1
    fake.opening = lambda: True                  # zero-code: the training loader's fetch came, the forward not yet
    sampler = where.WhereSampler(fake, lambda rec: None, hz=19.0)
    try:
        for _ in range(6):
            sampler.tick()
        assert sampler.tally.samples >= 5 and sampler.pending.samples == 0
    finally:
        stop.set()
        thread.join()


def test_a_python_thread_holding_the_gil_while_the_training_thread_waits_is_named_with_its_line():
    stop, (train, hog) = _threads(gil_waiter, spin_forever, names=("train", "metrics-encoder"))
    fake = FakeProbe(train.ident)
    sampler = where.WhereSampler(fake, lambda rec: None, hz=19.0)
    try:
        for _ in range(30):
            sampler.tick()
        record = sampler.flush()
    finally:
        stop.set()
        train.join()
        hog.join()
    waiting = sum(line["n"] for line in record["lines"] if line["state"] == "waiting")
    holders = record["holders"]
    # the generator expression it runs is named by the function it is in
    named = sum(h["n"] for h in holders if (h["thread"], h["function"], h["span"]) ==
                ("metrics-encoder", "spin_forever", "step"))
    assert holders[0]["line"] in (_line_of("# HOG_LINE"), _line_of("# HOG_LINE") - 1)   # the loop's two lines
    assert waiting >= 15 and named >= waiting / 2, (waiting, holders)
    wire.validate(record)


def test_a_between_step_sample_is_before_or_after_the_lines_the_loop_runs_its_step_from():
    places = where.Places(roots=("/lib/",))
    loop = where.LoopLines(places)
    class Code:                                  # hashable, as code objects are
        def __init__(self, name: str) -> None:
            self.co_filename, self.co_name, self.co_qualname = "/u/train.py", name, name

    train, tokenize = Code("train"), Code("tokenize")

    def at(line, code=train, back=None):
        return types.SimpleNamespace(f_code=code, f_lineno=line, f_back=back, f_globals={"__name__": "user"})

    for line in (20, 21, 24) * 5:                # forward at 20 ... optimizer step at 24, seen inside steps
        loop.seen(where.stack_of(_frame("/lib/torch/module.py", 9, "_call_impl", at(line), module="torch")))
    loop.seen(where.stack_of(at(8)))             # a warm-up step called from line 8, under a quarter of a line's

    def order(frame):
        return loop.order(where.stack_of(frame))

    assert order(at(18)) == "before" and order(at(27)) == "after"
    assert order(at(3, tokenize, at(18))) == "before"       # a helper called before the step: the loop's line
    assert order(at(22)) is None and order(at(5, tokenize)) is None
    tally = where.Tally(0.0)
    tally.count(("/u/train.py", 3, "tokenize", None), "busy", before=1)
    tally.count(("/u/train.py", 3, "tokenize", None), "busy")
    line = tally.listed()[0]
    assert (line["n"], line["before"], "after" in line) == (2, 1, False)


def test_no_sample_is_taken_outside_a_step_and_an_empty_interval_sends_nothing():
    stop = threading.Event()
    thread = threading.Thread(target=sleeper, args=(stop,), daemon=True)
    thread.start()
    out: list = []
    fake = FakeProbe(thread.ident)
    fake.in_step = False
    sampler = where.WhereSampler(fake, out.append, hz=19.0)
    try:
        for _ in range(5):
            sampler.tick()
    finally:
        stop.set()
        thread.join()
    assert sampler.tally.samples == 0 and sampler.flush() is None and out == []


def test_the_sampling_rate_comes_from_the_environment_zero_is_off(monkeypatch):
    monkeypatch.delenv("PERFMON_WHERE_HZ", raising=False)
    assert where.sampling_hz() == where.DEFAULT_HZ
    for value, hz in (("0", 0.0), ("7.5", 7.5), ("1e9", where.MAX_HZ), ("-1", where.DEFAULT_HZ),
                      ("fast", where.DEFAULT_HZ), ("nan", where.DEFAULT_HZ)):
        monkeypatch.setenv("PERFMON_WHERE_HZ", value)
        assert where.sampling_hz() == hz
    monkeypatch.setenv("PERFMON_WHERE_HZ", "0")
    mon = probe.start(job="where-off", serve=False)
    try:
        assert mon.where is None
    finally:
        mon.close()


def _tapped(job: str) -> tuple:
    """A probe and the step records its sender thread builds (the hot path's queue drains concurrently)."""
    mon = probe.start(job=job, serve=False)
    steps: list = []
    mon.add_tap(lambda rec: steps.append(rec) if rec.get("k") == "step" else None)
    return mon, steps


def _cpu_spin(seconds: float) -> None:
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass


def test_a_steps_cpu_is_the_training_threads_cpu_time_near_zero_asleep_and_all_of_a_spin():
    mon, steps = _tapped("step-cpu")
    try:
        with mon.step():
            time.sleep(0.05)
        with mon.step():
            _cpu_spin(0.03)
        wait_for(lambda: len(steps) == 2, what="two step records")
    finally:
        mon.close()
    slept, spun = steps[-2:]
    assert slept["cpu_span"] == spun["cpu_span"] == "body"
    assert slept["cpu"] < 0.01 <= 0.05 <= slept["dur"]
    assert 0.03 <= spun["cpu"] <= spun["dur"] + 1e-3
    wire.validate(slept)


def test_fast_steps_read_the_cpu_clock_on_one_step_in_32_and_long_ones_on_every_step():
    mon, steps = _tapped("step-cpu-policy")
    try:
        for _ in range(64):
            with mon.step():
                pass
        for _ in range(3):
            with mon.step():
                time.sleep(0.003)
        wait_for(lambda: len(steps) == 67, what="67 step records")
    finally:
        mon.close()
    timed = [s["step"] for s in steps if "cpu" in s]
    fast = [n for n in timed if n < 64]
    # the first step, then the one after each 32nd (0, 32); a step preempted past 2 ms times its next
    assert {0, 1, 33} <= set(fast) and len(fast) <= 8
    assert {65, 66} <= set(timed)      # after a step of 2 ms or more, the next one is timed


def test_zero_code_steps_count_cpu_from_the_start_given_and_a_step_settled_late_has_none():
    mon, steps = _tapped("zero-code-cpu")
    try:
        c0 = time.thread_time()
        t0 = time.perf_counter()
        _cpu_spin(0.02)                   # the first fetch's work, before begin_step
        mon.begin_step(c0)
        time.sleep(0.25)                  # a long step: a preempted add_step is still in time (LATE_SHARE)
        mon.add_step(t0, time.perf_counter(), {"data": 0.0})
        mon.begin_step()
        t1 = time.perf_counter()
        end = time.perf_counter()
        time.sleep(0.02)                  # the end is settled later (a pending optimizer step)
        mon.add_step(t1, end)
        wait_for(lambda: len(steps) == 2, what="two step records")
    finally:
        mon.close()
    assert steps[0]["cpu_span"] == "active" and 0.02 <= steps[0]["cpu"] < 0.035, steps
    assert "cpu" not in steps[1] and "cpu_span" not in steps[1]


def test_where_records_reach_only_viewers_that_announced_1_3():
    mon = probe.start(job="where-minor")
    old, new = connect(mon.socket_path), connect(mon.socket_path)
    hello = {"k": "hello", "t": 0.0}
    try:
        old.sendall(wire.encode({**hello, "proto": [1, 2]}))
        new.sendall(wire.encode({**hello, "proto": [1, 3]}))
        wait_for(lambda: sorted(v.minor for v in mon.sender.viewers.values()) == [2, 3], what="both hellos read")
        mon.emit({"k": "where", "t": time.time(), "t0": time.time() - 2, "t1": time.time(), "hz": 19.0,
                  "samples": 3, "lines": [], "other": 3})
        with mon.step():
            pass
        got_new = read_until(new, lambda rs: any(r["k"] == "where" for r in rs) and step_seen(0)(rs))
        got_old = read_until(old, step_seen(0))
        assert [r["k"] for r in got_new].count("where") == 1
        assert "where" not in [r["k"] for r in got_old]
    finally:
        old.close()
        new.close()
        mon.close()


def test_a_timed_step_carries_its_other_threads_cpu_and_torchs_thread_count():
    """A helper thread spins 50 ms of its CPU through the step while the training thread waits for
    it: that CPU is the step's ``cpu_others``, read from the process clock, not the training thread's."""
    import torch
    steps: list[dict] = []
    mon = probe.start(job="step-others", serve=False)
    try:
        mon.add_tap(lambda rec: steps.append(rec) if rec.get("k") == "step" else None)
        helper = threading.Thread(target=_cpu_spin, args=(0.05,))
        with mon.step():
            helper.start()
            helper.join()                 # the training thread waits, off CPU, for 50 ms of the helper's CPU
    finally:
        mon.close()
    step = steps[-1]
    assert step["cpu"] < 0.02 and step["cpu_others"] >= 0.05          # all of the helper's CPU
    assert step["intra_threads"] == torch.get_num_threads()
