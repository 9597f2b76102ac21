"""Where the CLI and the SDK find the platform's URL and an API token.

`OGAI_URL` and `OGAI_TOKEN` in the environment win (jobs and CI set them); otherwise the file
`$XDG_CONFIG_HOME/ogai/config.json` (default `~/.config/ogai/config.json`) that `ogai login`
writes. The file holds a secret, so it is written with mode 0600 in a 0700 folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "OGAI_URL"
TOKEN_ENV = "OGAI_TOKEN"


class ConfigError(Exception):
    """The config file cannot be read or written; the message says which file and why."""


@dataclass(frozen=True)
class Config:
    url: str | None = None
    token: str | None = None


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    # The XDG spec says to ignore a relative path.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "ogai"


def config_path() -> Path:
    return config_dir() / "config.json"


def read_file_config(path: Path | None = None) -> Config:
    path = path or config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Config()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; fix it or run `ogai login` again") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; delete it and run `ogai login`")
    url, token = data.get("url"), data.get("token")
    return Config(url=url if isinstance(url, str) and url else None,
                  token=token if isinstance(token, str) and token else None)


def load_config(path: Path | None = None) -> Config:
    """The file's values, each overridden by its environment variable when set (the file is
    not read at all when both are)."""
    url, token = os.environ.get(URL_ENV), os.environ.get(TOKEN_ENV)
    stored = Config() if url and token else read_file_config(path)
    return Config(url=url or stored.url, token=token or stored.token)


def save_config(config: Config, path: Path | None = None) -> Path:
    """Write the file atomically with mode 0600 (the temporary file is 0600 from the start, so
    the token is never readable by others, not even for a moment)."""
    path = path or config_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"url": config.url, "token": config.token}, handle, indent=2)
                handle.write("\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    return path
