"""The README's layout table (README, "Choosing a layout") is the one tools/layout_table.py computes from the training
image's memory estimate and the catalogue: no figure written twice."""

from pathlib import Path

from tools.layout_table import table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_layout_table_is_the_estimates():
    text = README.read_text()
    shown = text[text.index("<!-- layout-memory:start -->\n") + 29 : text.index("<!-- layout-memory:end -->")]
    assert shown.strip() == table()


def test_the_largest_sizes_need_tensor_parallelism_on_p5():
    # 70b on 8 p5 nodes fits only split over a node's GPUs; 30b not at all on one node.
    rows = {line.split(" | ")[0].strip("| "): line for line in table().splitlines()[2:]}
    assert "does not fit" in rows["70b"].split(" | ")[2] and "tp 1:" not in rows["70b"]
    assert rows["30b"].split(" | ")[1] == "does not fit"
