"""The rows of finished tasks on disk, so that a long ``dpfed evaluate`` survives being stopped.

The full protocol runs for more than an hour on a small machine; a run that only writes its
results at the end loses everything to a reboot or a Ctrl-C. ``TaskJournal`` appends the rows
of every finished task to ``<out>/tasks.jsonl`` (one JSON line per task, flushed and fsynced),
and ``dpfed evaluate --resume`` reads it back and runs only the tasks it does not hold.

The journal's first line describes the run (``fingerprint``: the protocol configuration, the
methods, the drugs and the chunking of repeats into tasks). Resuming with a different
description is refused rather than mixing two experiments in one table. A last line cut short
by a crash is dropped (its task runs again); any other damage is an error, never skipped
silently.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["JOURNAL_NAME", "JournalMismatch", "TaskJournal", "fingerprint", "task_key"]

JOURNAL_NAME = "tasks.jsonl"
_FORMAT = "dpfed-evaluate-journal/1"


class JournalMismatch(ValueError):
    """The journal on disk belongs to another run (or is damaged)."""


def task_key(drug: int, repeats: Iterable[int]) -> tuple[int, tuple[int, ...]]:
    return int(drug), tuple(int(r) for r in repeats)


def fingerprint(config, methods: Sequence[str], tasks) -> dict:
    """What must agree for rows of two invocations to belong to one table."""
    return {"format": _FORMAT, "config": dataclasses.asdict(config), "methods": list(methods),
            "tasks": [[t.drug, list(t.repeats)] for t in tasks]}


class TaskJournal:
    """Append-only journal of finished tasks in ``out_dir``.

    ``open(resume=False)`` starts a new journal (an existing one is replaced);
    ``open(resume=True)`` keeps the rows already there when the fingerprint matches.
    ``done`` maps each task key read back by ``open(resume=True)`` to its rows; ``record``
    only appends to the file (the caller already holds the rows it records, and a full run's
    two million rows need not be held twice).
    """

    def __init__(self, out_dir, description: dict):
        self.path = Path(out_dir) / JOURNAL_NAME
        self.description = json.loads(json.dumps(description))  # tuples -> lists, as on disk
        self.done: dict[tuple[int, tuple[int, ...]], list[dict]] = {}
        self._fh = None

    def open(self, *, resume: bool) -> "TaskJournal":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            self._read()
            self._fh = open(self.path, "a", encoding="utf-8")
        else:
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"run": self.description}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self._fh = open(self.path, "a", encoding="utf-8")
        return self

    def _read(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # a file ending in "\n" has an empty tail
        if not complete:
            raise JournalMismatch(f"{self.path}: no run description; remove it to start afresh")
        try:
            head = json.loads(complete[0])
        except ValueError:
            raise JournalMismatch(f"{self.path}: line 1 is not JSON") from None
        if head.get("run") != self.description:
            raise JournalMismatch(
                f"{self.path} belongs to a run with other settings (configuration, methods, "
                "drugs or repeats per task); use another --out or run without --resume")
        for number, line in enumerate(complete[1:], start=2):
            try:
                entry = json.loads(line)
                key = task_key(entry["task"][0], entry["task"][1])
                rows = list(entry["rows"])
            except (ValueError, KeyError, TypeError, IndexError):
                raise JournalMismatch(f"{self.path}: line {number} is damaged") from None
            self.done[key] = rows
        if tail:
            # A task whose line was cut short by a crash: drop it, it runs again.
            with open(self.path, "r+b") as fh:
                fh.truncate(len(raw) - len(tail))

    def record(self, drug: int, repeats: Iterable[int], rows: Sequence[dict]) -> None:
        """Append one finished task; durable when this returns."""
        if self._fh is None:
            raise RuntimeError("open the journal first")
        key = task_key(drug, repeats)
        self._fh.write(json.dumps({"task": [key[0], list(key[1])], "rows": list(rows)}) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
