"""What the base model (it0) is: `model.base` resolved, checked and recorded, never copied.

`model.base` is `builtin` (prepare builds the tiny model), a local Hugging Face model directory, a
GGUF file (or a directory / hub repo with `model.gguf_file`), or a hub id (`org/name`, with
`model.revision`). `resolve_base` checks it before any work and returns a small record: where the
weights are, the hub commit when there is one, and a content hash of the files that define the
model. Prepare writes that record as it0 (`base.json`) instead of copying the weights; every later
stage loads the base from it and checks that the files still have the sizes recorded (the content
hash, computed once, identifies the base in fingerprints without re-reading the weights).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from self_improve.config import ModelConfig, SecurityConfig
from self_improve.errors import ConfigError

BASE_FILE = "base.json"
GGUF_MAGIC = b"GGUF"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# the files that define a model: weights, config, tokenizer, chat and generation templates
_DEFINING = ("*.safetensors", "*.bin", "*.gguf", "*.json", "*.model", "*.jinja", "*.txt", "*.tiktoken")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def defining_files(directory: Path, gguf_file: str | None = None) -> list[Path]:
    files = {f for pattern in _DEFINING for f in directory.glob(pattern) if f.is_file()}
    if gguf_file:  # one GGUF of several in a directory: hash that one, not its siblings
        files = {f for f in files if f.suffix != ".gguf" or f.name == gguf_file}
    return sorted(files)


def content_hash(directory: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(directory)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or value.count("/") != 1 or not _HUB_ID.fullmatch(value)


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"model.gguf_file: {path}: no such file")
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ConfigError(f"model.base: {path}: not a GGUF file (it does not start with 'GGUF')")


def check_model_dir(path: str | Path, security: SecurityConfig = SecurityConfig(), error: type | None = None,
                    prefix: str = "") -> Path:
    """Refuse a directory that is not a loadable HF model under `security`, naming what is wrong.

    Raises `error` (ArtifactError for a stage's input; ConfigError, with `prefix` naming the params
    key, for `model.base`)."""
    from self_improve.errors import ArtifactError

    error = error or ArtifactError
    path = Path(path)
    if not path.is_dir():
        raise error(f"{prefix}{path}: model directory not found")
    config = path / "config.json"
    if not config.is_file():
        raise error(f"{prefix}{path}: no config.json, not a Hugging Face model directory")
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{prefix}{config}: not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise error(f"{prefix}{config}: expected a JSON object")
    if "auto_map" in cfg and not security.trust_remote_code:
        raise error(f"{prefix}{path}: the model ships its own code (auto_map in config.json); "
                    "set security.trust_remote_code: true only if you trust it")
    if not any(path.glob("*.safetensors")):
        if not (any(path.glob("*.bin")) or any(path.glob("*.pt"))):
            raise error(f"{prefix}{path}: no weights (*.safetensors) in the directory")
        if not security.allow_pickle_weights:
            raise error(f"{prefix}{path}: only pickle weights found (*.bin); convert them to safetensors, "
                        "or set security.allow_pickle_weights: true if you trust them")
    return path


def _hub_snapshot(repo_id: str, revision: str | None, gguf_file: str | None, local_only: bool = False) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
    patterns += [gguf_file] if gguf_file else ["*.safetensors"]
    return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=local_only))


def _check_tokenizer(directory: Path, gguf_file: str | None, security: SecurityConfig, value: str) -> None:
    """The tokenizer loads and has an eos token: generation must be able to stop (pad may fall back to eos)."""
    from transformers import AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True,
                                            trust_remote_code=security.trust_remote_code, **extra)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"model.base: {value}: its tokenizer cannot be loaded ({_first_line(err)})") from None
    if tok.eos_token_id is None:
        raise ConfigError(f"model.base: {value}: its tokenizer has no eos token (nor a pad token to stop on), "
                          "so generation could not stop; set eos_token in its tokenizer_config.json")


def resolve_base(cfg: ModelConfig, security: SecurityConfig = SecurityConfig()) -> dict:
    """The record of a pretrained `model.base`, or ConfigError naming the key and the problem."""
    if cfg.builtin:
        raise ValueError("the builtin model has no base record: prepare builds it")
    value = cfg.base
    path = Path(value).expanduser()
    record: dict = {"base": value, "gguf_file": cfg.gguf_file, "revision": cfg.revision}
    if path.is_file():  # a GGUF file given directly
        if cfg.gguf_file:
            raise ConfigError(f"model.gguf_file: set together with a file as model.base ({value}); "
                              "give the directory as model.base, or leave gguf_file out")
        _check_gguf(path)
        record.update(kind="local", path=str(path.parent), gguf_file=path.name)
    elif path.is_dir():
        if cfg.revision:
            raise ConfigError(f"model.revision: {value} is a local directory; a revision applies to hub ids only")
        if cfg.gguf_file:
            _check_gguf(path / cfg.gguf_file)
        else:
            check_model_dir(path, security, ConfigError, "model.base: ")
        record.update(kind="local", path=str(path))
    elif _looks_like_path(value):
        raise ConfigError(f"model.base: {value}: no such directory or file (and not a hub id of the form org/name)")
    else:
        try:
            snap = _hub_snapshot(value, cfg.revision, cfg.gguf_file)
        except (OSError, ValueError) as err:  # offline, unknown or gated repo, malformed id
            raise ConfigError(f"model.base: {value}: not a local directory, and fetching it from the Hugging Face "
                              f"hub failed ({_first_line(err)})") from None
        if cfg.gguf_file:
            _check_gguf(snap / cfg.gguf_file)
        else:
            check_model_dir(snap, security, ConfigError, "model.base: ")
        record.update(kind="hub", path=str(snap), revision=snap.name)  # snapshot dirs are named by commit
    directory = Path(record["path"])
    _check_tokenizer(directory, record["gguf_file"], security, value)
    files = defining_files(directory, record["gguf_file"])
    record["files"] = {str(f.relative_to(directory)): f.stat().st_size for f in files}
    record["sha256"] = content_hash(directory, files)
    return record


def base_location(record: dict) -> Path:
    """Where the base's files are now: the recorded directory, or the hub cache's snapshot."""
    if record["kind"] == "hub":
        try:
            return _hub_snapshot(record["base"], record["revision"], record["gguf_file"], local_only=True)
        except OSError:  # not in the local cache: fetch that exact commit
            return _hub_snapshot(record["base"], record["revision"], record["gguf_file"])
    return Path(record["path"])


def check_unchanged(record: dict, directory: Path) -> None:
    """The base's files still have the names and sizes recorded (cheap; the hash was taken once)."""
    from self_improve.errors import ArtifactError

    for name, size in record["files"].items():
        f = directory / name
        if not f.is_file() or f.stat().st_size != size:
            raise ArtifactError(f"{directory}: the base model changed since prepare recorded it ({name}); "
                                "rerun prepare (dvc repro) to start from the new one")


def read_record(model_dir: Path) -> dict:
    from self_improve.errors import ArtifactError

    try:
        record = json.loads((model_dir / BASE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{model_dir / BASE_FILE}: unreadable base record ({err})") from None
    missing = {"kind", "base", "path", "files", "sha256"} - set(record)
    if missing:
        raise ArtifactError(f"{model_dir / BASE_FILE}: not a base record (missing {sorted(missing)})")
    return record
