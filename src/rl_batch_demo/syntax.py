"""Checking an episode script's syntax before it is shipped, for the Python of its image."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import warnings
from keyword import iskeyword
from typing import Iterator, Sequence

from .model import COMMAND_LINE, DemoError, Spelling

# The syntax each Python since the oldest this tool runs on (3.9) added, with the version that
# brought it: on an older Python, unexplained_syntax_error spells it in older terms before it
# judges an error. A Python at least as new as the newest here refuses every error.
NEWER_SYNTAX = {
    "match": (3, 10),  # match and case statements (PEP 634)
    "bare_walrus": (3, 10),  # `a[i := 1]`: an unparenthesized := in an index
    "except_star": (3, 11),  # `except* E:` (PEP 654)
    "star_index": (3, 11),  # `a[*b]`, `*args: *Ts` (PEP 646)
    "f_strings": (3, 12),  # quotes, backslashes, comments, newlines in f-string fields (PEP 701)
    "type_params": (3, 13),  # def f[T](), class C[T], type X = (PEP 695, 3.12; defaults, PEP 696)
    "except_commas": (3, 14),  # `except A, B:` unbracketed (PEP 758)
    "t_strings": (3, 14),  # t"..." template strings (PEP 750)
}

NEWEST_SYNTAX_PYTHON = max(NEWER_SYNTAX.values())

# The prefixes of Python's strings (in any case), f- and t-strings among them.
STRING_PREFIXES = {"r", "u", "b", "br", "rb", "f", "fr", "rf", "t", "tr", "rt"}


def check_episode_syntax(script: str, source: str, spelling: Spelling = COMMAND_LINE) -> None:
    """Refuse a script that does not compile before it costs a namespace and a Job.

    The image's Python may be newer than this one. On an older one, a script this Python cannot
    compile is only warned about when newer syntax could explain the error
    (unexplained_syntax_error); any other error is refused.
    """
    try:
        with warnings.catch_warnings():  # an invalid escape's SyntaxWarning: the image's to say
            warnings.simplefilter("ignore")
            compile(source, script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        found: SyntaxError | ValueError | None = error
        if isinstance(error, SyntaxError) and sys.version_info < NEWEST_SYNTAX_PYTHON:
            found = unexplained_syntax_error(source, sys.version_info[:2])
        if found is None:
            line = getattr(error, "lineno", None)
            print(
                f"Warning: {spelling.setting('episode_script', script)}"
                + (f", line {line}" if line else "")
                + f" does not compile on Python {sys.version_info[0]}.{sys.version_info[1]} "
                f"({syntax_error_detail(error, source)}); the image's Python may be newer, so it "
                f"is shipped anyway",
                file=sys.stderr,
            )
            return
        line = getattr(found, "lineno", None)
        where = spelling.setting("episode_script", script) + (f", line {line}" if line else "")
        raise DemoError(
            f"{where}: {syntax_error_detail(found, source)}; nothing was created"
        ) from None


def syntax_error_detail(error: SyntaxError | ValueError, source: str) -> str:
    """The error's message and the line it is on, as the script has it."""
    line = getattr(error, "lineno", None)
    lines = source.splitlines()
    text = lines[line - 1].strip() if line and 0 < line <= len(lines) else ""
    return f"{getattr(error, 'msg', None) or error}" + (f": {text}" if text else "")


def unexplained_syntax_error(source: str, python: tuple[int, int]) -> SyntaxError | None:
    """The syntax error that no syntax newer than `python`'s explains, or None: it is searched
    again in the source respelled in `python`'s terms (in_older_syntax), every newer construct
    made an older one, so only an error outside them remains. An error found only by the
    compiler, after the source parsed, is None too: newer Pythons have relaxed some (3.11
    allows async comprehensions within comprehensions, 3.13 comprehensions in annotation
    scopes)."""
    try:
        parse_quietly(source)
        return None
    except SyntaxError as error:
        first = error
    except ValueError:  # this Python's parser failed otherwise (3.12.1 on some f-strings)
        return None
    try:
        # Lines as the parser splits them (a lone CR ends one too), for the respelling's tokenizer.
        parse_quietly(in_older_syntax(source.replace("\r\n", "\n").replace("\r", "\n"), python))
    except SyntaxError as error:
        return first if first.lineno == error.lineno else error
    except Exception:  # noqa: BLE001 - a source the respelling cannot read is not proven broken
        pass
    return None


