"""User-facing errors: one line naming the field, the value and what is allowed.

Every entry point catches `UsageError` at the top of `main()` and prints it as a
single line on stderr with exit code 2, so a Batch/EKS job log shows the cause
without a traceback to scroll through.
"""
from __future__ import annotations

import sys
from typing import Any, NoReturn

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem the user can fix: bad flag, missing data, wrong file format."""

    def __init__(self, field: str, value: Any, problem: str, allowed: str = "") -> None:
        self.field, self.value, self.problem, self.allowed = field, value, problem, allowed
        text = f"{field}={value!r}: {problem}"
        if allowed:
            text += f"; allowed: {allowed}"
        super().__init__(text)


def exit_with_usage_error(prog: str, err: UsageError) -> NoReturn:
    # One line, no traceback: the message is the whole diagnosis.
    print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)
