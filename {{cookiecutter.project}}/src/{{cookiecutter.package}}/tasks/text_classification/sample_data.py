"""Writes a small, learnable text dataset: RAW/<label>/<n>.txt plus RAW/extra.jsonl, no download.

Five topics (sports, science, business, travel, food) written from templates. Every content word
is drawn from the text's own topic only some of the time; the rest come from shared everyday words
and from the other topics, and a few words belong to two topics ("season", "serve", "market"), so
no single word gives the label away: a model has to weigh the whole text. Lengths run from one
sentence to a few hundred tokens, so some texts are longer than the default `data.seq_len` of 128
and get truncated, as real documents do. The small sample (`--small`, the tests' data) keeps the
same templates with clearer topics, so that a run of a few dozen steps learns them measurably.

It also writes broken inputs that preprocessing rejects (an empty text, a file that is not UTF-8,
a JSON Lines line that is not JSON, one without a label) and a README that it ignores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

TOPICS = {
    "sports": {
        "nouns": [
            "team",
            "match",
            "goal",
            "coach",
            "player",
            "league",
            "season",
            "striker",
            "referee",
            "stadium",
            "tournament",
            "championship",
            "pitch",
            "racket",
            "medal",
            "defender",
            "goalkeeper",
            "trophy",
            "fan",
            "inning",
            "marathon",
            "sprint",
            "playoff",
            "captain",
            "umpire",
            "penalty",
            "halftime",
            "scoreboard",
            "rival",
            "athlete",
            "record",
        ],
        "verbs": [
            "score",
            "defend",
            "kick",
            "tackle",
            "dribble",
            "qualify",
            "celebrate",
            "serve",
            "race",
            "shoot",
            "block",
            "train",
        ],
        "adjectives": ["athletic", "unbeaten", "defensive", "offensive", "olympic", "seeded", "injured", "fit"],
    },
    "science": {
        "nouns": [
            "experiment",
            "laboratory",
            "molecule",
            "researcher",
            "hypothesis",
            "telescope",
            "galaxy",
            "cell",
            "protein",
            "physicist",
            "theory",
            "particle",
            "genome",
            "microscope",
            "sample",
            "observation",
            "climate",
            "fossil",
            "orbit",
            "neuron",
            "enzyme",
            "reactor",
            "vaccine",
            "specimen",
            "asteroid",
            "atom",
            "equation",
            "dataset",
            "chemist",
            "record",
        ],
        "verbs": [
            "measure",
            "observe",
            "discover",
            "analyze",
            "publish",
            "test",
            "simulate",
            "sequence",
            "isolate",
            "detect",
            "calculate",
            "replicate",
        ],
        "adjectives": [
            "empirical",
            "genetic",
            "molecular",
            "theoretical",
            "cosmic",
            "chemical",
            "experimental",
            "quantum",
        ],
    },
    "business": {
        "nouns": [
            "market",
            "investor",
            "share",
            "revenue",
            "profit",
            "startup",
            "merger",
            "quarter",
            "dividend",
            "stock",
            "company",
            "executive",
            "board",
            "earning",
            "inflation",
            "loan",
            "bank",
            "customer",
            "supplier",
            "contract",
            "budget",
            "portfolio",
            "acquisition",
            "forecast",
            "retailer",
            "shareholder",
            "valuation",
            "bond",
            "tariff",
            "record",
        ],
        "verbs": [
            "invest",
            "acquire",
            "negotiate",
            "hire",
            "launch",
            "export",
            "trade",
            "borrow",
            "lend",
            "restructure",
            "merge",
            "sell",
        ],
        "adjectives": [
            "quarterly",
            "profitable",
            "fiscal",
            "corporate",
            "bullish",
            "bearish",
            "wholesale",
            "financial",
        ],
    },
    "travel": {
        "nouns": [
            "flight",
            "airport",
            "passport",
            "hotel",
            "beach",
            "island",
            "tourist",
            "luggage",
            "itinerary",
            "museum",
            "village",
            "railway",
            "cruise",
            "guide",
            "visa",
            "hostel",
            "suitcase",
            "mountain",
            "coast",
            "journey",
            "ticket",
            "destination",
            "backpack",
            "ferry",
            "resort",
            "landmark",
            "souvenir",
            "border",
            "canyon",
            "café",
            "market",
        ],
        "verbs": [
            "book",
            "explore",
            "hike",
            "visit",
            "pack",
            "wander",
            "depart",
            "arrive",
            "sail",
            "travel",
            "cross",
            "train",
        ],
        "adjectives": ["scenic", "remote", "coastal", "crowded", "overnight", "tropical", "historic", "exotic"],
    },
    "food": {
        "nouns": [
            "recipe",
            "kitchen",
            "chef",
            "flavor",
            "sauce",
            "oven",
            "dessert",
            "bread",
            "cheese",
            "soup",
            "garlic",
            "pasta",
            "spice",
            "restaurant",
            "menu",
            "dish",
            "salad",
            "butter",
            "flour",
            "noodle",
            "dumpling",
            "vinegar",
            "tomato",
            "pastry",
            "broth",
            "herb",
            "dough",
            "lemon",
            "chocolate",
            "jalapeño",
            "crème brûlée",
            "café",
            "season",
            "market",
        ],
        "verbs": [
            "bake",
            "cook",
            "simmer",
            "roast",
            "chop",
            "fry",
            "taste",
            "stir",
            "whisk",
            "grill",
            "serve",
            "season",
        ],
        "adjectives": ["spicy", "savory", "crispy", "tender", "sweet", "fresh", "creamy", "bitter"],
    },
}
SHARED = {
    "nouns": [
        "people",
        "year",
        "week",
        "report",
        "plan",
        "city",
        "group",
        "result",
        "day",
        "family",
        "friend",
        "problem",
        "idea",
        "change",
        "story",
        "morning",
        "country",
        "number",
        "photo",
        "weekend",
        "team",
        "season",
    ],
    "verbs": [
        "start",
        "finish",
        "expect",
        "announce",
        "describe",
        "reach",
        "improve",
        "share",
        "follow",
        "prepare",
        "watch",
        "discuss",
    ],
    "adjectives": [
        "new",
        "big",
        "small",
        "local",
        "early",
        "late",
        "important",
        "long",
        "popular",
        "strong",
        "recent",
        "major",
    ],
}
NAMES = [
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Elif",
    "Femi",
    "Gita",
    "Hugo",
    "Iris",
    "Jonas",
    "Kofi",
    "Lena",
    "Mateo",
    "Nadia",
    "Omar",
    "Priya",
    "Rosa",
    "Sven",
    "Tomás",
    "Yuki",
]
WHEN = [
    "last week",
    "this morning",
    "on friday",
    "in the spring",
    "after lunch",
    "for years",
    "again",
    "yesterday",
    "at last",
    "every day",
]
HOW = ["quickly", "carefully", "again", "without a word", "as planned", "at the last minute", "slowly"]
PREPOSITIONS = ["near", "with", "after", "before", "during", "behind", "for", "about"]
TEMPLATES = [
    "the {adj} {noun} {past} the {noun} {prep} the {noun}.",
    "{name} {past} a {adj} {noun} {when}.",
    "many {nouns} {past} {prep} the {adj} {noun}.",
    "according to the {noun}, the {noun} will {verb} the {noun} {when}.",
    "it was a {adj} {noun}, and the {noun} {past} {how}.",
    "{name} said the {noun} {verbs} every {noun}.",
    "why do {nouns} {verb} the {adj} {noun}?",
    "the {noun} is {adj} and the {noun} looks {adj}.",
    "we {past} the {noun} while the {noun} was {ing} {prep} the {noun}.",
    "{name} and {name} {past} the {nouns} {how}.",
    "nobody expected the {noun} to {verb} so {how}.",
]
SHARED_SHARE = 0.2
"""Share of content words drawn from everyday words that carry no topic."""


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _inflect(verb: str, form: str) -> str:
    """Regular English inflections: enough to give the tokenizer shared stems and suffixes."""
    if form == "past":
        if verb.endswith("e"):
            return verb + "d"
        if verb.endswith("y") and verb[-2] not in "aeiou":
            return verb[:-1] + "ied"
        return verb + "ed"
    if form == "ing":
        return (verb[:-1] if verb.endswith("e") and not verb.endswith("ee") else verb) + "ing"
    return verb + ("es" if verb.endswith(("s", "x", "ch", "sh")) else "s")


def _sentence(topic: str, topic_share: float, rng: np.random.Generator) -> str:
    others = [name for name in TOPICS if name != topic]

    def word(kind: str) -> str:
        draw = rng.random()
        if draw < topic_share:
            pool = TOPICS[topic][kind]
        elif draw < topic_share + SHARED_SHARE:
            pool = SHARED[kind]
        else:  # a distractor from another topic
            pool = TOPICS[others[int(rng.integers(len(others)))]][kind]
        return pool[int(rng.integers(len(pool)))]

    fillers = {
        "noun": lambda: word("nouns"),
        "nouns": lambda: _plural(word("nouns")),
        "adj": lambda: word("adjectives"),
        "verb": lambda: word("verbs"),
        "verbs": lambda: _inflect(word("verbs"), "s"),
        "past": lambda: _inflect(word("verbs"), "past"),
        "ing": lambda: _inflect(word("verbs"), "ing"),
        "name": lambda: NAMES[int(rng.integers(len(NAMES)))],
        "when": lambda: WHEN[int(rng.integers(len(WHEN)))],
        "how": lambda: HOW[int(rng.integers(len(HOW)))],
        "prep": lambda: PREPOSITIONS[int(rng.integers(len(PREPOSITIONS)))],
    }
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    parts = template.split("{")
    text = parts[0] + "".join(fillers[part.split("}", 1)[0]]() + part.split("}", 1)[1] for part in parts[1:])
    text = re.sub(r"\ba (?=[aeiou])", "an ", text)
    return text[0].upper() + text[1:]


TOPIC_SHARE = (0.35, 0.75)
"""Range of the share of a text's content words drawn from its own topic (uniform per text)."""
SMALL_TOPIC_SHARE = (0.7, 0.95)
"""The small sample's range: a few hundred texts with clearer topics, so that a run of a few dozen
steps (a quick try, a test) learns them by a clear margin instead of ending near chance."""


