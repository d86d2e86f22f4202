"""A small, seeded, learnable English-like corpus for tests and the local run.

Sentences come from a tiny grammar, so a small model's loss falls visibly within
a few dozen steps, and the same seed always gives the same bytes.
"""

from __future__ import annotations

import random
from pathlib import Path

SUBJECTS = ["the cat", "a dog", "the engineer", "my neighbour", "the old ship", "a small robot"]
VERBS = ["sees", "builds", "carries", "paints", "follows", "repairs"]
OBJECTS = ["the red house", "a green boat", "the tall tree", "an empty box", "the quiet river"]
ENDINGS = ["today.", "at night.", "in the rain.", "with care.", "again and again."]


def write_corpus(out_dir: Path, documents: int = 8, sentences: int = 400, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in range(documents):
        lines = [
            " ".join((rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDINGS)))
            for _ in range(sentences)
        ]
        path = out_dir / f"doc_{d:03d}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
