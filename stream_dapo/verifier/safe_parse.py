"""A restricted parser from (normalised) answer text to sympy expressions.

Model text never reaches ``eval``, ``exec``, ``sympify``/``parse_expr`` or ``latex2sympy``: this module
tokenises the text against an allow-list and builds sympy objects (Integer, Rational, Symbol, pi, E,
I, Add, Mul, Pow and a few elementary functions) itself with a recursive-descent parser. Anything outside the allow-list is a
``SafeParseError``. The allow-list:

- numbers (``12``, ``0.5``, ``.5``, ``1.5e3``; decimals become exact rationals), single ASCII letters
  as variables except ``e`` (Euler's number) and ``i`` (the imaginary unit), ``\\pi``;
- ``+ - * / ^`` (``**`` is read as ``^``), ``\\cdot``, ``\\times``, ``\\div``, parentheses and braces;
- ``\\frac{a}{b}``, ``\\sqrt{x}``, ``\\sqrt[n]{x}``, ``\\binom{n}{k}`` and ``n!`` of non-negative integers;
- ``\\ln``, ``\\log_b`` (a bare ``\\log`` is refused: its base depends on the field), ``\\exp``,
  ``\\sin``, ``\\cos``, ``\\tan``, ``\\cot``, ``\\sec``, ``\\csc``, ``\\arcsin``, ``\\arccos``,
  ``\\arctan``, with an argument in parentheses or braces or a product without operators
  (``\\sin 2x``, ``\\ln 2``), and a power written on the name (``\\sin^2 x``);
- implicit multiplication: ``2\\sqrt{3}``, ``3x``, ``2(x+1)``, ``xy``, ``\\sin x\\cos x``.

Grammar (lowest precedence first; ``^`` is right-associative and binds tighter than unary minus, so
``-2^2`` is -4 and ``2^3^2`` is 2^9)::

    expr     := term (('+' | '-') term)*
    term     := unary (('*' | '/' | '\\cdot' | '\\times' | '\\div') unary | power)*  # power: implicit *
    unary    := ('+' | '-') unary | power
    power    := postfix ('^' exponent)?
    postfix  := atom '!'?
    exponent := ('+' | '-') exponent | power
    atom     := NUMBER | LETTER | '\\pi' | '(' expr ')' | '{' expr '}'
              | '\\frac' arg arg | '\\binom' arg arg | '\\sqrt' ('[' expr ']')? arg
              | FUNCTION ('_' arg)? ('^' exponent)? (group | power power*)
    arg      := '{' expr '}' | NUMBER | LETTER | '\\pi'

An exponent without braces takes one atom, so ``2^10`` is 2^10 (the plain-text reading models mean)
and ``2^3x`` is 2^3 times x.

Guards against sympy blow-ups (each raises ``SafeParseError``): at most ``max_tokens`` tokens and
``max_depth`` nesting levels; number literals of at most ``MAX_NUMBER_CHARS`` characters; rational
exponents whose numerator and denominator are at most ``MAX_EXPONENT``; exact powers whose result
would exceed ``MAX_RESULT_BITS`` bits are refused before they are computed; a power inside a symbolic
exponent (a power tower such as ``x^{y^z}``) is refused; division by zero and infinite results are
refused; ``n!`` needs an integer ``0 <= n <= MAX_FACTORIAL`` and ``\\binom{n}{k}`` integers with
``0 <= n <= MAX_BINOM_N`` (both are computed exactly, so the bounds keep them under a few thousand
bits); a scientific literal's exponent is at most ``MAX_EXPONENT`` in size; a constant argument of
``\\exp`` is at most ``MAX_EXPONENT`` and of the other functions at most ``MAX_FUNCTION_ARGUMENT`` in
size (``\\sin 10^{1000}`` would need a thousand digits of pi).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import sympy

__all__ = [
    "MAX_BINOM_N",
    "MAX_EXPONENT",
    "MAX_FACTORIAL",
    "MAX_FUNCTION_ARGUMENT",
    "MAX_NUMBER_CHARS",
    "MAX_RESULT_BITS",
    "SafeParseError",
    "parse_math",
    "tokenize",
]

MAX_EXPONENT = 1000
MAX_NUMBER_CHARS = 1000
MAX_RESULT_BITS = 20_000
MAX_ROOT_INDEX = 1000
MAX_FACTORIAL = 1000  # 1000! has 8,530 bits, under MAX_RESULT_BITS
MAX_BINOM_N = 10_000  # binom(n, k) < 2^n
MAX_FUNCTION_ARGUMENT = 10**6

_FUNCTIONS = {
    "\\ln": sympy.log,
    "\\exp": sympy.exp,
    "\\sin": sympy.sin,
    "\\cos": sympy.cos,
    "\\tan": sympy.tan,
    "\\cot": sympy.cot,
    "\\sec": sympy.sec,
    "\\csc": sympy.csc,
    "\\arcsin": sympy.asin,
    "\\arccos": sympy.acos,
    "\\arctan": sympy.atan,
}
_CONSTANTS = {"e": sympy.E, "i": sympy.I}

_TOKEN_RE = re.compile(
    r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<cmd>\\(?:frac|binom|sqrt|pi|cdot|times|div|ln|log|exp|arcsin|arccos|arctan"
    r"|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc))"
    r"|(?P<var>[A-Za-z])"
    r"|(?P<op>\*\*|[-+*/^()\[\]{}!_])"
)
_MUL_OPS = frozenset({"*", "\\cdot", "\\times"})
_DIV_OPS = frozenset({"/", "\\div"})
# Tokens that can start an atom; one of them right after a complete factor means implicit multiplication.
_ATOM_START_KINDS = frozenset({"num", "var"})
_ATOM_START_TEXT = frozenset({"\\frac", "\\binom", "\\sqrt", "\\pi", "(", "{", "\\log", *_FUNCTIONS})
# What may follow a function's first factor in an argument written without parentheses: "\sin 2x".
_ARGUMENT_FACTOR_TEXT = frozenset({"\\frac", "\\binom", "\\sqrt", "\\pi"})
_SCIENTIFIC_RE = re.compile(r"([^eE]*)[eE]([+-]?\d+)")


class SafeParseError(ValueError):
    """The text is outside the allow-list or trips a size guard; it is scored as not equal."""


def tokenize(text: str, *, max_tokens: int = 200) -> list[tuple[str, str]]:
    """Split ``text`` into ``(kind, text)`` tokens, kind in {"num", "cmd", "var", "op"}.

    Whitespace is skipped. ``**`` becomes ``^``.

    Raises:
        SafeParseError: on a character or command outside the allow-list, an over-long number, or
            more than ``max_tokens`` tokens.
    """
    tokens: list[tuple[str, str]] = []
    pos, n = 0, len(text)
    while pos < n:
        if text[pos].isspace():
            pos += 1
            continue
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            snippet = text[pos : pos + 12]
            raise SafeParseError(f"unsupported text at offset {pos}: {snippet!r}")
        kind = m.lastgroup or "op"
        value = m.group()
        if kind == "num" and len(value) > MAX_NUMBER_CHARS:
            raise SafeParseError(f"number literal longer than {MAX_NUMBER_CHARS} characters")
        if value == "**":
            value = "^"
        tokens.append((kind, value))
        if len(tokens) > max_tokens:
            raise SafeParseError(f"more than {max_tokens} tokens")
        pos = m.end()
    return tokens


def _number(literal: str) -> sympy.Expr:
    # The literal matched the number regex above, so Fraction parses it exactly; the exponent of a
    # scientific literal is checked first so that "1e999999" is never computed.
    if m := _SCIENTIFIC_RE.fullmatch(literal):
        if abs(int(m[2])) > MAX_EXPONENT:
            raise SafeParseError(f"exponent of {literal[:20]!r} is outside [-{MAX_EXPONENT}, {MAX_EXPONENT}]")
    value = Fraction(literal)
    return sympy.Rational(value.numerator, value.denominator)


def _check_finite(expr: sympy.Expr) -> sympy.Expr:
    if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        raise SafeParseError("the expression is undefined (division by zero or an infinite value)")
    return expr


def _rational_bits(value: sympy.Rational) -> int:
    return max(abs(int(value.p)).bit_length(), int(value.q).bit_length(), 1)


def checked_pow(base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
    """``base ** exponent`` after the size guards in the module docstring."""
    if exponent.is_Rational:
        num, den = abs(int(exponent.p)), int(exponent.q)
        if num > MAX_EXPONENT or den > MAX_EXPONENT:
            raise SafeParseError(f"exponent {exponent} is outside [-{MAX_EXPONENT}, {MAX_EXPONENT}]")
        if base.is_Rational:
            if base == 0 and exponent < 0:
                raise SafeParseError("zero raised to a negative power")
            if _rational_bits(base) * num > MAX_RESULT_BITS:
                raise SafeParseError(f"the power would exceed {MAX_RESULT_BITS} bits")
    elif any(not p.exp.is_Rational for p in exponent.atoms(sympy.Pow)):
        raise SafeParseError("a power tower (a symbolic power inside an exponent) is not supported")
    result = base**exponent
    # sympy folds (x^a)^b into x^(ab); keep the folded exponent under the same cap.
    for power in result.atoms(sympy.Pow):
        exp = power.exp
        if exp.is_Rational and (abs(int(exp.p)) > MAX_EXPONENT or int(exp.q) > MAX_EXPONENT):
            raise SafeParseError(f"exponent {exp} is outside [-{MAX_EXPONENT}, {MAX_EXPONENT}]")
    return _check_finite(result)


class _Parser:
    """Recursive descent over a token list; see the grammar in the module docstring."""

    def __init__(self, tokens: list[tuple[str, str]], max_depth: int) -> None:
        self._tokens = tokens
        self._pos = 0
        self._depth = 0
        self._max_depth = max_depth

    # -- token helpers -------------------------------------------------------------------------------
    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _peek_text(self) -> str | None:
        token = self._peek()
        return token[1] if token is not None else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise SafeParseError("unexpected end of expression")
        self._pos += 1
        return token

    def _expect(self, text: str) -> None:
        token = self._take()
        if token[1] != text:
            raise SafeParseError(f"expected {text!r}, found {token[1]!r}")

    def _descend(self) -> None:
        self._depth += 1
        if self._depth > self._max_depth:
            raise SafeParseError(f"nesting deeper than {self._max_depth} levels")

    def _starts_atom(self) -> bool:
        token = self._peek()
        return token is not None and (token[0] in _ATOM_START_KINDS or token[1] in _ATOM_START_TEXT)

    # -- grammar -------------------------------------------------------------------------------------
    def parse(self) -> sympy.Expr:
        expr = self._expr()
        if self._peek() is not None:
            raise SafeParseError(f"unexpected {self._peek_text()!r} after a complete expression")
        return _check_finite(expr)

    def _expr(self) -> sympy.Expr:
        self._descend()
        value = self._term()
        while self._peek_text() in ("+", "-"):
            op = self._take()[1]
            rhs = self._term()
            value = value + rhs if op == "+" else value - rhs
        self._depth -= 1
        return value

    def _term(self) -> sympy.Expr:
        value = self._unary()
        while True:
            text = self._peek_text()
            if text in _MUL_OPS:
                self._take()
                value = value * self._unary()
            elif text in _DIV_OPS:
                self._take()
                divisor = self._unary()
                if divisor == 0:
                    raise SafeParseError("division by zero")
                value = value / divisor
            elif self._starts_atom():
                previous, upcoming = self._tokens[self._pos - 1], self._tokens[self._pos]
                if previous[0] == "num" and upcoming[0] == "num":
                    raise SafeParseError("two numbers in a row")
                value = value * self._power()
            else:
                return value

    def _unary(self) -> sympy.Expr:
        text = self._peek_text()
        if text in ("+", "-"):
            self._take()
            self._descend()
            operand = self._unary()
            self._depth -= 1
            return -operand if text == "-" else operand
        return self._power()

    def _power(self) -> sympy.Expr:
        base = self._postfix()
        if self._peek_text() != "^":
            return base
        self._take()
        self._descend()
        exponent = self._exponent()
        self._depth -= 1
        return checked_pow(base, exponent)

    def _postfix(self) -> sympy.Expr:
        value = self._atom()
        if self._peek_text() != "!":
            return value
        self._take()
        if self._peek_text() == "!":
            raise SafeParseError("a double factorial (n!!) is not supported")
        return _factorial(value)

    def _exponent(self) -> sympy.Expr:
        text = self._peek_text()
        if text in ("+", "-"):
            self._take()
            self._descend()
            operand = self._exponent()
            self._depth -= 1
            return -operand if text == "-" else operand
        return self._power()

    def _group(self, open_: str, close: str) -> sympy.Expr:
        self._expect(open_)
        value = self._expr()
        self._expect(close)
        return value

    def _arg(self) -> sympy.Expr:
        token = self._peek()
        if token is None:
            raise SafeParseError("a \\frac or \\sqrt is missing its argument")
        if token[1] == "{":
            return self._group("{", "}")
        if token[0] in ("num", "var") or token[1] == "\\pi":
            return self._atom()
        raise SafeParseError(f"unexpected {token[1]!r} as a \\frac or \\sqrt argument")

    def _atom(self) -> sympy.Expr:
        kind, text = self._take()
        if kind == "num":
            return _number(text)
        if kind == "var":
            return _CONSTANTS[text] if text in _CONSTANTS else sympy.Symbol(text)
        if text == "\\pi":
            return sympy.pi
        if text == "(":
            self._pos -= 1
            return self._group("(", ")")
        if text == "{":
            self._pos -= 1
            return self._group("{", "}")
        if text == "\\frac":
            numerator = self._arg()
            denominator = self._arg()
            if denominator == 0:
                raise SafeParseError("division by zero")
            return _check_finite(numerator / denominator)
        if text == "\\binom":
            return _binomial(self._arg(), self._arg())
        if text in _FUNCTIONS or text == "\\log":
            return self._function(text)
        if text == "\\sqrt":
            index: sympy.Expr = sympy.Integer(2)
            if self._peek_text() == "[":
                index = self._group("[", "]")
            if not (index.is_Integer and 2 <= int(index) <= MAX_ROOT_INDEX):
                raise SafeParseError(f"a root index must be an integer in [2, {MAX_ROOT_INDEX}], got {index}")
            return checked_pow(self._arg(), sympy.Rational(1, int(index)))
        raise SafeParseError(f"unexpected {text!r}")

    def _function(self, name: str) -> sympy.Expr:
        base: sympy.Expr | None = None
        if name == "\\log":
            if self._peek_text() != "_":
                raise SafeParseError("a \\log without a base is ambiguous; write \\ln or \\log_b")
            self._take()
            base = self._arg()
        power: sympy.Expr | None = None
        if self._peek_text() == "^":
            self._take()
            self._descend()
            power = self._exponent()
            self._depth -= 1
            if power == -1:
                raise SafeParseError(f"{name}^{{-1}} is ambiguous; write \\arc... or 1/{name}")
        argument = self._function_argument(name)
        if base is not None:
            value = sympy.log(_bounded_argument(argument, MAX_FUNCTION_ARGUMENT), base)
        elif name == "\\exp":
            value = sympy.exp(_bounded_argument(argument, MAX_EXPONENT))
        else:
            value = _FUNCTIONS[name](_bounded_argument(argument, MAX_FUNCTION_ARGUMENT))
        value = _check_finite(value)
        return checked_pow(value, power) if power is not None else value

    def _function_argument(self, name: str) -> sympy.Expr:
        token = self._peek()
        if token is None:
            raise SafeParseError(f"{name} is missing its argument")
        if token[1] in ("(", "{"):
            return self._atom()
        value = self._power()
        while (token := self._peek()) is not None and (
            token[0] in _ATOM_START_KINDS or token[1] in _ARGUMENT_FACTOR_TEXT
        ):
            if token[0] == "num" and self._tokens[self._pos - 1][0] == "num":
                raise SafeParseError("two numbers in a row")
            value = value * self._power()
        return value


def _bounded_argument(argument: sympy.Expr, limit: int) -> sympy.Expr:
    if argument.is_number and bool(abs(argument.evalf(15)) > limit):
        raise SafeParseError(f"a function's constant argument is larger than {limit}")
    return argument


def _small_integer(value: sympy.Expr, what: str, limit: int) -> int:
    if not (value.is_Integer and 0 <= int(value) <= limit):
        raise SafeParseError(f"{what} must be an integer in [0, {limit}], got {str(value)[:20]}")
    return int(value)


def _factorial(value: sympy.Expr) -> sympy.Expr:
    return sympy.Integer(math.factorial(_small_integer(value, "a factorial's argument", MAX_FACTORIAL)))


def _binomial(n: sympy.Expr, k: sympy.Expr) -> sympy.Expr:
    top = _small_integer(n, "the top of a binomial", MAX_BINOM_N)
    if not k.is_Integer:
        raise SafeParseError(f"the bottom of a binomial must be an integer, got {str(k)[:20]}")
    return sympy.Integer(math.comb(top, int(k)) if int(k) >= 0 else 0)


def parse_math(text: str, *, max_tokens: int = 200, max_depth: int = 50) -> sympy.Expr:
    """Parse normalised answer text into a sympy expression, safely (see the module docstring).

    Raises:
        SafeParseError: the text is outside the allow-list or trips a guard.
    """
    tokens = tokenize(text, max_tokens=max_tokens)
    if not tokens:
        raise SafeParseError("empty expression")
    return _Parser(tokens, max_depth).parse()
