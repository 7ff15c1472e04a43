"""A job across nodes: one relay per host (``perfmon relay --stdio JOB`` started through the
transport template, ``tui.stream.hosts``), their streams read into one run model.

Each host's relay speaks the wire protocol on its stdout: its own hello (``role: relay``), then
the records of that node's ranks tagged with ``src``. A host that cannot be reached, has no such
job, or runs a perfmon of another protocol version becomes one line in the view (and its
stream state ``error``); the other hosts go on. Ranks are named by the node as the user named it
(``--hosts n01``): the hello's ``host`` is replaced by that name, so two "nodes" on one machine
are still two nodes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from probe import wire
from tui.model.runmodel import RunModel
from tui.stream.feed import READ_CHUNK, Feed, StreamStatus
from tui.stream.hosts import RELAY_ARGV, via_argv

STDERR_LINES = 20
STOP_S = 3.0        # a relay told to stop (stdin closed, SIGTERM) exits within this, else it is killed


class RelayFeed(Feed):
    """Every rank of ``job`` on ``hosts``, one relay process per host."""

    def __init__(self, model: RunModel, job: str, hosts: list[str], via: str,
                 relay: tuple[str, ...] = RELAY_ARGV) -> None:
        super().__init__(model, description=f"{job} on {len(hosts)} host{'s' * (len(hosts) != 1)}")
        self.job = job
        self.hosts = list(hosts)
        self.via = via
        self.relay = relay
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self.relays: dict[str, StreamStatus] = {h: StreamStatus(h, h) for h in self.hosts}   # ``streams``: ranks

    def request_target(self, stream_id: str) -> str:
        return ("requests do not pass through a relay yet: run `perfmon profile JOB` or `perfmon capture JOB` "
                "on the rank's host")

    @property
    def ended(self) -> bool:
        """Every host's relay has finished (its ranks ended, or it failed)."""
        return all(s.state in ("exited", "lost", "error") for s in self.relays.values())

    def state_line(self) -> str:
        line = super().state_line() if self.streams else "connecting to the relays"
        failed = [s.stream_id for s in self.relays.values() if s.state == "error"]
        return f"{line}; {len(failed)} host(s) failed: {', '.join(failed)}" if failed else line

    async def run(self) -> None:
        tasks = [asyncio.ensure_future(self._host(host)) for host in self.hosts]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for proc in self._procs.values():
                _stop(proc)
            await asyncio.gather(*tasks, return_exceptions=True)
            for proc in self._procs.values():
                await _reap(proc)

    async def aclose(self) -> None:
        """Stop and reap every relay now (the app quits: its loop must not close under their pipes)."""
        for proc in self._procs.values():
            _stop(proc)
        for proc in self._procs.values():
            await _reap(proc)

    async def _host(self, host: str) -> None:
        status = self.relays[host]
        argv = via_argv(self.via, host, self.job, self.relay)
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            self._fail(status, f"{host}: cannot start {argv[0]}: {exc.strerror or exc}")
            self.stream_finished()
            return
        self._procs[host] = proc
        stderr = asyncio.ensure_future(_tail(proc.stderr))   # drained as it comes: a full pipe would block it
        decoder = wire.FrameDecoder()
        srcs: dict[str, str] = {}
        cancelled = False
        try:
            while True:
                data = await proc.stdout.read(READ_CHUNK)      # type: ignore[union-attr]
                if not data:
                    break
                for rec in decoder.feed(data):
                    if not self._take(host, status, rec, srcs):
                        return
        except wire.ProtocolError as exc:
            self._fail(status, f"{host}: {exc}")
            return
        except asyncio.CancelledError:
            cancelled = True     # the viewer stopped following: the job did not end
            raise
        finally:
            if not cancelled:
                for sid in srcs.values():
                    self.model.end_stream(sid)
                    if self.streams[sid].state in ("live", "connecting"):
                        self.streams[sid].state = "lost"
                if status.state != "error":
                    await self._ended(host, status, proc, await stderr)
                self.stream_finished()
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
            return True
        sid = srcs.get(src)
        if sid is None:
            sid = srcs[src] = f"{host}/{src}"
            self.streams[sid] = StreamStatus(sid, src, state="live")
        if rec["k"] == "hello":
            rec = {**rec, "host": host}
        self.ingest(sid, [rec])
        return True

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
        self.model.add_problem(message)


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
