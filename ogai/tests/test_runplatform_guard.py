"""runplatform's guard stops the platform when the command ended without doing so, even when
the terminal it writes to is gone (a closed terminal: every write fails with EIO)."""

import errno
import os

from ogai.management.commands import runplatform


class HungUpTerminal:
    def write(self, text):
        raise OSError(errno.EIO, "Input/output error")

    def flush(self):
        raise OSError(errno.EIO, "Input/output error")


def test_the_guard_stops_everything_though_its_terminal_is_gone(monkeypatch):
    stopped = []
    monkeypatch.setattr(runplatform, "_stop_groups", lambda leaders: stopped.append(leaders))
    command = runplatform.Command(stdout=HungUpTerminal(), stderr=HungUpTerminal())
    monkeypatch.setattr(command, "_stop_work", lambda: stopped.append("work"))
    read_end, write_end = os.pipe()
    os.close(write_end)  # runplatform ended without saying it stopped everything
    try:
        command._guard(read_end, [101, 102])
    finally:
        os.close(read_end)
    assert stopped == [[101, 102], "work"]


def test_an_apps_failing_stop_is_said_where_it_can_be_and_the_next_app_still_stops(
        monkeypatch):
    calls = []

    class Failing:
        label = "first"

        def platform_stop(self, *, stdout):
            raise RuntimeError("no database")

    class Working:
        label = "second"

        def platform_stop(self, *, stdout):
            calls.append("second")

    monkeypatch.setattr(runplatform.apps, "get_app_configs", lambda: [Failing(), Working()])
    runplatform.Command(stdout=HungUpTerminal(), stderr=HungUpTerminal())._stop_work()
    assert calls == ["second"]
