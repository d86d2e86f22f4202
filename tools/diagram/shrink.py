"""Shrink the construct-tree picture in place: half the pixels, a 64-colour palette (a diagram has few colours).

cdk-dia draws every construct at full size (about 14,000 px wide and 1.8 MB); halved, its labels still read when
zoomed in, and the file stays near 200 KB.

    .venv/bin/python -m tools.diagram.shrink docs/architecture-tree-prod.png
"""

import sys
from pathlib import Path

from PIL import Image

COLOURS = 64


def shrink(png: Path) -> tuple[int, int]:
    before = png.stat().st_size
    with Image.open(png) as image:
        half = image.convert("RGB").resize((image.width // 2, image.height // 2), Image.Resampling.LANCZOS)
    half.quantize(colors=COLOURS).save(png, optimize=True)
    return before, png.stat().st_size


if __name__ == "__main__":
    for name in sys.argv[1:]:
        before, after = shrink(Path(name))
        print(f"{name}: {before // 1024} KiB -> {after // 1024} KiB")
