"""Writes a small, learnable corpus of unlabelled documents: RAW/stories/<n>.txt plus RAW/extra.jsonl,
no download.

Each document is a short story from a small probabilistic grammar: a character with a name, a
pronoun that agrees with it (she/her, he/his) throughout, a kind of animal and a home place that
come back later in the story, and sentences drawn from templates in a loose order. Word frequencies
alone (a unigram model) predict it poorly; a model that reads the context predicts most tokens:
which pronoun follows, which place the character returns to, how a sentence ends.

It also writes broken inputs that preprocessing rejects (an empty text, a file that is not UTF-8, a
JSON Lines line that is not JSON, one without a `text`) and a file that is not raw input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = {
    "she": ["Mia", "Lena", "Ruth", "Alma", "Nora", "Iris", "Vera", "Clara", "Ella", "Rosa", "Ida", "Maya"],
    "he": ["Tom", "Leo", "Max", "Ben", "Otto", "Finn", "Hugo", "Sam", "Paul", "Ivan", "Noah", "Carl"],
}
POSSESSIVE = {"she": "her", "he": "his"}
ANIMALS = ["fox", "rabbit", "mouse", "bear", "owl", "duck", "badger", "otter", "hedgehog", "deer"]
PLACES = ["forest", "meadow", "river", "hill", "village", "garden", "valley", "lake"]
OBJECTS = ["ball", "hat", "kite", "box", "apple", "shell", "book", "lamp", "drum", "boat"]
COLOURS = ["red", "blue", "green", "yellow", "small", "old", "shiny", "round"]
FAMILY = ["mother", "father", "sister", "brother", "grandmother"]
TIMES = ["morning", "evening", "afternoon", "night"]
MOODS = ["happy", "tired", "proud", "curious", "sleepy"]

OPENING = "{Name} was a little {animal} who lived near the {place}."
MIDDLE = [
    "Every {time}, {pronoun} walked to the {place} with {her} {family}.",
    "One day {pronoun} found a {colour} {object} under a tree.",
    "{Pronoun} picked up the {object} and carried it home.",
    "{Her} {family} said that the {object} was very {colour}.",
    "{Name} liked the {place} more than anything.",
    "In the {time} {pronoun} sat by the {place} and sang a song.",
    "{Pronoun} gave the {object} to {her} {family}.",
    "The other animals of the {place} came to see the {object}.",
]
CLOSING = "At the end of the day {Name} went back to the {place}, {mood} and {mood2}."


def make_story(rng: np.random.Generator) -> str:
    """One story: the opening, 2 to 9 middle sentences (some repeated), the closing."""
    pronoun = "she" if rng.random() < 0.5 else "he"

    def pick(pool: list[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    slots = {
        "Name": pick(NAMES[pronoun]),
        "pronoun": pronoun,
        "Pronoun": pronoun.capitalize(),
        "her": POSSESSIVE[pronoun],
        "Her": POSSESSIVE[pronoun].capitalize(),
        "animal": pick(ANIMALS),
        "place": pick(PLACES),
        "object": pick(OBJECTS),
        "colour": pick(COLOURS),
        "family": pick(FAMILY),
        "time": pick(TIMES),
        "mood": pick(MOODS),
    }
    slots["mood2"] = pick([mood for mood in MOODS if mood != slots["mood"]])
    middle = [pick(MIDDLE) for _ in range(int(rng.integers(2, 10)))]
    return " ".join(sentence.format(**slots) for sentence in [OPENING, *middle, CLOSING]) + "\n"


def write_dataset(output: Path, files: int, jsonl_lines: int, seed: int = 0, broken: bool = True) -> dict:
    """Writes the folder; returns counts of what it wrote."""
    rng = np.random.default_rng(seed)
    stories = output / "stories"
    stories.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        (stories / f"{index:05d}.txt").write_text(make_story(rng), encoding="utf-8")
    # JSON Lines usually holds one document per line; extra keys such as "id" are ignored.
    lines = [json.dumps({"id": index, "text": make_story(rng).strip()}) for index in range(jsonl_lines)]
    rejected = 0
    if broken:
        middle = len(lines) // 2
        lines[middle:middle] = [
            "",  # blank lines are skipped, not rejected
            '{"text": "a line cut short by a crashed export',  # not_json
            json.dumps({"title": "A story without its text"}),  # missing_field: no text
        ]
        (stories / "empty.txt").write_text("  \n", encoding="utf-8")
        # Latin-1, not UTF-8: a file saved by an old editor.
        (stories / "latin1.txt").write_bytes("The café served a crème brûlée.\n".encode("latin-1"))
        (output / "NOTES.md").write_text(
            "Sample data: one story per .txt file under stories/, and extra.jsonl with one "
            '{"text": ...} object per line. Files that are neither, like this one, are ignored.\n',
            encoding="utf-8",
        )
        rejected = 4
    (output / "extra.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"documents": files + jsonl_lines, "rejected": rejected}


def write_sample_data(output: Path, seed: int = 0, small: bool = False) -> str:
    """The task's sample set: 3000 story files + 500 JSON Lines (small: 250 + 50)."""
    files, jsonl_lines = (250, 50) if small else (3000, 500)
    counts = write_dataset(Path(output), files, jsonl_lines, seed)
    return (
        f"wrote {counts['documents']} documents to {output}/ ({files} .txt files under stories/ + "
        f"{jsonl_lines} lines of extra.jsonl), + {counts['rejected']} broken inputs and a file that is ignored"
    )
