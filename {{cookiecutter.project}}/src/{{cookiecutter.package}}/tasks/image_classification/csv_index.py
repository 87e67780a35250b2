"""A CSV index as raw input, in the Vertex AI import format: one image per row, `[ML_USE,]PATH,LABEL`.

    training,gs://bucket/images/cat_001.jpg,cat      # ML_USE decides the split
    images/dog_017.png,dog                           # no ML_USE: the stable path hash decides

PATH is a local path or a gs:// URI, absolute or relative to the CSV's folder. ML_USE `training`
sends the row to train, `validation` and `test` to eval (this template has one held-out split).
A row that cannot become an example is rejected with its reason, like a bad image: the wrong
number of columns, an unknown ML_USE, an empty label (as `index.csv:LINE`), and a file that does
not exist (as its path, when the image is read).

The index is one Beam work item. The images it names are read in the encoding step, where a
missing file is rejected: until then an example is a path, not pixels, while preprocessing gathers
the labels and split sizes.
"""

from __future__ import annotations

import csv
import io
import posixpath
from typing import Iterator

from ...core.task import RawExample, RawRejection

SUFFIX = ".csv"
ML_USE_SPLITS = {"training": "train", "validation": "eval", "test": "eval"}
REJECT_REASONS = {
    "bad_row": "a CSV row that is not [ML_USE,]PATH,LABEL (wrong number of columns, or no path)",
    "bad_ml_use": "ML_USE is not training, validation or test",
    "empty_label": "a CSV row without a label",
    "missing": "the image file a CSV row names does not exist",
}


def is_index(raw: str) -> bool:
    return raw.lower().endswith(SUFFIX)


def is_full_path(path: str) -> bool:
    """A URI (gs://...) or an absolute local path: used as is, not under the CSV's folder."""
    return "://" in path or path.startswith("/")


def read_rows(index_location: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
    """The examples (payload: where to read the image) and the rejected rows of one index file."""
    folder, name = posixpath.split(index_location)
    try:
        text = raw_bytes.decode("utf-8-sig")  # utf-8-sig: spreadsheet exports start with a byte-order mark
    except UnicodeDecodeError as error:
        yield RawRejection(name, "bad_row", f"{REJECT_REASONS['bad_row']}: the file is not UTF-8 text ({error})")
        return
    for line, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [cell.strip() for cell in row]
        if not any(cells):
            continue  # blank lines are layout, not rows
        where = f"{name}:{line}"
        if len(cells) == 2 and cells[0].lower() in ML_USE_SPLITS:
            yield RawRejection(where, "empty_label", f"{REJECT_REASONS['empty_label']}: {','.join(row)!r}")
            continue
        if len(cells) not in (2, 3) or not cells[-2]:
            yield RawRejection(where, "bad_row", f"{REJECT_REASONS['bad_row']}: {','.join(row)!r}")
            continue
        ml_use, path, label = cells if len(cells) == 3 else ("", *cells)
        if ml_use and ml_use.lower() not in ML_USE_SPLITS:
            yield RawRejection(where, "bad_ml_use", f"{REJECT_REASONS['bad_ml_use']}: {ml_use!r}")
        elif not label:
            yield RawRejection(where, "empty_label", f"{REJECT_REASONS['empty_label']}: {','.join(row)!r}")
        else:
            # The source is the path as written: its hash (the split when there is no ML_USE) does
            # not change when the dataset moves with its index.
            location = path if is_full_path(path) else f"{folder}/{path}"
            yield RawExample(path, label, location, split=ML_USE_SPLITS.get(ml_use.lower()))


def read_image(location: str) -> bytes | None:
    """The bytes of the image a row names, or None when no such file exists. Other read errors
    raise, so that the runner retries them rather than rejecting a file that exists."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(location, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return handle.read()
    except Exception:
        if not FileSystems.exists(location):
            return None
        raise
