"""The docs as a reader meets them: every relative link of README.md and docs/*.md reaches an existing file and, for
a page, an existing heading; the README links every page, stays a front door, and its first-run command writes a
run file; and the figures the README and the docs state (dev's costs, the gate variants) are their sources'."""

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a `](...)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not `-` or `_`), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    slugs: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M), re.M):
        slug = _slug(heading)
        seen = counts.get(slug, 0)
        counts[slug] = seen + 1
        slugs.add(slug if seen == 0 else f"{slug}-{seen}")  # a repeated heading gets -1, -2, ...
    return slugs


def _targets(doc: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(doc.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", [README, *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in _targets(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert broken == []


def test_the_readme_links_every_doc_page_and_stays_a_front_door():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _targets(README)}
    assert [page.name for page in PAGES if page not in linked] == []
    assert len(README.read_text().splitlines()) <= 300


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_set_up_speaks_on_stderr_so_a_redirected_command_writes_only_its_own_output():
    # On a fresh clone the README's `make -s dataset ... > first-run.json` first sets .venv up: a set-up line on stdout
    # made the run file invalid JSON (seen in a fresh clone's run).
    makefile = (ROOT / "Makefile").read_text()
    echoes = [ln for ln in makefile.splitlines() if ln.lstrip().startswith("@echo")]
    setup = [ln for ln in echoes if "setting up" in ln]
    assert setup and all(ln.rstrip().endswith(">&2") for ln in setup)


def test_the_readmes_first_run_command_writes_a_run_file():
    # The README's first command line that prepares a dataset into a file, run as printed (offline: DRY_RUN=1 prepares
    # and prints without uploading), in a shell of one's own (no parent make's MAKEFLAGS): stdout must be the JSON run
    # file alone, or `pipeline_cli start` refuses the file it was redirected to.
    (line,) = [ln for ln in README.read_text().splitlines() if re.match(r"make .*\bdataset\b.*>", ln)][:1]
    command, _, _ = line.partition(">")
    environment = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        [*shlex.split(command), "DRY_RUN=1"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["dataset"] == "datasets/sample/" and "baseline" in run


def _offline() -> dict[str, str]:
    """A shell of one's own (no parent make's MAKEFLAGS) with no AWS credentials anywhere it could find them."""
    kept = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS") and "AWS" not in k}
    missing = "/nonexistent/aws"
    return {
        **kept,
        "AWS_CONFIG_FILE": missing,
        "AWS_SHARED_CREDENTIALS_FILE": missing,
        "AWS_EC2_METADATA_DISABLED": "1",
    }


def _run(line: str) -> subprocess.CompletedProcess:
    return subprocess.run(shlex.split(line), cwd=ROOT, env=_offline(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two dry runs synthesize dev
def test_the_readmes_offline_commands_work_as_printed_without_credentials(tmp_path):
    # The README's commands that need no AWS account, as printed: its first run's file and that file's quote, and the
    # dry runs of deploy (its code block) and destroy (the line that names DRY_RUN=1 for it).
    readme = README.read_text()
    (dataset,) = [ln for ln in readme.splitlines() if re.match(r"make .*\bdataset\b.*>", ln)][:1]
    run_file = tmp_path / "first-run.json"
    prepared = _run(dataset.partition(">")[0] + " DRY_RUN=1")
    assert prepared.returncode == 0, prepared.stderr
    run_file.write_text(prepared.stdout)
    (quote,) = re.findall(r"`(make quote ENV=dev RUN=first-run\.json)`", readme)
    quoted = _run(quote.replace("first-run.json", str(run_file)))
    assert quoted.returncode == 0, quoted.stdout + quoted.stderr
    assert [ln for ln in quoted.stdout.splitlines() if ln.startswith("quote: ~$")], quoted.stdout
    assert "not held to it here" in quoted.stdout  # says it read no budget, never that the budget pays
    (deploy,) = [ln.partition("#")[0].strip() for ln in readme.splitlines() if ln.startswith("make deploy ENV=dev DRY")]
    assert "`make destroy ENV=dev` (`DRY_RUN=1` for the plan" in readme
    for line in (deploy, "make destroy ENV=dev DRY_RUN=1"):
        done = _run(f"make -s {line.removeprefix('make ')}")
        assert done.returncode == 0, f"{line}: {done.stderr}"
        assert "would run:" in done.stdout + done.stderr and "credentials" not in done.stderr.lower(), line


def _block(page: Path, name: str) -> str:
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", page.read_text(), re.S)
    assert found is not None, f"{page.name} has no {name} block"
    return found.group(1)


def test_the_readmes_cost_of_dev_is_the_cost_reports():
    # Both blocks are held to tools/standing_cost.py and tools/cost_report.py by their own tests
    # (test_standing_cost.py, test_cost_report.py); the README's figures are read from them.
    guide = ROOT / "docs" / "operators-guide.md"
    dev_table = _block(guide, "standing-cost").split("\n\n")[0]
    assert dev_table.startswith("| dev (us-east-1) | batch | eks | sagemaker |")
    total = re.search(
        r"^\| \*\*total per month\*\* \| \*\*(\S+)\*\* \| \*\*(\S+)\*\* \| \*\*(\S+)\*\* \|$", dev_table, re.M
    )
    assert total is not None
    batch, eks, sagemaker = total.groups()
    dev = re.search(
        r"^dev \(us-east-1\): batch, (\d+) x (\S+), .*?\n  cluster on-demand : \d+ x \S+ = (\$[\d.,]+)/h",
        _block(guide, "cost-report-environments"),
        re.S | re.M,
    )
    assert dev is not None
    nodes, instance_type, hourly = dev.groups()
    readme = _flat(README)
    assert batch == sagemaker and f"dev costs **{batch} a month** on Batch and SageMaker, **{eks}** on EKS" in readme
    assert f"its nodes add **{hourly}/h** ({nodes} × {instance_type} on demand, us-east-1 list price)" in readme
    assert f"`dev` is {nodes} × {instance_type} on AWS Batch in us-east-1" in readme


def test_the_readmes_other_figures_are_their_sources():
    # The EKS cluster's price, dev's file system and the first run's baseline, as the README states them.
    from config import load_config
    from config.standing_prices import EKS_CLUSTER
    from tests.synthesis import context

    readme, dev = _flat(README), load_config(context(env="dev"))
    cluster = EKS_CLUSTER[dev.region]
    assert cluster.unit == "hour" and f"a cluster (${cluster.usd:.2f}/h) and 2 system nodes" in readme
    assert f"with a {dev.fsx_storage_gib / 1024:.1f} TiB FSx file system" in readme
    assert f"the {dev.fsx_storage_gib / 1024:.1f} TiB file system" in readme
    baseline = json.loads((ROOT / "examples" / "run.json").read_text())["baseline"]
    assert f"(`examples/run.json` for `NAME=sample`) says what the model must beat: `baseline` {baseline:g}," in readme


def test_every_range_of_gpt_sizes_the_docs_state_ends_at_the_largest():
    # "tiny to 13b" stayed in two pages after 30b and 70b were added. sizes.py imports nothing (no torch): read as data.
    sizes = (ROOT / "training_image" / "efa_training" / "workloads" / "gpt" / "sizes.py").read_text()
    table = sizes[sizes.index("MODEL_SIZES: ") : sizes.index("\n}\n", sizes.index("MODEL_SIZES: "))]
    largest = re.findall(r'^    "([\w.]+)": ', table, re.M)[-1]
    stated = [
        (doc.name, end.lower())
        for doc in [README, *PAGES]
        for end in re.findall(r"\btiny`? to `?(\w+)", doc.read_text())
        if not end.startswith("ctr")
    ]
    assert stated and [(name, end) for name, end in stated if end != largest] == []


def test_the_gate_variants_the_docs_count_are_the_suites():
    from config import efa_instance_types
    from tests.synthesis import BACKENDS, ENVIRONMENTS, app_variants
    from tests.test_gates import SCANNED

    variants = app_variants()
    stated = re.search(
        r"\((\d+) gate variants: (\d+) environments × (\d+) backends, (\d+) types × (\d+) backends, and the managed "
        r"tracking server on each of the (\d+) backends;",
        _flat(ROOT / "docs" / "verification.md"),
    )
    assert stated is not None
    total, environments, backends, types, per_type, tracked = map(int, stated.groups())
    assert (environments, backends, types, per_type, tracked) == (
        len(ENVIRONMENTS),
        len(BACKENDS),
        len(efa_instance_types()),
        len(BACKENDS),
        len([v for v in variants if "tracking_server" in v]),
    )
    assert total == len(variants) == environments * backends + types * per_type + tracked
    development, verification = _flat(ROOT / "docs" / "development.md"), _flat(ROOT / "docs" / "verification.md")
    assert f"the gate runs over the {len(variants)} variants" in development
    scanned, with_server = len(SCANNED), len([v for v in SCANNED if "tracking_server" in v])
    assert (
        f"the {scanned} environment × backend variants ({with_server} with the managed tracking server)" in development
    )
    assert f"the {scanned} environment × backend variants ({with_server} of them with the managed" in verification
