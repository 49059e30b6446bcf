"""Holding a big batch in little memory: shared strings and byte spools."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Iterable

from .model import DemoError


class SharedStrings:
    """One object for each repeated value: each text (field names, nodes, images, reasons) and
    each dict or list equal to one seen before (a Job's pods share their spec, tolerations,
    volumes, owner, most conditions), so that what thousands of ended pods and events hold
    is mostly what differs between them.

    Thousands of decoded pods and events repeat the same texts and parts, each decoded anew;
    sharing them holds an ended pod in about a tenth of the memory. What is shared must never
    be changed in place (nothing here changes a pod or an event once read). A container is
    known by its kind and its items, each a shared text, a container (by identity: the
    table's entry keeps it alive, so no other object has its id meanwhile) or a number of
    its own type (True, 1 and 1.0 are told apart). One that holds a text seen for the first
    time (a pod's name, its uid) is equal to nothing yet and is not kept. The table is emptied
    when it grows large, so the texts seen only once (uids, revisions) never pile up.
    """

    def __init__(self, most: int = 200_000) -> None:
        self.most = most
        self.table: dict[Any, Any] = {}
        self._first_seen = 0  # texts taken into the table so far

    def share(self, value: Any) -> Any:
        if len(self.table) > self.most:
            self.table.clear()
        return self._share(value)

    def _share(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict):
            before = self._first_seen
            shared = {self._text(key): self._part(item) for key, item in value.items()}
            if self._first_seen != before:
                return shared  # it holds a text never seen before: no other is equal to it yet
            return self.table.setdefault(self._key(dict, shared.items(), True), shared)
        if isinstance(value, list):
            before = self._first_seen
            items = [self._part(item) for item in value]
            if self._first_seen != before:
                return items
            return self.table.setdefault(self._key(list, items, False), items)
        if isinstance(value, tuple):
            parts = [self._share(item) for item in value]
            return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
        return value

    def text(self, text: str) -> str:
        """The one object held for this text (a pod's name kept as a key of many tables)."""
        if len(self.table) > self.most:
            self.table.clear()
        return self._text(text)

    def _text(self, text: str) -> str:
        known = self.table.get(text)
        if known is None:
            self.table[text] = known = text
            self._first_seen += 1
        return known

    def _part(self, value: Any) -> Any:
        """A container's item: most are texts or numbers, taken without a call each."""
        if isinstance(value, str):
            known = self.table.get(value)
            if known is None:
                self.table[value] = known = value
                self._first_seen += 1
            return known
        if value is None or isinstance(value, (int, float)):
            return value
        return self._share(value)

    def texts(self, value: Any) -> Any:
        """The same value with only its texts shared: for values whose containers are all
        their own (an episode's figures), where keeping them to compare would cost memory."""
        if len(self.table) > self.most:
            self.table.clear()
        return self._texts(value)

    def _texts(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.table.setdefault(value, value)
        if isinstance(value, dict):
            return {self._texts(key): self._texts(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            parts = [self._texts(item) for item in value]
            if isinstance(value, list):
                return parts
            return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
        return value

    @staticmethod
    def _key(kind: type, items: Iterable[Any], pairs: bool) -> tuple:
        """What identifies a container whose items are shared already: its kind, then each item."""
        key: list[Any] = [kind]
        for entry in items:
            if pairs:
                key.append(entry[0])
                entry = entry[1]
            if isinstance(entry, (dict, list, tuple)):
                key += (type(entry), id(entry))  # the table's value holds it: its id is its own
            elif isinstance(entry, float):
                key += (float, entry.hex())  # 0.0 and -0.0 are equal, and print apart
            else:
                key += (type(entry), entry)
        return tuple(key)


SPOOL_BUFFER_BYTES = 1 << 20


class Spool:
    """Texts kept on disk by name, the newest of each: what is written whole at the end but
    need not be held in memory until then. `directory`: where (a run's own output directory,
    not a /tmp that may be memory), in a file removed as soon as it is made; `feeds`: the file
    the texts are kept for, named when the disk refuses them (the spool itself has no name)."""

    def __init__(self, directory: str | None = None, feeds: str = "the spool") -> None:
        self.feeds = os.path.join(directory, feeds) if directory else feeds
        try:
            # Texts of a few kilobytes each, put hundreds a second: a buffer of a megabyte makes
            # a write to the disk of every few hundred, where one of 8 kB made one of every two
            # (a system call each, 50 microseconds apiece on a shared VM).
            self._file = tempfile.TemporaryFile(dir=directory, buffering=SPOOL_BUFFER_BYTES)
        except OSError as error:
            raise DemoError(f"cannot write {self.feeds}: {error.strerror or error}") from None
        # name -> offset * 2**32 + length: one number, not a pair, for each of 100,000s of texts
        self._where: dict[str, int] = {}
        self._end = 0
        self._cut = False  # a write failed: the file may go on past _end
        self._unwritten = False  # texts wait in the buffer, not in the file yet
        self._held: dict[str, str] | None = None  # the texts, once moved into memory

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def put(self, name: str, text: str) -> None:
        data = text.encode("utf-8")
        try:
            if self._cut:
                self._file.seek(self._end)
                self._cut = False
            self._file.write(data)
        except OSError as error:
            # A failed write may have left part of the text in the file: the next one goes
            # back to the end as known and writes over it.
            self._cut = True
            raise DemoError(f"cannot write {self.feeds}: {error.strerror or error}") from None
        self._unwritten = True
        self._where[name] = self._end << 32 | len(data)
        self._end += len(data)

    def forget(self, name: str) -> None:
        self._where.pop(name, None)

    def hold_in_memory(self) -> None:
        """Read every text back and close the file: for a spool kept past its batch (its rows of
        episodes.csv while later rounds run), so that a run of many rounds does not keep a file
        and its megabyte of buffer open for each. No text is put after this."""
        if self._held is None:
            self._held = {name: self.get(name) for name in self._where}
            self._file.close()

    def get(self, name: str) -> str:
        if self._held is not None:
            return self._held[name]
        return self.get_bytes(name).decode("utf-8")

    def get_bytes(self, name: str) -> bytes:
        """The text as put, UTF-8 encoded: hundreds of megabytes of pods and events are written
        into their files as read, not decoded and encoded again."""
        if self._held is not None:
            return self._held[name].encode("utf-8")
        offset, length = self._where[name] >> 32, self._where[name] & 0xFFFFFFFF
        if self._unwritten:
            self._file.flush()
            self._unwritten = False
        if not hasattr(os, "pread"):  # Windows: the file's own position, put back for writing
            self._cut = True
            self._file.seek(offset)
            return self._file.read(length)
        # One call for the text alone: a buffered read after a seek reads a whole buffer,
        # and hundreds of thousands of events are read one by one for events.json.
        data = os.pread(self._file.fileno(), length, offset)
        while len(data) < length:
            more = os.pread(self._file.fileno(), length - len(data), offset + len(data))
            if not more:
                break
            data += more
        return data
