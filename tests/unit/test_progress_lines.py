"""Progress where the output is not a terminal (``flows.progress``): plain lines when a bar starts and ends, a
progress line at most every interval, and a "still running" line when nothing was printed for an interval, so a log
never goes a minute without a line of the platform's while a run works."""

from __future__ import annotations

import io

import pytest

from flows.progress import PlainProgress, RichProgress, duration, make_progress
from infra.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_bar_prints_its_start_its_progress_at_most_every_interval_and_its_end():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(out, interval_s=30, clock=clock, heartbeat=False)
    with progress, progress.task("corpus: 4 shards", total=100) as advance:
        for _ in range(100):
            clock.now += 1.0  # one unit a second: a line every 30 s
            advance()
    lines = _lines(out)
    assert lines[0] == "corpus: 4 shards: started, 100 to do"
    assert lines[1:4] == ["corpus: 4 shards: 30/100 (30%), 30s, 1/s, ETA 1m10s",
                          "corpus: 4 shards: 60/100 (60%), 1m00s, 1/s, ETA 40s",
                          "corpus: 4 shards: 90/100 (90%), 1m30s, 1/s, ETA 10s"]
    assert lines[4] == "corpus: 4 shards: 100/100 done in 1m40s"
    assert len(lines) == 5


def test_slow_units_are_reported_as_seconds_each_and_a_bar_without_total_counts_what_it_did():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(out, interval_s=30, clock=clock, heartbeat=False)
    with progress.task("sweep: trials", total=4) as advance:
        clock.now += 40
        advance()
    with progress.task("tokenizer: fitting BPE", total=None):
        clock.now += 5
    assert _lines(out)[1] == "sweep: trials: 1/4 (25%), 40s, 40 s each, ETA 2m00s"
    assert _lines(out)[-1] == "tokenizer: fitting BPE: done in 5s"


def test_a_bar_with_no_unit_done_says_what_it_is_doing_and_gives_an_eta_from_the_first_unit_on():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(out, interval_s=30, clock=clock, heartbeat=False)
    with progress.task("sources: reading", total=5) as advance:
        advance(0, doing="reading handbook_en")
        clock.now += 43
        progress.tick()
        assert _lines(out)[-1] == "sources: reading: 0/5 (reading handbook_en, 43s)"
        advance(1, doing="reading handbook_zh")
        clock.now += 30
        progress.tick()
        assert _lines(out)[-1] == "sources: reading: 1/5 (20%), 1m13s, 73 s each, ETA 4m52s; reading handbook_zh"
    with progress.task("corpus: 1 shards × 5 passes", total=6):
        clock.now += 90
        progress.tick()  # no note: the line still says why there is no ETA yet
        assert _lines(out)[-1] == "corpus: 1 shards × 5 passes: 0/6 (the first under way, 1m30s)"
    with progress.task("tokenizer: fitting BPE", total=None):
        clock.now += 31
        progress.tick()
        assert _lines(out)[-1] == "tokenizer: fitting BPE: 0 done (under way, 31s)"


def test_a_terminal_bar_shows_what_it_is_doing_then_its_eta():
    from flows.progress import _StatusColumn

    clock = Clock()
    progress = RichProgress(disable=True, clock=clock)
    column = _StatusColumn()
    with progress, progress.task("sources: reading", total=4) as advance:
        task = progress._bars.tasks[0]
        advance(0, doing="reading handbook_en")
        clock.now += 43
        assert column.render(task).plain == "reading handbook_en"
        advance(1, doing="")
        clock.now += 7  # 50 s for the first unit: 150 s for the other three
        assert column.render(task).plain == "ETA 2m30s"
        advance(3)
    assert column.render(task).plain == ""  # finished: no ETA, no note


def test_silence_longer_than_the_interval_gets_a_line_naming_what_runs():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(out, interval_s=30, clock=clock, heartbeat=False)
    with progress:
        progress.say("[9/13] main: started")
        progress.activity("main")
        clock.now += 29
        progress.tick()
        assert _lines(out) == ["[9/13] main: started"]  # not yet an interval
        clock.now += 2
        progress.tick()
        assert _lines(out)[-1] == "main: still running, 31s"
        with progress.task("main: training steps", total=16) as advance:
            advance(3)
            clock.now += 45  # a bar that does not advance still gets its line
            progress.tick()
            assert _lines(out)[-1] == "main: training steps: 3/16 (19%), 45s, 15 s each, ETA 3m15s"
        progress.activity(None)
        clock.now += 300
        progress.tick()  # idle: nothing to say
        assert _lines(out)[-1] == "main: training steps: 3/16 done in 45s"


def test_the_heartbeat_thread_prints_without_being_driven():
    out = io.StringIO()
    progress = PlainProgress(out, interval_s=0.2)
    with progress:
        progress.activity("corpus")
        import time

        deadline = time.monotonic() + 10
        while "corpus: still running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "corpus: still running" in out.getvalue()


def test_a_closed_output_never_fails_the_run():
    out = io.StringIO()
    progress = PlainProgress(out, interval_s=30, heartbeat=False)
    out.close()
    with progress.task("export", total=1) as advance:
        advance()
    progress.say("still fine")


def test_the_output_chooses_bars_or_lines_and_the_environment_can_force_either(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("PRETRAIN_PROGRESS", raising=False)
    monkeypatch.delenv("PRETRAIN_PROGRESS_INTERVAL_S", raising=False)
    assert isinstance(make_progress(Tty()), RichProgress)
    plain = make_progress(io.StringIO())
    assert isinstance(plain, PlainProgress) and plain.interval_s == 30
    monkeypatch.setenv("PRETRAIN_PROGRESS", "lines")
    monkeypatch.setenv("PRETRAIN_PROGRESS_INTERVAL_S", "5")
    forced = make_progress(Tty())
    assert isinstance(forced, PlainProgress) and forced.interval_s == 5
    monkeypatch.setenv("PRETRAIN_PROGRESS", "bars")
    assert isinstance(make_progress(io.StringIO()), RichProgress)


@pytest.mark.parametrize("name, value", [("PRETRAIN_PROGRESS", "fancy"), ("PRETRAIN_PROGRESS_INTERVAL_S", "0"),
                                         ("PRETRAIN_PROGRESS_INTERVAL_S", "soon")])
def test_a_bad_setting_is_a_config_error_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        make_progress(io.StringIO())


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (0, 42, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]
