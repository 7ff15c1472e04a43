"""A job across nodes: one relay per host (``perfmon relay --stdio JOB`` started through the
transport template, ``tui.stream.hosts``, or ``perfmon relay --tcp PORT JOB`` already listening on
each host: ``port``/``token``), their streams read into one ``Analysis``.

Each host's relay speaks the wire protocol on its stdout: its own hello (``role: relay``), then
the records of that node's ranks tagged with ``src``. A host that cannot be reached, has no such
job, or runs a perfmon of another protocol version becomes one line in the view (and its
stream state ``error``); the other hosts go on. Ranks are named by the node as the user named it
(``--hosts n01``): the hello's ``host`` is replaced by that name, so two "nodes" on one machine
are still two nodes.

Each relay gets this viewer's hello on its stdin (wire 1.2): it then sends a ``summary`` per rank
rather than every step, and the full records only of the ranks ``follow`` names (the rank the
TUI's panes show; every rank for ``perfmon record``).

Requests (the TUI's module profile and capture) reach a rank through its node's relay: written
on the relay's stdin with the rank's ``src``, answered on its stdout; the result comes with the
rank's stream (``RelayTarget``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Any

from probe import wire
from tui.errors import UserError
from tui.stream.feed import READ_CHUNK, Feed, StreamStatus
from tui.stream.hosts import RELAY_ARGV, via_argv
from tui.stream.sources import viewer_hello

if TYPE_CHECKING:
    from perfmon_analysis.analysis import Analysis
    from tui.stream.requests import Askable

STDERR_LINES = 20
CONNECT_S = 5.0     # to a relay's TCP listener
STOP_S = 3.0        # a relay told to stop (stdin closed, SIGTERM) exits within this, else it is killed
RESTART_S = (1.0, 2.0, 4.0, 8.0)   # a failed relay started again after these pauses (then every last one)


class RelayFeed(Feed):
    """Every rank of ``job`` on ``hosts``, one relay process per host."""

    def __init__(self, analysis: Analysis, job: str, hosts: list[str], via: str,
                 relay: tuple[str, ...] = RELAY_ARGV, follow_all: bool = False, port: int | None = None,
                 token: str | None = None, restart: bool = False) -> None:
        super().__init__(analysis, description=f"{job} on {len(hosts)} host{'s' * (len(hosts) != 1)}")
        self.job = job
        self.hosts = list(hosts)
        self.via = via
        self.relay = relay
        self.port, self.token = port, token
        self._procs: dict[str, asyncio.subprocess.Process] = {}    # relays started through the transport
        self._writers: dict[str, asyncio.StreamWriter] = {}       # what each host's relay reads
        self.relays: dict[str, StreamStatus] = {h: StreamStatus(h, h) for h in self.hosts}   # ``streams``: ranks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answers: dict[int, asyncio.Future] = {}        # request id -> its relay's answer
        self._results_ready = threading.Condition()
        self._wanted: set[int] = set()                        # request ids a thread waits on
        self._results: dict[int, dict[str, Any]] = {}         # ... and their result records
        self._following: dict[str, tuple[Any, ...]] = {}      # host -> (srcs, window) last asked of its relay
        self._wanted_streams: set[str] | None = None if follow_all else set()
        self.restart = restart        # start a failed relay again (the relay tree: docs/tree.md)
        self.restarts: dict[str, int] = {}                    # host -> times its relay was started again
        self._closing = False
        self.received = 0             # bytes read from the relays (bench/bench_tree.py)

    def follow(self, stream_ids: set[str] | None) -> None:
        """Receive every record of these ranks (None: of all ranks), summaries of the others."""
        self._wanted_streams = None if stream_ids is None else set(stream_ids)
        for host in self._writers:
            self._subscribe(host)

    def _linked(self, host: str) -> asyncio.StreamWriter | None:
        """The way to ``host``'s relay, while it is up."""
        writer = self._writers.get(host)
        proc = self._procs.get(host)
        if writer is None or writer.is_closing() or (proc is not None and proc.returncode is not None):
            return None
        return writer

    def _subscribe(self, host: str) -> None:
        """Tell ``host``'s relay what to send in full, when that changed."""
        writer = self._linked(host)
        if writer is None:
            return
        wanted = self._wanted_streams
        srcs = ["*"] if wanted is None else sorted(sid.partition("/")[2] for sid in wanted
                                                   if sid.partition("/")[0] == host)
        ask = (tuple(srcs), *self.analysis.window)
        if self._following.get(host) == ask:
            return
        self._following[host] = ask
        try:
            writer.write(wire.encode({"k": "subscribe", "t": time.time(), "srcs": srcs,
                                      "window": [*self.analysis.window]}))
        except (OSError, RuntimeError):     # the relay is gone: its stream says so
            pass

    def request_target(self, stream_id: str) -> Askable | str:
        host, _, src = stream_id.partition("/")
        if self._linked(host) is None or self._loop is None:
            return f"the relay of {host} is not running: no request can reach its ranks"
        return RelayTarget(self, host, src, f"{self.streams[stream_id].label} on {host}"
                           if stream_id in self.streams else stream_id)

    async def request(self, host: str, src: str, request: dict[str, Any]) -> dict[str, Any]:
        """Write ``request`` to ``host``'s relay for its rank ``src``; its answer (feed loop)."""
        writer = self._linked(host)
        answer = self._loop.create_future() if self._loop is not None else None
        if answer is None or writer is None:
            raise UserError(f"the relay of {host} is not running")
        self._answers[request["id"]] = answer
        try:
            writer.write(wire.encode({**request, "src": src}))
            await writer.drain()
            return await answer
        finally:
            self._answers.pop(request["id"], None)

    def want(self, request_id: int) -> None:
        """Any thread, before the request goes out: keep its result record when it comes."""
        with self._results_ready:
            self._wanted.add(request_id)

    def wait_result(self, request_id: int, timeout: float) -> dict[str, Any] | None:
        """Any thread: the result record of ``request_id`` (``want``ed) once its rank's stream brings
        it, else None after ``timeout``; the request is no longer wanted after this."""
        with self._results_ready:
            self._results_ready.wait_for(lambda: request_id in self._results, timeout)
            self._wanted.discard(request_id)
            return self._results.pop(request_id, None)

    @property
    def ended(self) -> bool:
        """Every host's relay has finished (its ranks ended, or it failed and is not started again)."""
        return all(s.state in ("exited", "lost", "error") for s in self.relays.values())

    @property
    def answered(self) -> bool:
        """Every host's relay has answered (its hello) or failed."""
        return all(s.state not in ("connecting", "restarting") for s in self.relays.values())

    def state_line(self) -> str:
        line = super().state_line() if self.streams else "connecting to the relays"
        failed = [s.stream_id for s in self.relays.values() if s.state == "error"]
        again = [s.stream_id for s in self.relays.values() if s.state == "restarting"]
        if again:
            line += f"; {len(again)} relay(s) lost, restarting: {', '.join(again)}"
        return f"{line}; {len(failed)} host(s) failed: {', '.join(failed)}" if failed else line

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(self._keep(host)) for host in self.hosts]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self._stop_all()
            await asyncio.gather(*tasks, return_exceptions=True)
            for proc in self._procs.values():
                await _reap(proc)

    async def aclose(self) -> None:
        """Stop and reap every relay now (the app quits: its loop must not close under their pipes)."""
        self._stop_all()
        for proc in self._procs.values():
            await _reap(proc)

    def _stop_all(self) -> None:
        self._closing = True
        for host, writer in self._writers.items():
            if host not in self._procs:
                writer.close()           # a TCP relay ends when its viewer goes away
        for proc in self._procs.values():
            _stop(proc)

    async def _keep(self, host: str) -> None:
        """``host``'s relay; with ``restart``, started again after it failed (not after it ended
        because the job left the host: exit status 0), its state ``restarting`` meanwhile."""
        await self._host(host)
        status = self.relays[host]
        while self.restart and not self._closing and status.state == "error":
            pause = RESTART_S[min(self.restarts.get(host, 0), len(RESTART_S) - 1)]
            self.restarts[host] = self.restarts.get(host, 0) + 1
            status.state = "restarting"
            await asyncio.sleep(pause)
            old = self._procs.pop(host, None)
            if old is not None:
                _stop(old)
                await _reap(old)
            if self._closing:
                return
            status.state = "connecting"
            await self._host(host)

    def _argv(self, host: str) -> list[str]:
        """The command that starts ``host``'s relay through the transport."""
        return via_argv(self.via, host, self.job, self.relay)

    async def _host(self, host: str) -> None:
        status = self.relays[host]
        proc: asyncio.subprocess.Process | None = None
        stderr: asyncio.Future | None = None
        if self.port is not None:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, self.port), CONNECT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                self._fail(status, f"{host}: cannot connect to its relay on port {self.port}: "
                                   f"{getattr(exc, 'strerror', None) or exc or 'timeout'}")
                self.stream_finished()
                return
        else:
            argv = self._argv(host)
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                            stdout=asyncio.subprocess.PIPE,
                                                            stderr=asyncio.subprocess.PIPE)
            except OSError as exc:
                self._fail(status, f"{host}: cannot start {argv[0]}: {exc.strerror or exc}")
                self.stream_finished()
                return
            self._procs[host] = proc
            reader, writer = proc.stdout, proc.stdin      # type: ignore[assignment]
            stderr = asyncio.ensure_future(_tail(proc.stderr))   # drained as it comes: a full pipe would block it
        self._writers[host] = writer
        self._following.pop(host, None)       # a new relay: tell it what to send in full
        try:
            writer.write(viewer_hello(self.token))
        except (OSError, RuntimeError):
            pass
        self._subscribe(host)
        decoder = wire.FrameDecoder()
        srcs: dict[str, str] = {}
        cancelled = False
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                self.received += len(data)
                for rec in decoder.feed(data):
                    if not self._take(host, status, rec, srcs):
                        return
        except wire.ProtocolError as exc:
            self._fail(status, f"{host}: {exc}")
            return
        except OSError as exc:
            if self.port is not None and status.state == "connecting":   # reset before its hello: refused (token)
                self._fail(status, f"{host}: its relay on port {self.port} closed the connection: wrong token, "
                                   "or not a perfmon relay")
            else:
                self._fail(status, f"{host}: connection to its relay lost: {exc.strerror or exc}")
            return
        except asyncio.CancelledError:
            cancelled = True     # the viewer stopped following: the job did not end
            raise
        finally:
            if not cancelled:
                for sid in srcs.values():
                    self.analysis.end_stream(sid)
                    stream = self.streams.get(sid)       # a group relay's former representative: dropped
                    if stream is not None and stream.state in ("live", "connecting"):
                        stream.state = "lost"
                if status.state != "error":
                    if proc is not None and stderr is not None:
                        try:        # its last words; a transport that keeps stderr open must not hold us
                            err = await asyncio.wait_for(asyncio.shield(stderr), STOP_S)
                        except asyncio.TimeoutError:
                            err = []
                        await self._ended(host, status, proc, err)
                    elif status.state == "connecting":     # closed before its hello
                        self._fail(status, f"{host}: its relay on port {self.port} closed the connection: "
                                           "wrong token, or not a perfmon relay")
                    else:
                        status.state = "exited"
                self.stream_finished()
            if stderr is not None:
                stderr.cancel()

    def _take(self, host: str, status: StreamStatus, rec: dict[str, Any], srcs: dict[str, str]) -> bool:
        """One record from a host's relay; False when the relay cannot be used (version)."""
        src = rec.get("src")
        if not isinstance(src, str):
            if rec["k"] == "hello":
                try:
                    wire.check_compatible(rec.get("proto"), we_are="viewer")
                except wire.ProtocolMismatch as exc:
                    self._fail(status, f"{host}: {str(exc).replace('probe', 'relay')}")
                    return False
                status.state = "live"
                status.label = f"{host} (relay)"
                if status.message is not None:
                    self.analysis.drop_problem(status.message)     # a restarted relay is back: no longer a problem
                status.message = None
            else:
                self._other(host, rec)
            return True
        if rec["k"] == "answer":
            answer = self._answers.get(rec.get("id"))   # type: ignore[arg-type]
            if answer is not None and not answer.done():
                answer.set_result(rec)
            return True
        sid = srcs.get(src)
        if sid is None or sid not in self.streams:
            sid = srcs[src] = self._stream_id(host, src)
            self.streams[sid] = StreamStatus(sid, src, state="live")
        if rec["k"] == "hello":
            rec = self._rank_hello(host, sid, rec)
        self.ingest(sid, [rec])
        if rec["k"] in ("profile", "capture") and rec.get("id") in self._wanted:    # in the model already
            with self._results_ready:
                self._results[rec["id"]] = rec
                self._results_ready.notify_all()
        return True

    def _stream_id(self, host: str, src: str) -> str:
        """The viewer's name of rank ``src`` of ``host``'s relay: the node, then the rank's socket."""
        return f"{host}/{src}"

    def _rank_hello(self, host: str, sid: str, rec: dict[str, Any]) -> dict[str, Any]:
        """A rank's hello as the model takes it: its host is the node as the user named it."""
        return {**rec, "host": host}

    def _other(self, host: str, rec: dict[str, Any]) -> None:
        """A record of the relay's own (no ``src``) besides its hello: a node relay sends none."""

    async def _ended(self, host: str, status: StreamStatus, proc: asyncio.subprocess.Process,
                     err: list[str]) -> None:
        code = await proc.wait()
        if code != 0:
            self._fail(status, f"{host}: {err[-1] if err else f'relay exit status {code}'}")
        else:
            status.state = "exited"

    def _fail(self, status: StreamStatus, message: str) -> None:
        status.state = "error"
        status.message = message
        self.analysis.add_problem(message)