def make_text(topic: str, rng: np.random.Generator, topic_share_range: tuple[float, float] = TOPIC_SHARE) -> str:
    """One text about `topic`: 1 to 30 sentences (median 4), in paragraphs."""
    # How clearly a text is on topic varies, as in real data: some are nearly all distractors.
    topic_share = rng.uniform(*topic_share_range)
    sentences = int(np.clip(round(np.exp(rng.normal(np.log(4.0), 0.6))), 1, 30))
    paragraphs, current = [], []
    for _ in range(sentences):
        current.append(_sentence(topic, topic_share, rng))
        if len(current) >= 4 and rng.random() < 0.5:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs) + "\n"


def write_dataset(
    output: Path,
    texts_per_class: int,
    jsonl_lines: int,
    seed: int = 0,
    broken: bool = True,
    topic_share_range: tuple[float, float] = TOPIC_SHARE,
) -> dict:
    """Writes the folder; returns counts of what it wrote."""
    rng = np.random.default_rng(seed)
    output.mkdir(parents=True, exist_ok=True)
    for topic in TOPICS:
        folder = output / topic
        folder.mkdir(exist_ok=True)
        for index in range(texts_per_class):
            (folder / f"{index:05d}.txt").write_text(make_text(topic, rng, topic_share_range), encoding="utf-8")
    labels = list(TOPICS)
    lines = []
    for index in range(jsonl_lines):
        label = labels[int(rng.integers(len(labels)))]
        # JSON Lines usually holds one-paragraph texts; extra keys such as "id" are ignored.
        text = " ".join(make_text(label, rng, topic_share_range).split())
        lines.append(json.dumps({"id": index, "text": text, "label": label}, ensure_ascii=False))
    rejected = 0
    if broken:
        middle = len(lines) // 2
        lines[middle:middle] = [
            "",  # blank lines are skipped, not rejected
            '{"text": "a line cut short by a crashed export',  # not_json
            json.dumps({"text": "Who won the match on friday?"}),  # missing_field: no label
        ]
        (output / labels[0] / "empty.txt").write_text("  \n", encoding="utf-8")
        # Latin-1, not UTF-8: a file saved by an old editor.
        (output / labels[4] / "latin1.txt").write_bytes("The café served a crème brûlée.\n".encode("latin-1"))
        (output / "README.txt").write_text(
            "Sample data: one folder per topic with one text per .txt file, and extra.jsonl with one "
            '{"text": ..., "label": ...} object per line. Text files outside a topic folder, like this '
            "one, are ignored by preprocessing.\n",
            encoding="utf-8",
        )
        rejected = 4
    (output / "extra.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"texts": texts_per_class * len(TOPICS) + jsonl_lines, "classes": len(TOPICS), "rejected": rejected}


def write_sample_data(output: Path, seed: int = 0, small: bool = False) -> str:
    """The task's sample set: 5 x 640 text files + 300 JSON Lines (small: 5 x 50 + 50, with clearer
    topics: SMALL_TOPIC_SHARE)."""
    texts_per_class, jsonl_lines = (50, 50) if small else (640, 300)
    shares = SMALL_TOPIC_SHARE if small else TOPIC_SHARE
    counts = write_dataset(Path(output), texts_per_class, jsonl_lines, seed, topic_share_range=shares)
    return (
        f"wrote {counts['texts']} texts in {counts['classes']} topics to {output}/ "
        f"({texts_per_class} .txt files per topic folder + {jsonl_lines} lines of extra.jsonl), "
        f"+ {counts['rejected']} broken inputs and a README (to show rejection)"
    )
