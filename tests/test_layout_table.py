"""The layout table (docs/users-guide.md, "Choosing a layout") is the one tools/layout_table.py computes from the
training image's memory estimate and the catalogue: no figure written twice."""

from pathlib import Path

from tools.layout_table import table

README = Path(__file__).resolve().parent.parent / "docs" / "users-guide.md"  # moved from README.md


def test_the_readme_layout_table_is_the_estimates():
    text = README.read_text()
    shown = text[text.index("<!-- layout-memory:start -->\n") + 29 : text.index("<!-- layout-memory:end -->")]
    assert shown.strip() == table()


def test_13b_at_the_default_batch_needs_tensor_parallelism_on_p5():
    # Cells: "GB at micro-batch 1 / GB at 8", struck through (~~) above 80 GB. 13b at 8 fits from tp 4 on.
    cells = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:5] for line in table().splitlines()[2:]}
    at_eight = [cell.split(" / ")[1] for cell in cells["13b"]]
    assert [gb.startswith("~~") for gb in at_eight] == [True, True, False, False]
