"""The platform's exception family.

Every message names the bad value and says how to fix it. ``assert`` is kept for internal
invariants only; retries are Prefect task policy, never a bare ``except``.
"""


class PretrainError(Exception):
    """Base class of every error the platform raises on purpose."""


class ConfigError(PretrainError, ValueError):
    """An experiment config (or one of its sections) is invalid: names the field and the fix.

    A ``ValueError`` so that pydantic reports one raised inside a section's validator under the field's path.
    """


class RunsFolderError(ConfigError, NotADirectoryError):
    """A path the run needs as a folder inside the runs folder (or the runs folder itself) is a file, or cannot be
    created: names the path and the fix (remove or rename the file, or choose another ``--runs-dir``). A
    ``NotADirectoryError`` too, so callers that catch the raw ``OSError`` keep working."""


class ConfigWarning(UserWarning):
    """A config that loads but probably does not do what was meant (work computed and never used, a threshold the
    method cannot reach): names the fields, the figures and the fix. Issued with ``warnings.warn`` at load."""


class DataError(PretrainError):
    """Input data cannot be read or violates a stage-boundary expectation."""


class SourceError(DataError):
    """A source cannot be fetched or unpacked (missing apt, unknown package, unreadable file)."""


class CheckpointError(PretrainError):
    """A checkpoint is missing, incomplete, corrupt, or does not match the model/tokenizer given."""


class GateError(PretrainError):
    """The gate was changed after results exist, or its declaration is inconsistent."""


class TrainingError(PretrainError):
    """A launched training run failed; the message carries the tail of the workers' output."""


class DiskFullError(PretrainError, OSError):
    """The disk (or a file-size limit) ran out while a stage wrote its artifact; nothing was committed. An OSError
    too, so callers that catch the raw error keep working."""


class RayHeadLostError(PretrainError):
    """The head of the Ray cluster a stage ran its shard calls on stopped answering (its GCS is gone): names the
    address and what to do."""


class ShardCallError(PretrainError):
    """A call of a stage's shard or partition pass failed on every attempt it was given
    (``infra.execution.ExecutionConfig.retries``): names the pass, the call (partition or shard) and the attempts;
    ``__cause__`` is the last attempt's error."""
