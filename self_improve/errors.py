"""Errors a user can cause; a stage prints them as one line and exits non-zero."""


class PipelineError(Exception):
    """Base of the errors below."""


class ConfigError(PipelineError, ValueError):
    """A params.yaml problem; the message names the file and the key."""


class ArtifactError(PipelineError, ValueError):
    """An input artifact is missing or malformed; the message names the file."""


class TrainingError(PipelineError, RuntimeError):
    """Training diverged; no model is written."""
