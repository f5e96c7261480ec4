"""An output file written in one sequential pass, every byte hashed and counted as it is
written: what the exports record (a file's size and SHA-256) is what went to the file,
without reading it again. The writers of export's files (llama.cpp's GGUF, the checkpoints'
model.safetensors) build on it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dspark_convert.util.atomic import write_error


class HashedOutput:
    """``put(data)``: ``data`` written to ``fh``, then added to ``digest`` (SHA-256) and
    ``size``; an OSError is the output's one-line write error naming ``shown`` (the path
    the user asked for, not the temporary file written)."""

    def __init__(self, fh, shown: Path) -> None:
        self.fh, self.shown = fh, shown
        self.digest = hashlib.sha256()
        self.size = 0

    def put(self, data) -> None:
        try:
            self.fh.write(data)
        except OSError as exc:
            raise write_error(exc, self.shown) from None
        self.digest.update(data)
        self.size += len(data)
