"""The CPT section of the run summary opens with its table; how the artifact was built is printed under it, not
above, where it would read as part of the section before (tasks/cpt/views.py)."""

import io
import json

from rich.console import Console

from infra.runs import RunsLayout
from infra.stage import SummaryContext
from tasks.cpt.views import summary


def test_the_cache_line_is_printed_under_the_candidates_table(tmp_path):
    candidates = {name: {"replay_fraction": 0.1, "realised_replay_fraction": 0.1, "peak_lr": 3e-4,
                         "general_loss_nats": 6.0, "domain_loss_nats": 5.0, "cloze_accuracy": 0.5}
                  for name in ("base", "r0.1")}
    (tmp_path / "candidates.json").write_text(json.dumps(candidates))
    (tmp_path / "meta.json").write_text(json.dumps({"summary": {"trained": 4, "reused": 0}}))
    console = Console(file=io.StringIO(), width=100)
    for item in summary(SummaryContext(path=tmp_path, paths={}, layout=RunsLayout(tmp_path / "runs"))):
        console.print(item)
    text = console.file.getvalue()
    assert 0 <= text.index("CPT candidates") < text.index("when this artifact was built: 4 candidate phase(s)")
