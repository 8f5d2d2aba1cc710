"""Reading a slot child's messages from its pipe in bulk."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any


class Frames:
    """The child-to-parent side of a slot's pipe, read in bulk.

    ``multiprocessing.Connection`` reads a message in two system calls (its length,
    then its bytes). With several outcomes waiting after a batch of short jobs, this
    reads whatever is there in one call and cuts it into messages (the same framing:
    a 4-byte big-endian length, or -1 and an 8-byte length for huge ones; a pickle).
    Only called when the pipe is readable. A message cut short is read to its end (the
    child is writing it); EOF ends the read with the messages that were whole.
    """

    CHUNK = 1 << 16

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.emptied = False
        """The last read took less than ``CHUNK``: everything written before it began
        was read (no need to ask the pipe whether more waits)."""

    def read(self) -> list[Any]:
        """Every whole message waiting; raises EOFError when the child's end is closed
        and nothing was waiting."""
        self._fill()
        messages: list[Any] = []
        done = 0  # bytes of the buffer already cut into messages (dropped once, at the end)
        try:
            while done < len(self.buffer):
                frame = self._frame(done)
                if frame is None:
                    self._fill()  # the rest of a message is on its way
                    continue
                start, done = frame
                messages.append(pickle.loads(self.buffer[start:done]))  # noqa: S301 - our own child's messages
        except EOFError:
            if not messages:
                raise
        finally:
            del self.buffer[:done]
        return messages

    def _fill(self) -> None:
        data = os.read(self.fd, self.CHUNK)
        if not data:
            raise EOFError
        self.emptied = len(data) < self.CHUNK
        self.buffer += data

    def _frame(self, at: int) -> tuple[int, int] | None:
        """Where the pickle of the message at ``at`` starts and ends, if it is whole."""
        if len(self.buffer) < at + 4:
            return None
        (size,) = struct.unpack_from("!i", self.buffer, at)
        start = at + 4
        if size == -1:
            if len(self.buffer) < at + 12:
                return None
            (size,) = struct.unpack_from("!Q", self.buffer, at + 4)
            start = at + 12
        end = start + size
        return (start, end) if len(self.buffer) >= end else None


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass
