"""The round data a site node last selected from its data file, reused while the file's
bytes are unchanged.

A round reads the data file twice: at consent (``SiteNode.consent``: are the columns there,
are the patient ids usable) and at release (the rows themselves). Parsing a 1000-row file
with 262 response columns costs ~0.15 CPU-s (docs/benchmarks.md, "Secure joint round"), so
the node keeps the round data (x, y, ids) it selected from the file it last parsed.

Why this is safe (the rows used are exactly those of the file *now*):

* every call reads the file's bytes again (at most ``max_bytes`` + 1 of them, after the same
  checks as ``site_node.data.read_table``) and computes their SHA-256; the cache key is the
  resolved path, the format, the size, ``st_mtime_ns`` and that hash. Parsing and row
  selection are pure functions of the bytes and of the round's public arguments (features,
  targets, the data config), so an entry found under the key is what parsing these bytes
  again would give. A file that changed in any byte is parsed afresh (a hash collision of
  SHA-256 is not a concern); size and mtime only make the key explicit.
* a file whose size or mtime changed while it was read is parsed but not kept;
* errors (DataError) are never cached: they are raised again, from a fresh parse, each call;
* the round data handed out has read-only arrays: no caller can alter another round's rows;
* only the selections from one file are kept (the node's one data file; its arrays, not
  the parsed text), in the site's own process, which holds the same rows in memory during
  every round anyway. Nothing of it is sent or logged.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from site_node.config import DataConfig
from site_node.data import (DataError, RoundData, check_file, parse_table,
                            select_joint_round_data, select_round_data)

__all__ = ["DataCache"]


class DataCache:
    """The round data last selected from a node's data file (not its parsed Table: the
    arrays are ~10x smaller than the file's cells as Python strings)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._selected: dict[tuple, RoundData] = {}
        self.parses = 0   # files parsed (a test counts them)

    def _read(self, config: DataConfig) -> tuple[Path, bytes, tuple, bool]:
        """(path, its bytes, their key, whether the file stayed the same while read)."""
        path = check_file(config.path, config.format, config.max_bytes)
        before = os.stat(path)
        with open(path, "rb") as fh:
            limit = config.max_bytes
            raw = fh.read() if limit is None else fh.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise DataError(f"data file {path} grew beyond data.max_bytes = {limit} while it "
                            f"was read", "data file exceeds the site's size limit")
        after = os.stat(path)
        key = (str(path.resolve()), config.format, len(raw), after.st_mtime_ns,
               hashlib.sha256(raw).digest())
        stable = (before.st_size == after.st_size == len(raw)
                  and before.st_mtime_ns == after.st_mtime_ns)
        return path, raw, key, stable

    def _select(self, config: DataConfig, what: tuple, select) -> RoundData:
        path, raw, key, stable = self._read(config)
        wanted = (what, config.id_column, tuple(sorted(config.columns.items())),
                  config.log_patient_ids)
        with self._lock:
            if key == self._key and wanted in self._selected:
                return self._selected[wanted]
        self.parses += 1
        data = select(parse_table(path, config.format, raw))
        data.x.flags.writeable = False
        data.y.flags.writeable = False
        if stable:
            with self._lock:
                if key != self._key:
                    self._key, self._selected = key, {}
                self._selected[wanted] = data
        return data

    def load_round_data(self, config: DataConfig, features, target: str, *,
                        require_ids: bool = False) -> RoundData:
        """``site_node.data.load_round_data`` through the cache."""
        features = list(features)
        return self._select(config, ("one", tuple(features), target, require_ids),
                            lambda table: select_round_data(table, features, target, config,
                                                            require_ids=require_ids))

    def load_joint_round_data(self, config: DataConfig, features, targets, *,
                              require_ids: bool = False) -> RoundData:
        """``site_node.data.load_joint_round_data`` through the cache."""
        features, targets = list(features), list(targets)
        return self._select(config, ("joint", tuple(features), tuple(targets), require_ids),
                            lambda table: select_joint_round_data(table, features, targets,
                                                                  config,
                                                                  require_ids=require_ids))
