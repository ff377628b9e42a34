"""The runs folder: everything a pipeline run writes lives under one root.

Default ``./runs``; overridden by ``--runs-dir`` or the ``PRETRAIN_RUNS_DIR`` environment variable. Folders inside
it are made with ``ensure_folder``, so a file where a folder belongs is one ``RunsFolderError`` naming that path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from infra.errors import ConfigError, RunsFolderError

RUNS_ENV = "PRETRAIN_RUNS_DIR"
TRACKING_ENV = "PRETRAIN_TRACKING_URI"


def ensure_folder(path: str | Path, *, fix: str = "choose another --runs-dir") -> Path:
    """Make ``path`` a folder (parents included) unless it already is one; return it as a ``Path``.

    ``fix`` ends the message after "remove or rename the file, or" (another option when the folder was given by
    one, e.g. ``--out``).

    Raises:
        RunsFolderError: ``path`` or a folder above it is a file or a broken link (the message names that path),
            or it cannot be created (permissions, read-only disk).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if (p.exists() or p.is_symlink()) and not p.is_dir()), path)
        what = "a broken link" if blocker.is_symlink() and not blocker.exists() else "a file"
        needed = "" if blocker == path else f" (to make {path})"
        raise RunsFolderError(f"{blocker}: {what} is in the way where the run needs a folder{needed}; remove or "
                              f"rename the file, or {fix}") from None
    except OSError as err:
        raise RunsFolderError(f"folder {path} cannot be created ({err.strerror}); fix the permissions of the "
                              f"folder above it, or {fix}") from None
    return path


@dataclass(frozen=True)
class RunsLayout:
    root: Path

    @classmethod
    def resolve(cls, runs_dir: str | Path | None = None) -> "RunsLayout":
        chosen = runs_dir or os.environ.get(RUNS_ENV) or "runs"
        return cls(Path(chosen).expanduser().resolve())

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def tracking_uri(self) -> str:
        """``$PRETRAIN_TRACKING_URI`` (e.g. ``http://127.0.0.1:5000`` for a shared ``mlflow server``), else the
        SQLite file in this runs folder."""
        return os.environ.get(TRACKING_ENV) or f"sqlite:///{self.mlflow_db}"

    @property
    def remote_tracking(self) -> bool:
        """Whether MLflow is a tracking server (it then owns the artifact store) rather than the local file."""
        return self.tracking_uri.startswith(("http://", "https://"))

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def duckdb(self) -> Path:
        return self.root / "results.duckdb"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def optuna(self) -> Path:
        return self.root / "optuna"

    @property
    def source_cache(self) -> Path:
        return self.root / "cache" / "sources"

    @property
    def logs(self) -> Path:
        """One log file per ``pretrain run``: full tracebacks and library output kept off the terminal."""
        return self.root / "logs"

    @property
    def stores_lock(self) -> Path:
        """Held while a command creates or migrates the folder's stores (MLflow's SQLite file, DuckDB, Prefect's
        database), so that two first runs do not migrate one schema at once."""
        return self.root / "locks" / "stores.lock"

    @property
    def folders(self) -> tuple[Path, ...]:
        """Every folder the platform writes directly under the runs folder (docs/runs-folder.md; the mixture
        stage's proxy results go to ``cache/proxies``)."""
        return (self.root, self.mlflow_artifacts, self.artifacts, self.prefect_home, self.optuna,
                self.root / "cache", self.source_cache, self.root / "cache" / "proxies", self.root / "scratch",
                self.root / "audit", self.root / "locks", self.root / "reports", self.logs)

    def prepare_environment(self) -> None:
        """Point Prefect and MLflow at this folder. Must run before ``prefect`` is imported.

        Checks every path of ``folders`` first, so a file in the way fails now rather than in the stage that
        needs the folder.

        Raises:
            RunsFolderError: the runs folder or one of ``folders`` is a file, or cannot be created (a
                ``ConfigError``).
            ConfigError: the runs folder is not writable.
        """
        for path in self.folders:
            if (path.exists() or path.is_symlink()) and not path.is_dir():
                ensure_folder(path)  # raises, naming the path
        for path in (self.root, self.prefect_home, self.optuna, self.artifacts):
            ensure_folder(path)
        if not os.access(self.root, os.W_OK) or not os.access(self.prefect_home, os.W_OK):
            raise ConfigError(f"runs folder {self.root} is not writable; fix its permissions or choose another "
                              "--runs-dir (read-only folders can still be inspected with `pretrain status`)")
        os.environ["PREFECT_HOME"] = str(self.prefect_home)
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(self.prefect_home / "storage")
        os.environ["PREFECT_RESULTS_PERSIST_BY_DEFAULT"] = "true"
        os.environ["MLFLOW_TRACKING_URI"] = self.tracking_uri
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        # With a tracking server MLflow prints a "View run" link per finished run; the summary gives the one link.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # The local API server starts in a subprocess; on a busy 2-core machine it can take > 20 s.
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        # Loopback only, unless the user exports another host (see docs/guide/security.md): the API has no auth.
        os.environ.setdefault("PREFECT_SERVER_API_HOST", "127.0.0.1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
