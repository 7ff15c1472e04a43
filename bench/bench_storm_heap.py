"""Is RSS growth after viewer storms a leak? Traced Python memory (tracemalloc) of a probe in
this process after one storm and after three more (each storm: 20 stalled viewers that never
read, 1,000 connect/hello/disconnect cycles, then every viewer closed), with a training
loop stepping on another thread. Prints the traced bytes and the lines that grew.

    python bench/bench_storm_heap.py
"""
import gc
import os
import socket
import sys
import tempfile
import threading
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import probe  # noqa: E402  (from this checkout, put on the path above)
from probe import wire  # noqa: E402

d = tempfile.mkdtemp()
os.chmod(d, 0o700)
os.environ["PERFMON_DIR"] = d

mon = probe.start(job="leak", sample_hz=2)
path = str(mon.socket_path)
hello = wire.encode({"k": "hello", "t": time.time(), "proto": list(wire.PROTO)})
stop = False
def loop():
    while not stop:
        with mon.step(samples=1):
            sum(range(2000))
t = threading.Thread(target=loop)
t.start()
time.sleep(2)
tracemalloc.start(10)
def storm():
    st = []
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(path)
        s.sendall(hello)
        st.append(s)
    for _ in range(1000):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            s.sendall(hello)
        except OSError:
            pass
        s.close()
    time.sleep(1)
    for s in st:
        s.close()
    while mon.sender.viewers:
        time.sleep(0.01)
storm()
gc.collect()
s1 = tracemalloc.take_snapshot()
m1 = tracemalloc.get_traced_memory()[0]
for _ in range(3):
    storm()
gc.collect()
s2 = tracemalloc.take_snapshot()
m2 = tracemalloc.get_traced_memory()[0]
print("traced after 1 storm", m1, "after 4", m2)
for stat in s2.compare_to(s1, "lineno")[:8]:
    print(stat)
stop = True
t.join()
mon.close()
