"""One rank of a launched main run: ``accelerate launch ... -m tasks.main.worker JOB.json``.

Rank 0 appends its metrics and progress to ``PRETRAIN_METRICS_FILE`` (default ``<scratch>/launch/metrics.jsonl``),
which the launching stage (``tasks.main.launch``) tails into its MLflow run. The process ends through
``tasks.train.parallel.run_worker``, which destroys the process groups and exits without interpreter finalisation.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from infra.stage import ProgressReporter

class _FileReporter(ProgressReporter):
    """Rank 0's metrics and progress, one JSON line each, for the launching stage to forward."""

    def __init__(self, path: Path):
        self.file = open(path, "a", buffering=1)

    def log_metrics(self, metrics: dict, step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items()}
        self.file.write(json.dumps({"step": int(step), "metrics": clean}) + "\n")

    def task(self, description: str, total: int | None):
        from contextlib import contextmanager

        @contextmanager
        def bar():
            yield lambda n=1, doing=None: self.file.write(json.dumps({"advance": int(n)}) + "\n")
        return bar()


def main(argv: list[str] | None = None) -> None:
    """One worker's run of ``JOB.json`` (argv[1]) as a rank of the launched run."""
    import torch
    from accelerate import Accelerator

    from tasks.main.stage import MainJob, train_main

    args = sys.argv[1:] if argv is None else argv
    job = MainJob.read(Path(args[0]))
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not cuda)
    reporter = _FileReporter(Path(os.environ.get("PRETRAIN_METRICS_FILE", Path(job.scratch) / "launch" / "metrics.jsonl")))
    train_main(job, log_metrics=reporter.log_metrics, progress=reporter, accelerator=accelerator)
    accelerator.end_training()


if __name__ == "__main__":
    from tasks.train.parallel import run_worker

    run_worker(main)
