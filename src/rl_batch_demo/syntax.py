"""Checking an episode script's syntax before it is shipped, for the Python of its image."""

from __future__ import annotations

import io
import sys
import tokenize
import warnings

from .model import DemoError

# The newest Python whose syntax a script may hold (3.14: t-strings, `except A, B:`). The image's
# Python is not known before its pods run: a local Python at least this new refuses every error
# it finds; an older one refuses only what its tokenizer finds (broken_in_every_python).
NEWEST_SYNTAX_PYTHON = (3, 14)


def check_episode_syntax(script: str, source: str, named: str) -> None:
    """Refuse a script that does not compile before it costs a namespace and a Job; `named` is the
    setting that gave it, as its caller wrote it (`--episode-script FILE`, `episode_script='FILE'`).

    The image's Python may be newer than this one. On an older one, a script this Python cannot
    compile is refused only when it is broken in every version (broken_in_every_python); any
    other error may be newer syntax, so it is warned about and the script is shipped.
    """
    try:
        with warnings.catch_warnings():  # an invalid escape's SyntaxWarning: the image's to say
            warnings.simplefilter("ignore")
            compile(source, script, "exec", dont_inherit=True)
        return
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte, before 3.11
        found = error
    line = getattr(found, "lineno", None)
    where = named + (f", line {line}" if line else "")
    older = sys.version_info < NEWEST_SYNTAX_PYTHON
    if older and isinstance(found, SyntaxError) and not broken_in_every_python(source):
        print(
            f"Warning: {where} does not compile on Python {sys.version_info[0]}."
            f"{sys.version_info[1]} ({syntax_error_detail(found, source)}); the image's Python "
            f"may be newer, so it is shipped anyway",
            file=sys.stderr,
        )
        return
    raise DemoError(f"{where}: {syntax_error_detail(found, source)}; nothing was created")


def broken_in_every_python(source: str) -> bool:
    """Whether this Python's tokenizer refuses the source (an unclosed bracket or triple-quoted
    string, a dedent to no outer level, and from 3.12 an unclosed string or a NUL byte too), or
    a bracket is closed by another kind (`(1]`): wrong in every version.

    Before 3.12 the tokenizer reads an f-string that nests its own quote as strings that end
    early: one that nests an odd quote or a triple quote (`f"{'"'}"`) reads as unclosed, and is
    refused though 3.12 runs it.
    """
    try:
        with warnings.catch_warnings():  # 3.12's tokenizer warns of an invalid escape too
            warnings.simplefilter("ignore")
            opened: list[str] = []
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.OP and token.string in "([{":
                    opened.append(token.string)
                elif token.type == tokenize.OP and token.string in ")]}":
                    if not opened or BRACKETS[opened.pop()] != token.string:
                        return True
    except (tokenize.TokenError, SyntaxError, SystemError):  # SystemError: a NUL, on some 3.12+
        return True
    return False


BRACKETS = {"(": ")", "[": "]", "{": "}"}


def syntax_error_detail(error: SyntaxError | ValueError, source: str) -> str:
    """The error's message and the line it is on, as the script has it."""
    line = getattr(error, "lineno", None)
    lines = source.splitlines()
    text = lines[line - 1].strip() if line and 0 < line <= len(lines) else ""
    return f"{getattr(error, 'msg', None) or error}" + (f": {text}" if text else "")
