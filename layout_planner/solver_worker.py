"""The CP-SAT worker process: ``python -m layout_planner.solver_worker``.

Reads ``(IntegerProgram, SolveParams)`` messages on stdin and answers each with
``(True, ProgramResult)`` or ``(False, error text)`` on stdout, until stdin
closes.  It imports OR-tools and the planner's pure modules only (never
TensorFlow); see :mod:`layout_planner.solver_process` for why it exists.
"""

from __future__ import annotations

import sys
import traceback


def main() -> int:
    from layout_planner.cpsat import solve_program
    from layout_planner.solver_process import read_request, write_message

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            program, params = read_request(stdin)
        except EOFError:
            return 0
        reply: tuple[bool, object]
        try:
            reply = (True, solve_program(program, params))
        except Exception:  # report every failure to the parent, keep serving
            reply = (False, traceback.format_exc())
        write_message(stdout, reply)


if __name__ == "__main__":
    sys.exit(main())
