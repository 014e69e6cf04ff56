"""Tuned Configs in a file: what `python -m ep_rt tune` writes and, when EP_RT_CONFIG_FILE names it,
Buffer.get_dispatch_config / get_combine_config return (for the rank counts it has; the built-in tables otherwise).

    {"format": "ep_rt-config", "version": 1,
     "configs": [{"kind": "dispatch", "num_ranks": 2, "num_sms": 24, "num_max_nvl_chunked_send_tokens": 6,
                  "num_max_nvl_chunked_recv_tokens": 256, "num_max_rdma_chunked_send_tokens": 6,
                  "num_max_rdma_chunked_recv_tokens": 128}, ...],
     "tuned": {...}}   # free-form: how the values were found (ignored when loading)

Every entry is checked when the file is read (a Config is built from it, so its rules apply); any problem is a
ConfigFileError naming the file and the entry. A file is read again only when it changes (get_dispatch_config
runs on every call of some clients).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields

from . import env
from .config import Config
from .errors import ConfigFileError

FORMAT, VERSION = "ep_rt-config", 1
KINDS = ("dispatch", "combine")
CONFIG_FIELDS = tuple(f.name for f in fields(Config))
ENTRY_KEYS = ("kind", "num_ranks") + CONFIG_FIELDS

_cache: dict = {}  # path -> ((mtime_ns, size), configs)


def entry(kind: str, num_ranks: int, config: Config) -> dict:
    return {"kind": kind, "num_ranks": num_ranks, **{name: getattr(config, name) for name in CONFIG_FIELDS}}


def document(entries: list, tuned: dict | None = None) -> dict:
    """The file's content for these entries; checked as a loaded file would be."""
    doc = {"format": FORMAT, "version": VERSION, "configs": list(entries), "tuned": tuned or {}}
    parse(doc, "<new config file>")
    return doc


def write(path, entries: list, tuned: dict | None = None) -> None:
    doc = document(entries, tuned)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def parse(doc, where: str) -> dict:
    """{(kind, num_ranks): Config} of a file's content, or ConfigFileError saying what is wrong and where."""

    def bad(what):
        return ConfigFileError(
            f"{where}: {what} (see ep_rt/config_file.py for the format; `python -m ep_rt tune` writes such files)"
        )

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise bad(f'not an ep_rt config file: it must be a JSON object with "format": "{FORMAT}"')
    if doc.get("version") != VERSION:
        raise bad(f"version {doc.get('version')!r}; this ep_rt reads version {VERSION}")
    if not isinstance(doc.get("configs"), list):
        raise bad('"configs" must be a list of entries')
    configs = {}
    for i, e in enumerate(doc["configs"]):
        name = f"configs[{i}]"
        if not isinstance(e, dict):
            raise bad(f"{name} must be an object")
        missing = [k for k in ENTRY_KEYS if k not in e]
        unknown = sorted(set(e) - set(ENTRY_KEYS))
        if missing or unknown:
            raise bad(
                f"{name}: "
                + "; ".join(
                    ([f"missing {missing}"] if missing else []) + ([f"unknown keys {unknown}"] if unknown else [])
                )
            )
        if e["kind"] not in KINDS:
            raise bad(f"{name}: kind must be one of {list(KINDS)}, got {e['kind']!r}")
        if not isinstance(e["num_ranks"], int) or isinstance(e["num_ranks"], bool) or e["num_ranks"] < 1:
            raise bad(f"{name}: num_ranks must be a positive int, got {e['num_ranks']!r}")
        key = (e["kind"], e["num_ranks"])
        if key in configs:
            raise bad(f"{name}: a second {e['kind']} entry for {e['num_ranks']} ranks")
        try:
            configs[key] = Config(**{k: e[k] for k in CONFIG_FIELDS})
        except (TypeError, ValueError) as err:
            raise bad(f"{name}: {err}") from None
    return configs


def load(path) -> dict:
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigFileError(f"EP_RT_CONFIG_FILE={path}: cannot read it ({e.strerror})") from None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as e:
        raise ConfigFileError(f"{path}: not valid JSON ({e})") from None
    configs = parse(doc, path)
    _cache[path] = (stamp, configs)
    return configs


def lookup(kind: str, num_ranks: int) -> Config | None:
    """The Config EP_RT_CONFIG_FILE holds for (kind, num_ranks); None when no file is named or it has none."""
    path = env.config_file()
    if path is None:
        return None
    return load(path).get((kind, num_ranks))
