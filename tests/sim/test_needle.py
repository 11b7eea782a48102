"""``kvsim needle``: the texts (lengths, where the needle sits, the key's digits), the
measure (greedy retrieval from teacher-forced logits, the digits' log-probability), and a
grid that resumes from its cells on disk."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from models.source import resolve_model
from sim.app import needle
from sim.app.needle import NeedleBuilder, NeedleConfig, run_grid, score, trial_keys

from .echo_runner import EchoRunner, make_echo


@pytest.fixture(scope="module")
def tok():
    return resolve_model("smollm2-135m").tokenizer()


def test_texts_have_the_length_and_the_needle_where_asked(tok) -> None:
    b = NeedleBuilder(tok)
    keys = trial_keys(3)
    assert keys == trial_keys(3) and all(10_000 <= k <= 99_999 for k in keys)
    for depth in (0.0, 0.5, 1.0):
        t = b.text(512, depth, keys[0])
        assert t.context == 512 and len(t.ids) == 511
        assert tok.decode(t.ids[t.needle_at:t.needle_at + b.needle_len]) == \
            needle.NEEDLE.format(key=keys[0])
        assert [tok.decode([t.answer[i]]) for i in t.digits] == list(str(keys[0]))
    assert b.text(512, 0.0, keys[0]).needle_at == len(b.instruction)
    end = b.text(512, 1.0, keys[0])
    filler_after = len(end.ids) + 1 - end.needle_at - b.needle_len - len(b.question) \
        - b.answer_len
    assert 0 <= filler_after < len(b.unit)  # at most the unfinished last sentence
    with pytest.raises(ConfigError, match="context"):
        b.text(60, 0.5, keys[0])


def test_score_is_greedy_retrieval_and_the_digits_log_probability(tok) -> None:
    b = NeedleBuilder(tok)
    t = b.text(256, 0.5, 12345)
    logits = np.zeros((len(t.answer), 49152), np.float32)
    logits[np.arange(len(t.answer)), t.answer] = np.log(3.0)  # p = 3 / (3 + 49151)
    tr = score(tok, t, logits, 12345)
    assert tr.retrieved and tr.greedy == " 12345"
    lg = float(np.float32(np.log(3.0)))
    assert tr.logprob_mean == pytest.approx(lg - np.log(np.exp(lg) + 49151), rel=1e-12)
    logits[3, t.answer[3]] = -1.0  # one digit no longer the argmax
    assert not score(tok, t, logits, 12345).retrieved


def test_grid_shares_the_prefix_and_resumes_from_its_cells(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(needle, "FloatRunner", EchoRunner)
    monkeypatch.setattr(EchoRunner, "pattern",
                        resolve_model("smollm2-135m").tokenizer().encode(" The pass key is"))
    monkeypatch.setattr(EchoRunner, "fed", 0)  # counted from here
    cfg = [NeedleConfig("float", None, None)]
    kw = dict(bits=lambda r: None, contexts=[300], depths=[0.0, 1.0], trials=2, out=tmp_path)
    cells = run_grid("smollm2-135m", cfg, **kw)
    assert [c.retrieved for c in cells] == [1.0, 1.0]
    # the prefix once, then each trial from its depth's needle: fewer tokens than 4 texts
    assert EchoRunner.fed < 4 * 299
    assert len(list((tmp_path / "cells").glob("*.json"))) == 2
    EchoRunner.fed = 0
    assert run_grid("smollm2-135m", cfg, **kw) == cells
    assert EchoRunner.fed == 0  # every cell read from disk


def test_a_process_pool_gives_the_same_cells_in_the_same_order(tmp_path) -> None:
    """``jobs=2``: the (configuration, context) groups run on two spawned processes (the
    stand-in model, made by a top-level factory); the cells, their order and their files
    are those of one process."""
    cfg = [NeedleConfig("float", None, None), NeedleConfig("int8", "int8", "integer")]
    kw = dict(bits=lambda r: None, contexts=[300, 260], depths=[0.0, 0.5, 1.0], trials=2,
              make_runner=make_echo)
    one = run_grid("smollm2-135m", cfg, out=tmp_path / "one", **kw)
    pool = run_grid("smollm2-135m", cfg, out=tmp_path / "pool", jobs=2, **kw)
    strip = [(c.config, c.context, c.depth, c.needle_at, c.trials) for c in one]
    assert [(c.config, c.context, c.depth, c.needle_at, c.trials) for c in pool] == strip
    assert [(c.config, c.context) for c in one][::3] == [
        ("float", 260), ("float", 300), ("int8 integer", 260), ("int8 integer", 300)]
    names = sorted(p.name for p in (tmp_path / "one" / "cells").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "pool" / "cells").iterdir())
    assert len(names) == 12
    with pytest.raises(ConfigError, match="jobs"):
        run_grid("smollm2-135m", cfg, jobs=0, **kw)


def test_report_table_and_heatmap(tmp_path) -> None:
    from sim.app.cli.needle import heatmap, markdown
    from sim.app.needle import Cell, Trial

    cells = [Cell("kivi-2 integer", "kivi-2", "integer", ctx, d, 10,
                  [Trial(1, ok, -0.5, " 1"), Trial(2, True, -0.25, " 2")], 1.0)
             for ctx in (512, 1024) for d, ok in ((0.0, True), (1.0, False))]
    md = markdown(cells)
    assert "| kivi-2 integer | 1024 | 100% / -0.38 | 50% / -0.38 |" in md
    heatmap(cells, tmp_path / "n.html")
    page = (tmp_path / "n.html").read_text()
    assert "kivi-2 integer" in page and "plotly" in page


def test_cached_report_reads_every_cell_of_the_same_keys(tmp_path, monkeypatch) -> None:
    """Cells run by two commands (a context each) report as one table with --cached;
    cells of other keys (another trial count) are left out; nothing is run."""
    from sim.app.cli.main import main
    from sim.app.needle import cached_cells

    monkeypatch.setattr(needle, "FloatRunner", EchoRunner)
    monkeypatch.setattr(EchoRunner, "pattern",
                        resolve_model("smollm2-135m").tokenizer().encode(" The pass key is"))
    cfg = [NeedleConfig("float", None, None)]
    for ctx, trials in ((300, 2), (400, 2), (300, 1)):
        run_grid("smollm2-135m", cfg, bits=lambda r: None, contexts=[ctx], depths=[0.5],
                 trials=trials, out=tmp_path)
    got = cached_cells(tmp_path, trials=2)
    assert [(c.context, len(c.trials)) for c in got] == [(300, 2), (400, 2)]
    EchoRunner.fed = 0
    assert main(["needle", "--cached", "--trials", "2", "--out", str(tmp_path)]) == 0
    assert EchoRunner.fed == 0
    md = (tmp_path / "needle.md").read_text()
    assert "| float | 300 |" in md and "| float | 400 |" in md
    assert main(["needle", "--cached", "--trials", "3", "--out", str(tmp_path)]) == 2
    (tmp_path / "cells" / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bad.json: not a needle cell"):
        cached_cells(tmp_path, trials=2)


def test_read_paths_are_paired_trial_by_trial() -> None:
    from sim.app.cli.needle import markdown
    from sim.app.needle import Cell, Trial, read_path_pairs

    def cell(read, depth, hits, lps):
        return Cell(f"kivi-2 {read}", "kivi-2", read, 1024, depth, 10,
                    [Trial(k, h, lp, "") for k, h, lp in zip((1, 2), hits, lps, strict=True)],
                    1.0)

    cells = [cell("integer", 0.0, (True, False), (-0.1, -1.0)),
             cell("dequant", 0.0, (False, True), (-0.5, -0.2)),
             cell("integer", 0.5, (True, True), (-0.1, -0.1)),
             cell("dequant", 0.5, (True, False), (-0.1, -0.9)),
             cell("integer", 1.0, (True, True), (0.0, 0.0)),  # no dequant cell: not paired
             Cell("float", None, None, 1024, 0.0, 10, [Trial(1, True, 0.0, "")], 1.0)]
    [p] = read_path_pairs(cells)
    assert (p.format, p.context, p.trials) == ("kivi-2", 1024, 4)
    assert (p.integer, p.dequant, p.only_integer, p.only_dequant) == (3, 2, 2, 1)
    assert (round(p.logprob_integer, 3), round(p.logprob_dequant, 3)) == (-0.325, -0.425)
    assert "| kivi-2 | 1024 | 4 | 3 | 2 | 2 | 1 | -0.33 | -0.42 |" in markdown(cells)


class _CallsRunner(EchoRunner):
    """The stand-in with calls of 7 tokens: it records where each feed begins (the NPU's
    results depend on it), and its snapshots carry the record."""

    chunk = 7

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.starts: list[int] = []
        self.answers: list[list[int]] = []  # the feeds' starts up to each trial's last

    def feed(self, ids, *, rows=0):
        self.starts = [*self.starts, len(self.ids)]
        if rows:
            self.answers.append(self.starts)
        return super().feed(ids, rows=rows)

    def snapshot(self):
        return super().snapshot(), list(self.starts)

    def restore(self, snap):
        super().restore(snap[0])
        self.starts = list(snap[1])


def test_every_trial_is_cut_into_calls_from_position_0_whatever_the_other_depths(
        tmp_path) -> None:
    """The prefix is shared up to the last call boundary before each needle, so a trial's
    calls are those of its whole text run alone: every call but the answer's begins at a
    multiple of the runner's call size, and a cell is the same whichever depths share its
    run (the NPU's INT2 results moved with the old cut)."""
    made: list[_CallsRunner] = []

    def make(*args):
        made.append(_CallsRunner())
        return made[-1]

    cfg = [NeedleConfig("kivi-2 integer", "kivi-2", "integer")]
    kw = dict(bits=lambda r: None, contexts=[300], trials=2, make_runner=make)
    both = run_grid("smollm2-135m", cfg, depths=[0.25, 0.5], out=tmp_path / "a", **kw)
    alone = run_grid("smollm2-135m", cfg, depths=[0.5], out=tmp_path / "b", **kw)
    assert [c.trials for c in both][1] == alone[0].trials
    assert [len(r.answers) for r in made] == [4, 2]
    for runner in made:
        for starts in runner.answers:  # each feed cuts its tokens into calls from its start
            assert starts[0] == 0 and all(s % _CallsRunner.chunk == 0 for s in starts)


def test_cells_of_an_older_kvsim_are_left_out_of_a_cached_report(tmp_path, monkeypatch):
    """A cell file carries its key: one without it (an older kvsim's), or an NPU cell cut
    into calls the old way, is not reported beside the current cells but named."""
    import json

    from sim.app.needle import cached_cells

    cfg = [NeedleConfig("kivi-2 integer", "kivi-2", "integer")]
    run_grid("smollm2-135m", cfg, bits=lambda r: None, contexts=[300], depths=[0.5],
             trials=2, out=tmp_path, make_runner=make_echo)
    [path] = (tmp_path / "cells").glob("*.json")
    d = json.loads(path.read_text())
    assert d["key"]["calls"] == needle.CALLS_VERSION and d["key"]["context"] == 300
    assert len(cached_cells(tmp_path, trials=2)) == 1
    for old in ({k: v for k, v in d.items() if k != "key"},
                {**d, "key": {**d["key"], "calls": needle.CALLS_VERSION - 1}}):
        path.write_text(json.dumps(old))
        stale: list = []
        assert cached_cells(tmp_path, trials=2, stale=stale) == []
        assert stale == [path]
    # a cell found at its key's path (the key matched) gets the key written in
    path.write_text(json.dumps({k: v for k, v in d.items() if k != "key"}))
    run_grid("smollm2-135m", cfg, bits=lambda r: None, contexts=[300], depths=[0.5],
             trials=2, out=tmp_path, make_runner=make_echo)
    assert json.loads(path.read_text()) == d
    assert len(cached_cells(tmp_path, trials=2)) == 1