class RelayTarget:
    """A rank behind a relay, for ``tui.stream.requests.ask`` (called from a worker thread)."""

    def __init__(self, feed: RelayFeed, host: str, src: str, label: str) -> None:
        self.feed, self.host, self.src, self.label = feed, host, src, label

    def ask(self, op: str, params: dict[str, Any], timeout: float, result_kind: str | None = None,
            on_record: Any = None, request_id: int | None = None) -> dict[str, Any]:
        from tui.stream.requests import new_id

        rid = request_id or new_id()
        request = {"k": "request", "t": time.time(), "id": rid, "op": op, **params}
        deadline = time.monotonic() + timeout
        loop = self.feed._loop
        if loop is None:
            raise UserError(f"{self.label}: the relays are not running")
        self.feed.want(rid)
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(self.feed.request(self.host, self.src, request), timeout), loop)
        try:
            answer = future.result(timeout + 1.0)
        except (asyncio.TimeoutError, TimeoutError, concurrent.futures.TimeoutError):
            self.feed.wait_result(rid, 0.0)            # no longer wanted
            raise UserError(f"{self.label}: no answer through the relay of {self.host} in {timeout:.0f} s") from None
        if not answer.get("ok") or result_kind is None:
            self.feed.wait_result(rid, 0.0)            # no longer wanted
            if not answer.get("ok"):
                raise UserError(f"{self.label}: {op} refused: {answer.get('reason') or 'no reason given'}")
            return answer
        result = self.feed.wait_result(rid, max(0.0, deadline - time.monotonic()))
        if result is None:
            raise UserError(f"{self.label}: no {op} result within the time allowed (is the job still stepping?)")
        return result