def parse_quietly(source: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ast.parse(source)


def in_older_syntax(source: str, python: tuple[int, int]) -> str:
    """`source` with the syntax newer than `python`'s spelt in older terms that parse wherever
    the newer did (line numbers kept): f- and t-strings become plain strings, newer statements
    older ones (older_statements)."""
    kinds = {
        kind
        for kind, feature in (("f", "f_strings"), ("t", "t_strings"))
        if python < NEWER_SYNTAX[feature]
    }
    return older_statements(plain_strings(source, kinds) if kinds else source, python)


WORD = re.compile(r"\w+")


def plain_strings(source: str, kinds: set[str]) -> str:
    """Each string whose prefix has one of `kinds` ("f", "t") as an empty plain string of as many
    lines, each string's extent read as Python 3.14 reads it; from a string that does not end
    on, the source is left as it is."""
    pieces, done, i = [], 0, 0
    while i < len(source):
        start, prefix, quote_at = string_at(source, i)
        if quote_at < 0:
            i = start
            continue
        end = string_end(source, quote_at, prefix)
        if end < 0:
            break
        if kinds & set(prefix):
            lines = source.count("\n", i, end)
            pieces += [source[done:i], '"""' + "\n" * lines + '"""' if lines else '""']
            done = end
        i = end
    return "".join(pieces) + source[done:]


def string_at(source: str, i: int) -> tuple[int, str, int]:
    """(i, its prefix, where its quote is) if a string starts at i, else (where the next token
    may start, "", -1): past a word, a comment or one character."""
    char = source[i]
    if char in "\"'":
        return i, "", i
    if char == "#":
        end = source.find("\n", i)
        return (end if end >= 0 else len(source)), "", -1
    word = WORD.match(source, i)
    if word is None:
        return i + 1, "", -1
    after = word.end()
    if after < len(source) and source[after] in "\"'" and word.group().lower() in STRING_PREFIXES:
        return i, word.group().lower(), after
    return after, "", -1


def string_end(source: str, i: int, prefix: str) -> int:
    """Where the string whose quote is at i ends (past its closing quote), or -1 if it does not:
    an f- or t-string's fields may hold any expression, strings of the same quote among them."""
    quote = source[i] * 3 if source.startswith(source[i] * 3, i) else source[i]
    raw, fields = "r" in prefix, bool(set(prefix) & {"f", "t"})
    i += len(quote)
    while i < len(source):
        char = source[i]
        if source.startswith(quote, i):
            return i + len(quote)
        if char == "\\":
            if fields and not raw and source.startswith("N{", i + 1):
                i = source.find("}", i) + 1 or len(source)  # a named character, not a field
            else:  # it escapes a quote or a newline, never a brace
                i += 1 if fields and source[i + 1 : i + 2] in ("{", "}") else 2
        elif char == "\n" and len(quote) == 1:
            return -1
        elif fields and source.startswith("{{", i):
            i += 2
        elif fields and char == "{":
            i = field_end(source, i + 1, quote)
            if i < 0:
                return -1
        else:
            i += 1
    return -1


def field_end(source: str, i: int, quote: str) -> int:
    """Where the f-string field that starts at i ends (past its "}"), or -1: an expression, then
    after a ":" at its outer level a format spec of text and fields."""
    depth = 0
    while i < len(source):
        start, prefix, quote_at = string_at(source, i)
        if quote_at >= 0:
            i = string_end(source, quote_at, prefix)
            if i < 0:
                return -1
            continue
        char = source[i]
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char == "}":
            return i + 1
        elif char == ":" and not depth:
            return spec_end(source, i + 1, quote)
        i = max(start, i + 1)
    return -1


def spec_end(source: str, i: int, quote: str) -> int:
    """Where a field's format spec that starts at i ends (past the field's "}"), or -1."""
    while i < len(source):
        char = source[i]
        if source.startswith(quote, i):
            return -1
        if char == "{":
            i = field_end(source, i + 1, quote)
            if i < 0:
                return -1
            continue
        if char == "}":
            return i + 1
        i += 2 if char == "\\" else 1
    return -1


def older_statements(text: str, python: tuple[int, int]) -> str:
    """`text` with each statement of newer syntax than `python`'s respelt in older terms
    (statement_respellings): match and case as `if 1:`, except* and unbracketed `except A, B`
    as `except Exception`, type parameters and `type` left out, a bare := or an index's *
    dropped. Read from its tokens; from a token this Python cannot read, the text is left as
    it is."""
    tokens: list[tokenize.TokenInfo] = []
    try:
        with warnings.catch_warnings():  # an invalid escape's SyntaxWarning: the image's to say
            warnings.simplefilter("ignore")
            tokens.extend(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, SystemError):  # SystemError: a NUL byte, 3.12+
        pass
    line_starts = [0] + [match.end() for match in re.finditer("\n", text)]

    def offset(position: tuple[int, int]) -> int:
        return line_starts[position[0] - 1] + position[1]

    edits: list[tuple[int, int, str]] = []
    blocks: list[str] = []  # the header word of each block the line is in
    line: list[tokenize.TokenInfo] = []
    header = ""
    skipped = (tokenize.NL, tokenize.COMMENT, tokenize.ENCODING, tokenize.ENDMARKER)
    for token in tokens:
        if token.type == tokenize.INDENT:
            blocks.append(header)
        elif token.type == tokenize.DEDENT:
            blocks = blocks[:-1]
        elif token.type == tokenize.NEWLINE:
            for first, last, spelling in statement_respellings(line, blocks[-1:], python):
                edits.append((offset(first), offset(last), spelling))
            header = line[0].string if line and line[-1].string == ":" else ""
            line = []
        elif token.type not in skipped:
            line.append(token)
    pieces, done = [], 0
    for start, end, spelling in sorted(edits):
        if start >= done:  # one edit inside another (a := in a case) goes with it
            pieces += [text[done:start], spelling + " \\\n" * text.count("\n", start, end)]
            done = end
    return "".join(pieces) + text[done:]


Position = tuple[int, int]


def statement_respellings(
    line: Sequence[tokenize.TokenInfo], block: Sequence[str], python: tuple[int, int]
) -> Iterator[tuple[Position, Position, str]]:
    """(start, end, older spelling) for each newer construct in one logical line (its tokens but
    comments), `block` the header word of the block it is in. Each respelling is of syntax no
    older Python parses, and parses wherever the newer did."""

    def older(feature: str) -> bool:
        return python < NEWER_SYNTAX[feature]

    if not line:
        return
    words = [token.string if token.type == tokenize.NAME else None for token in line]
    ops = [token.string if token.type == tokenize.OP else None for token in line]
    first, last = words[0], ops[-1]
    colon = header_colon(line)
    if older("match") and first == "match" and last == ":" and len(line) > 2:
        if ops[1] not in ("=", ".", ":", ",", ";"):
            yield line[0].start, line[-1].start, "if 1"
    if older("match") and first == "case" and block == ["match"] and colon and colon > 1:
        yield line[0].start, line[colon].start, "if 1"
    if first == "except" and colon and len(line) > 2:
        starred = ops[1] == "*" and older("except_star")
        listed = older("except_commas") and "," in level_ops(line[1:colon])
        if starred or listed:
            yield line[0].start, line[colon].start, "except Exception"
    for start in statement_starts(ops) if older("type_params") else ():
        at = start + 1 if words[start] == "async" else start
        if at + 2 >= len(line):
            continue
        if words[at] in ("def", "class") and words[at + 1] and ops[at + 2] == "[":
            yield line[at + 2].start, line[bracket_end(ops, at + 2)].end, ""
        elif words[at] == "type" and name_at(words, at + 1) and ops[at + 2] in ("=", "["):
            yield line[at].start, line[at + 1].start, ""
            if ops[at + 2] == "[":
                yield line[at + 2].start, line[bracket_end(ops, at + 2)].end, ""
    yield from index_respellings(line, words, ops, python)


def name_at(words: Sequence[str | None], i: int) -> bool:
    """Whether token i is a name (not a keyword)."""
    word = words[i]
    return word is not None and not iskeyword(word)


def bracket_end(ops: Sequence[str | None], i: int) -> int:
    """The index of the bracket that closes the one at i (the last token if none does)."""
    depth = 0
    for j in range(i, len(ops)):
        depth += (ops[j] or "") in ("(", "[", "{")
        depth -= (ops[j] or "") in (")", "]", "}")
        if not depth:
            return j
    return len(ops) - 1


def header_colon(line: Sequence[tokenize.TokenInfo]) -> int | None:
    """The index of the ":" that ends a compound statement's header (outside brackets and
    lambdas), or None."""
    depth = lambdas = 0
    for i, token in enumerate(line):
        if token.type == tokenize.NAME and token.string == "lambda" and not depth:
            lambdas += 1
        elif token.type != tokenize.OP:
            continue
        elif token.string in ("(", "[", "{"):
            depth += 1
        elif token.string in (")", "]", "}"):
            depth -= 1
        elif token.string == ":" and not depth:
            if not lambdas:
                return i
            lambdas -= 1
    return None


def level_ops(line: Sequence[tokenize.TokenInfo]) -> list[str]:
    """The operators of a stretch of tokens outside its brackets."""
    depth, found = 0, []
    for token in line:
        if token.type != tokenize.OP:
            continue
        depth -= token.string in (")", "]", "}")
        if not depth:
            found.append(token.string)
        depth += token.string in ("(", "[", "{")
    return found


def statement_starts(ops: Sequence[str | None]) -> Iterator[int]:
    """Where a statement may start in a logical line: its first token, and after a ";" or a ":"
    outside brackets (`else: type X = int`)."""
    yield 0
    depth = 0
    for i, op in enumerate(ops[:-1]):
        depth += (op or "") in ("(", "[", "{")
        depth -= (op or "") in (")", "]", "}")
        if not depth and op in (";", ":"):
            yield i + 1


def index_respellings(
    line: Sequence[tokenize.TokenInfo],
    words: Sequence[str | None],
    ops: Sequence[str | None],
    python: tuple[int, int],
) -> Iterator[tuple[Position, Position, str]]:
    """A `name :=` in brackets, left out before 3.10 (a bare := in an index); a `*` that
    starts an index's item, or a `*args` annotation, left out before 3.11."""
    opened: list[int] = []  # the open brackets' indexes
    for i, op in enumerate(ops):
        if op in ("(", "[", "{"):
            opened.append(i)
        elif op in (")", "]", "}") and opened:
            opened.pop()
        elif (
            op == ":=" and opened and python < NEWER_SYNTAX["bare_walrus"] and name_at(words, i - 1)
        ):
            yield line[i - 1].start, line[i].end, ""
        elif op == "*" and opened and python < NEWER_SYNTAX["star_index"]:
            bracket = opened[-1]
            indexed = ops[bracket] == "[" and bracket > 0 and follows_a_value(line[bracket - 1])
            annotated = ops[bracket] == "(" and ops[i - 1] == ":" and "def" in words[:bracket]
            if (indexed and ops[i - 1] in ("[", ",")) or annotated:
                yield line[i].start, line[i].end, ""


def follows_a_value(token: tokenize.TokenInfo) -> bool:
    """Whether a "[" after this token opens an index (not a list)."""
    if token.type == tokenize.NAME:
        return not iskeyword(token.string)
    return token.type in (tokenize.NUMBER, tokenize.STRING) or token.string in (")", "]", "}")
