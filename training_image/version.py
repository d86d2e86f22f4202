"""The platform's release: the one place it is written. The CLI (tools/pipeline_cli.py --version) and the training
image (launch.py --version, from this file copied into the image) report it; CHANGELOG.md's newest heading names it."""

VERSION = "0.13.2"