async def _tail(stream: asyncio.StreamReader | None) -> list[str]:
    """The last lines a relay (or the transport: ssh) wrote on stderr."""
    lines: list[str] = []
    if stream is None:
        return lines
    async for raw in stream:
        line = raw.decode(errors="replace").strip()
        if line:
            lines = (lines + [line])[-STDERR_LINES:]
    return lines


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a stopped relay (the loop must not close under its pipes); kill one that lingers."""
    try:
        await asyncio.wait_for(proc.wait(), STOP_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
    except ProcessLookupError:
        pass


def _stop(proc: asyncio.subprocess.Process) -> None:
    """The viewer is done with this host: closing stdin tells the relay; kill it if it lingers."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.returncode is None:
            proc.terminate()
    except ProcessLookupError:
        pass


class RemoteJob:
    """A ``RelayFeed`` on an event loop of its own thread, for the commands that ask ranks on other
    hosts (``perfmon profile``/``capture --hosts``): they block on answers while the feed reads on.

    The run model is only read on the feed's loop (``view``), never from the calling thread."""

    def __init__(self, feed: RelayFeed) -> None:
        self.feed = feed
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="perfmon-relays", daemon=True)
        self._run: asyncio.Task | None = None

    def __enter__(self) -> RemoteJob:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._call(self._stop())
        except (concurrent.futures.TimeoutError, OSError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_S * 2)
        if not self._thread.is_alive():
            self.loop.close()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(STOP_S * 3)

    async def _start(self) -> None:
        self._run = asyncio.ensure_future(self.feed.run())

    async def _stop(self) -> None:
        await self.feed.aclose()
        if self._run is not None:
            self._run.cancel()
            await asyncio.gather(self._run, return_exceptions=True)

    def view(self) -> Any:
        """The job as its relays have told it so far (computed on the feed's loop)."""
        async def now() -> Any:
            return self.feed.analysis.view(now=self.feed.now(), clock=self.feed.clock())
        return self._call(now())

    def ranks(self, wanted: set[int] | None, timeout: float) -> list[Any]:
        """The ``RankView`` of each wanted rank (None: every rank of the job) once all have spoken, or
        those that came within ``timeout``; raises when no rank at all answered."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.view()
            spoke = [r for r in view.ranks if r.answered]
            found = [r for r in spoke if wanted is None or r.rank in wanted]
            complete = bool(found) and len(found) == (len(wanted) if wanted is not None else view.world_size)
            if complete or self.feed.ended or time.monotonic() > deadline:
                if not spoke:
                    raise UserError("; ".join(view.problems) or "no rank of the job answered through the relays")
                return found
            time.sleep(0.2)

    def follow(self, stream_ids: set[str] | None) -> None:
        self.loop.call_soon_threadsafe(self.feed.follow, stream_ids)

    def target(self, stream_id: str) -> Askable:
        got = self._call(self._target(stream_id))
        if isinstance(got, str):
            raise UserError(got)
        return got

    async def _target(self, stream_id: str) -> Askable | str:
        return self.feed.request_target(stream_id)
