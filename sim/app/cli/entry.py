"""How a ``kvsim`` command ends: its exit code and the one line it prints on bad input or
Ctrl-C (every entry point, ``kvsim`` and ``python -m sim.app.cli.serve`` alike).

Exit codes: 0 success, 2 bad input (config, file, arguments: one line naming the field),
130 interrupted (Ctrl-C), 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvsim.errors import KvsimError
from sim.app.console import make_console

EXIT_BAD_INPUT = 2
#: The shell's code for a command stopped by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` and run the command it names (``args.func(args,
    console)``): its exit code, :data:`EXIT_BAD_INPUT` with one line on a
    :class:`~kvsim.errors.KvsimError`, :data:`EXIT_INTERRUPTED` on Ctrl-C."""
    args = parser.parse_args(argv)
    console = make_console()
    try:
        return args.func(args, console)
    except KvsimError as err:
        print(f"kvsim: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # output files are written atomically: each is its old or its new self, whole
        print("kvsim: interrupted; no output file was left half-written", file=sys.stderr)
        return EXIT_INTERRUPTED
