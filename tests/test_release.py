"""The release's facts: a licence, one version that the CLI, the training image and the changelog agree on, and
the CLI's --region accepted before or after the subcommand."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import pipeline_cli

ROOT = Path(__file__).resolve().parent.parent


def _version() -> str:
    found = re.search(r'^VERSION = "([^"]+)"', (ROOT / "training_image" / "version.py").read_text(), re.MULTILINE)
    assert found
    return found.group(1)


def test_the_licence_is_apache_2():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence and (ROOT / "NOTICE").is_file()


def test_the_changelog_and_the_readme_name_the_version():
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings and headings[0] == _version()
    assert f"**Status**: release {_version()} " in (ROOT / "README.md").read_text()  # the README's first screen


def test_the_cli_reports_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        pipeline_cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"efa-training {_version()}"


def test_the_training_image_reports_the_same_version():
    # launch.py is the image's entry point; version.py is copied into the image with it (COPY *.py).
    run = subprocess.run(
        [sys.executable, str(ROOT / "training_image" / "launch.py"), "--version"], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == f"efa-training {_version()}", run.stderr


def test_region_is_accepted_before_or_after_the_subcommand():
    parse = pipeline_cli.parser().parse_args
    assert parse(["--region", "eu-west-1", "list", "dev"]).region == "eu-west-1"
    assert parse(["list", "dev", "--region", "eu-west-1"]).region == "eu-west-1"
    assert parse(["describe", "dev", "x"]).region is None
