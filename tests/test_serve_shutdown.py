"""SIGTERM and SIGINT end a `tpsample serve` process within 10 s, whichever of its processes
gets the signal: open streams end with an error chunk and `data: [DONE]`, and no process is
left behind (checked in /proc). TP = 3 runs spawned gloo workers on CPU, on a tiny model."""
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from test_serve_hardening import ServeProcess, running, strict_json, tiny_chat_model

LIMIT_S = 10
LONG = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 900, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_chat_model(str(tmp_path_factory.mktemp("shutdown")))


def _workers(srv: ServeProcess) -> list[int]:
    def cmdline(pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                return f.read()
        except OSError:
            return ""
    return [pid for pid in srv.descendants() if "multiprocessing.spawn" in cmdline(pid)]


def _stop_with_an_open_stream(srv: ServeProcess, pid: int, sig: int) -> tuple[list[str], float, list[int]]:
    """Open a stream, send `sig` to `pid` once tokens flow; (the stream's last lines, when the
    signal went, the server's processes then)."""
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=LONG, timeout=LIMIT_S) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while '"content": "' not in next(lines):
            pass
        procs = srv.descendants()
        sent = time.monotonic()
        os.kill(pid, sig)
        rest = [line for line in lines if line]
    assert time.monotonic() - sent < LIMIT_S
    return rest, sent, procs


def _assert_all_gone(srv: ServeProcess, procs: list[int], sent: float, exit_code: int) -> None:
    assert srv.proc.wait(timeout=max(0.1, sent + LIMIT_S - time.monotonic())) == exit_code, "".join(srv.log)
    while any(running(p) for p in procs) and time.monotonic() < sent + LIMIT_S:
        time.sleep(0.1)
    assert not [p for p in procs if running(p)], "processes left behind"


def _assert_ended_with_an_error_then_done(rest: list[str]) -> None:
    assert rest[-1] == "data: [DONE]", rest[-3:]
    last = strict_json(rest[-2].removeprefix("data: "))
    assert last["error"]["code"] == "engine_stopped", last


def _signal_with_an_open_stream(folder, extra_args, target, sig, exit_code: int, workers: int = 0) -> None:
    """Start a server, open a stream, send `sig` to target(server, worker pids); the stream ends
    with an error chunk and [DONE], and every process is gone with the server's `exit_code`."""
    srv = ServeProcess(folder, *extra_args)
    try:
        pids = _workers(srv)
        assert len(pids) == workers
        rest, sent, procs = _stop_with_an_open_stream(srv, target(srv, pids), sig)
        _assert_ended_with_an_error_then_done(rest)
        _assert_all_gone(srv, procs, sent, exit_code)
    finally:
        srv.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_tp1_server_and_its_open_stream_within_10s(folder, sig):
    _signal_with_an_open_stream(folder, (), lambda srv, pids: srv.proc.pid, sig, 0)


def test_sigterm_ends_a_tp3_server_and_its_workers_within_10s(folder):
    _signal_with_an_open_stream(folder, ("--tp", "3"), lambda srv, pids: srv.proc.pid, signal.SIGTERM, 0, 3)


def test_sigterm_to_a_tp3_worker_ends_the_server_and_every_worker_within_10s(folder):
    # exit code 1: the engine failed
    _signal_with_an_open_stream(folder, ("--tp", "3"), lambda srv, pids: max(pids), signal.SIGTERM, 1, 3)
