"""A graded corpus of (gold, response) pairs for bench/studies/verifier_agreement.py.

Every pair carries the verdict a careful grader gives: the answer is right when it states the gold
answer's value in any conventional notation, and wrong otherwise. Conventions (the ones a grader of
MATH-style answers applies; the verifier docstrings state the same rules):

- sets and "enter all solutions" lists are unordered; tuples, points and intervals are ordered, and
  an interval's brackets are part of it;
- ``x = 5`` states 5; a unit, a degree sign, ``\\text{}`` or ``\\mathrm{}`` around the value is notation;
- a percentage p% is the number p/100, and a percent answer also matches its bare number p (the
  question asked "what percent"), but a bare 0.25 is not the answer 25;
- a decimal approximation of an irrational exact answer is right when it has at least six
  significant digits, all correct (rounded or truncated): 1.41421356 for sqrt(2), not 1.414;
- a ratio a:b is the number a/b; a mixed number 2 1/2 is 5/2.

Pairs on which careful graders disagree (a tuple for a set, an unsimplified ratio) are left out.
The corpus is built from hand-written cases plus seeded variations of them, so it is the same on
every run. ``build_corpus()`` returns ``Pair`` objects; ``python -m bench.studies.verifier_corpus`` prints
the class counts.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

__all__ = ["CLASSES", "Pair", "build_corpus"]


@dataclass(frozen=True)
class Pair:
    cls: str
    gold: str
    response: str
    correct: bool


_REASONING = [
    "We set up the equation from the conditions and simplify.",
    "Let us work through the cases one at a time; only the consistent ones remain.",
    "Substituting the values and collecting terms, the computation gives the result below.",
    "By symmetry it suffices to consider the first case, and the rest follow.",
]


def _respond(answer: str, k: int, styles: int = 2) -> str:
    """The k-th response style: DAPO's ``Answer:`` line, a final ``\\boxed{}``, or (with
    ``styles=3``) a Markdown ``**Answer:**`` line."""
    lead = _REASONING[k % len(_REASONING)]
    style = k % styles
    if style == 0:
        return f"{lead}\nAfter checking the arithmetic once more, we are done.\nAnswer: {answer}"
    if style == 1:
        return f"{lead} Therefore the final answer is $\\boxed{{{answer}}}$."
    return f"{lead}\n\n**Answer:** {answer}"


# (gold, answer, correct) per class, written by hand.
_HAND: dict[str, list[tuple[str, str, bool]]] = {
    "set": [
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("\\{1,2\\}", "\\{1, 2\\}", True),
        ("\\{1,2\\}", "\\{1,2,3\\}", False),
        ("\\{1,2\\}", "\\{1\\}", False),
        ("\\{-3, \\frac{1}{2}\\}", "\\left\\{ \\frac12, -3 \\right\\}", True),
        ("\\{-3, \\frac{1}{2}\\}", "\\{0.5, -3\\}", True),
        ("\\{-3, \\frac{1}{2}\\}", "\\{3, \\frac{1}{2}\\}", False),
        ("\\{\\sqrt{2}, -\\sqrt{2}\\}", "\\{-\\sqrt{2}, \\sqrt{2}\\}", True),
        ("\\{\\sqrt{2}, -\\sqrt{2}\\}", "\\{\\sqrt{2}\\}", False),
        ("\\{0, 1, 4, 9\\}", "\\{9, 4, 1, 0\\}", True),
        ("\\{0, 1, 4, 9\\}", "\\{0, 1, 4, 8\\}", False),
        ("\\{2\\}", "2", True),
        ("\\{2\\}", "\\{2, -2\\}", False),
        ("\\emptyset", "\\varnothing", True),
        ("\\emptyset", "\\{0\\}", False),
        ("\\{1, 2\\}", "1, 2", True),
        ("\\{(1,2), (3,4)\\}", "\\{(3,4), (1,2)\\}", True),
        ("\\{(1,2), (3,4)\\}", "\\{(2,1), (3,4)\\}", False),
    ],
    "tuple_interval": [
        ("(1,2)", "(1, 2)", True),
        ("(1,2)", "(2,1)", False),
        ("(3,-1)", "\\left(3, -1\\right)", True),
        ("(3,-1)", "(-1,3)", False),
        ("(\\frac{1}{2}, \\sqrt{8})", "(0.5, 2\\sqrt{2})", True),
        ("(\\frac{1}{2}, \\sqrt{8})", "(0.5, 2\\sqrt{3})", False),
        ("(1, 2, 3)", "(1,2,3)", True),
        ("(1, 2, 3)", "(1,3,2)", False),
        ("(1, 2, 3)", "(1,2)", False),
        ("[2, 5)", "[2,5)", True),
        ("[2, 5)", "\\left[ 2, 5 \\right)", True),
        ("[2, 5)", "(2,5)", False),
        ("[2, 5)", "[2,5]", False),
        ("(-\\infty, 3]", "(-\\infty,3]", True),
        ("(-\\infty, 3]", "(-\\infty, 3)", False),
        ("(-\\infty, 3] \\cup (5, \\infty)", "(5,\\infty) \\cup (-\\infty, 3]", True),
        ("(-\\infty, 3] \\cup (5, \\infty)", "(-\\infty, 3) \\cup (5, \\infty)", False),
        ("(-\\infty, 3] \\cup (5, \\infty)", "(-\\infty, 3]", False),
        ("[0, 1]", "[0,1]", True),
        ("[0, 1]", "(0,1)", False),
        ("[2, 5)", "x \\in [2, 5)", True),
        ("(1,2)", "x = 1, y = 2", True),
        ("(1,2)", "x = 2, y = 1", False),
        ("(1,2)", "\\{1,2\\}", False),
    ],
    "several": [
        ("2, -3", "-3, 2", True),
        ("2, -3", "2,-3", True),
        ("2, -3", "2", False),
        ("2, -3", "2, -3, 5", False),
        ("2, -3", "2, 3", False),
        ("1, 2, 3", "3, 1, 2", True),
        ("1, 2, 3", "1, 2, 4", False),
        ("\\frac{1}{2}, -1", "-1, 0.5", True),
        ("\\frac{1}{2}, -1", "-1, -0.5", False),
        ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}", True),
        ("1 \\pm \\sqrt{2}", "1-\\sqrt{2}, 1+\\sqrt{2}", True),
        ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}", False),
        ("\\pm 2", "2, -2", True),
        ("\\pm 2", "-2", False),
        ("2, -2", "\\pm 2", True),
        ("3, 4", "3 \\text{ and } 4", True),
        ("3, 4", "3 \\text{ and } 5", False),
    ],
    "equation": [
        ("5", "x = 5", True),
        ("5", "x=5", True),
        ("5", "x = 6", False),
        ("x = 5", "5", True),
        ("x = 5", "x = -5", False),
        ("2x+3", "y = 2x + 3", True),
        ("y = 2x + 3", "2x+3", True),
        ("y = 2x + 3", "y = 3x + 2", False),
        ("\\frac{1}{2}", "k = \\frac{1}{2}", True),
        ("\\frac{1}{2}", "k = 2", False),
        ("x=1, y=2", "y=2, x=1", True),
        ("x=1, y=2", "x=2, y=1", False),
        ("x=1, y=2", "x = 1, y = 2", True),
        ("x=1, y=2", "1, 2", True),
        ("x=1, y=2", "2, 1", False),
        ("1, 2", "x = 1 \\text{ or } x = 2", True),
        ("1, 2", "x = 1 \\text{ or } x = 3", False),
        ("\\sqrt{3}", "a = \\sqrt{3}", True),
        ("\\sqrt{3}", "a = 3", False),
    ],
    "factorial_binomial": [
        ("10!", "3628800", True),
        ("10!", "362880", False),
        ("3628800", "10!", True),
        ("3628800", "9!", False),
        ("\\binom{5}{2}", "10", True),
        ("\\binom{5}{2}", "20", False),
        ("10", "\\binom{5}{2}", True),
        ("10", "\\binom{5}{3}", True),
        ("10", "\\binom{5}{1}", False),
        ("\\dbinom{8}{2}", "28", True),
        ("28", "\\dbinom{8}{6}", True),
        ("28", "\\tbinom{8}{3}", False),
        ("5!", "120", True),
        ("120", "5!", True),
        ("120", "4!", False),
        ("\\frac{10!}{2!\\,8!}", "45", True),
        ("45", "\\binom{10}{2}", True),
        ("45", "\\binom{10}{3}", False),
        ("3! \\cdot 4!", "144", True),
        ("3! \\cdot 4!", "72", False),
    ],
    "approximation": [
        ("\\sqrt{2}", "1.41421356", True),
        ("\\sqrt{2}", "1.4142136", True),
        ("\\sqrt{2}", "1.41421", True),
        ("\\sqrt{2}", "1.414", False),
        ("\\sqrt{2}", "1.41", False),
        ("\\sqrt{2}", "1.41521356", False),
        ("\\pi", "3.14159265", True),
        ("\\pi", "3.1415927", True),
        ("\\pi", "3.14", False),
        ("\\pi", "3.1416", False),
        ("\\pi", "3.14159165", False),
        ("\\frac{\\sqrt{3}}{2}", "0.8660254", True),
        ("\\frac{\\sqrt{3}}{2}", "0.866", False),
        ("\\frac{\\sqrt{3}}{2}", "0.8660354", False),
        ("2\\sqrt{5}", "4.47213595", True),
        ("2\\sqrt{5}", "4.47", False),
        ("\\frac{\\pi}{4}", "0.78539816", True),
        ("\\frac{\\pi}{4}", "0.785", False),
        ("1+\\sqrt{3}", "2.7320508", True),
        ("1+\\sqrt{3}", "2.7320608", False),
        ("\\sqrt[3]{2}", "1.25992105", True),
        ("\\sqrt[3]{2}", "1.26", False),
        ("\\frac{1}{3}", "0.33333333", True),
        ("\\frac{1}{3}", "0.33", False),
        ("\\frac{2}{3}", "0.6666667", True),
        ("\\frac{2}{3}", "0.67", False),
        ("1.41421356", "\\sqrt{2}", True),
        ("10\\pi", "31.4159265", True),
        ("10\\pi", "31.4", False),
    ],
    "ratio": [
        ("\\frac{3}{4}", "3:4", True),
        ("\\frac{3}{4}", "4:3", False),
        ("3:4", "3 : 4", True),
        ("3:4", "\\frac{3}{4}", True),
        ("3:4", "0.75", True),
        ("3:4", "4:3", False),
        ("2:3", "2 \\colon 3", True),
        ("2:3", "3:2", False),
        ("1:2:3", "1:2:3", True),
        ("1:2:3", "3:2:1", False),
        ("5:1", "5", True),
        ("5:1", "1:5", False),
        ("\\frac{7}{2}", "7:2", True),
        ("\\frac{7}{2}", "2:7", False),
    ],
    "text_wrapper": [
        ("\\text{Monday}", "Monday", True),
        ("\\text{Monday}", "\\text{monday}", True),
        ("\\text{Monday}", "Tuesday", False),
        ("\\text{(B)}", "B", True),
        ("\\text{(B)}", "(B)", True),
        ("\\text{(B)}", "\\textbf{(B)}", True),
        ("\\text{(B)}", "C", False),
        ("B", "\\mathrm{B}", True),
        ("B", "\\mathrm{D}", False),
        ("\\text{even}", "\\mathrm{even}", True),
        ("\\text{even}", "\\text{odd}", False),
        ("12", "\\text{12}", True),
        ("12", "\\mathrm{12}", True),
        ("12", "\\text{13}", False),
        ("\\text{yes}", "\\textbf{yes}", True),
        ("\\text{yes}", "\\text{no}", False),
    ],
    "unit_degree": [
        ("12", "12 cm", True),
        ("12", "12 \\text{ cm}^2", True),
        ("12", "13 \\text{ cm}", False),
        ("5", "5 \\text{ meters}", True),
        ("5", "5\\text{ m}", True),
        ("5", "5\\,\\mathrm{kg}", True),
        ("5", "6\\,\\mathrm{kg}", False),
        ("30", "30^\\circ", True),
        ("30", "30^{\\circ}", True),
        ("30", "30°", True),
        ("30", "60^\\circ", False),
        ("30^\\circ", "30", True),
        ("30^\\circ", "30 degrees", True),
        ("30^\\circ", "150^\\circ", False),
        ("45", "45 degrees", True),
        ("\\$18.90", "18.9", True),
        ("\\$18.90", "18.09", False),
        ("18.90", "\\$18.90", True),
        ("7", "7 inches", True),
        ("10", "10 square units", True),
        ("10", "100 square units", False),
        ("36", "36 \\text{ inches}^2", True),
        ("3", "3 hours", True),
        ("3", "4 hours", False),
    ],
    "percent": [
        ("25\\%", "25", True),
        ("25\\%", "25\\%", True),
        ("25\\%", "0.25", True),
        ("25\\%", "2.5\\%", False),
        ("25", "25\\%", True),
        ("25", "25 \\text{ percent}", True),
        ("25", "0.25", False),
        ("0.25", "25\\%", True),
        ("0.25", "\\frac{1}{4}", True),
        ("0.25", "2.5\\%", False),
        ("12.5\\%", "\\frac{1}{8}", True),
        ("12.5\\%", "12.5", True),
        ("12.5\\%", "\\frac{1}{4}", False),
        ("40\\%", "0.4", True),
        ("40\\%", "4\\%", False),
        ("\\frac{1}{8}", "12.5\\%", True),
        ("\\frac{1}{8}", "1.25\\%", False),
        ("60", "60\\%", True),
        ("60", "0.6\\%", False),
    ],
    "scientific": [
        ("1500", "1.5 \\times 10^3", True),
        ("1500", "1.5 \\times 10^{3}", True),
        ("1500", "1.5e3", True),
        ("1500", "1.5 \\times 10^4", False),
        ("1500", "15e2", True),
        ("3 \\times 10^{8}", "300000000", True),
        ("3 \\times 10^{8}", "3 \\cdot 10^8", True),
        ("3 \\times 10^{8}", "3 \\times 10^{9}", False),
        ("6.02 \\times 10^{23}", "6.02e23", True),
        ("6.02 \\times 10^{23}", "6.20 \\times 10^{23}", False),
        ("2.5 \\times 10^{-3}", "0.0025", True),
        ("2.5 \\times 10^{-3}", "0.025", False),
        ("0.0025", "2.5e-3", True),
        ("1000000", "10^6", True),
        ("1000000", "10^{5}", False),
        ("1000000", "1 \\times 10^{6}", True),
    ],
    "dfrac_tfrac": [
        ("\\frac{3}{4}", "\\dfrac{3}{4}", True),
        ("\\frac{3}{4}", "\\tfrac{3}{4}", True),
        ("\\frac{3}{4}", "\\tfrac34", True),
        ("\\frac{3}{4}", "\\dfrac{4}{3}", False),
        ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", False),
        ("\\dfrac{1}{2}", "0.5", True),
        ("\\dfrac{1}{2}", "1/2", True),
        ("\\dfrac{1}{2}", "\\dfrac{1}{3}", False),
        ("\\tfrac{5}{6}", "\\dfrac{10}{12}", True),
        ("\\tfrac{5}{6}", "\\dfrac{6}{5}", False),
        ("-\\dfrac{2}{3}", "\\frac{-2}{3}", True),
        ("-\\dfrac{2}{3}", "\\frac{2}{3}", False),
    ],
    "mixed_number": [
        ("\\frac{5}{2}", "2\\frac{1}{2}", True),
        ("\\frac{5}{2}", "2 \\frac{1}{2}", True),
        ("\\frac{5}{2}", "2 1/2", True),
        ("\\frac{5}{2}", "2\\frac{1}{3}", False),
        ("3\\frac{1}{4}", "3.25", True),
        ("3\\frac{1}{4}", "13/4", True),
        ("3\\frac{1}{4}", "\\frac{3}{4}", False),
        ("3\\frac{1}{4}", "3.4", False),
        ("-1\\frac{1}{2}", "-\\frac{3}{2}", True),
        ("-1\\frac{1}{2}", "-0.5", False),
        ("7\\frac{2}{3}", "\\frac{23}{3}", True),
        ("7\\frac{2}{3}", "7\\tfrac{2}{3}", True),
        ("7\\frac{2}{3}", "\\frac{14}{3}", False),
    ],
    "expression": [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("\\frac{1}{2}", "\\frac{2}{4}", True),
        ("\\frac{1}{2}", "\\frac{1}{3}", False),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("2\\sqrt{2}", "\\sqrt{6}", False),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
        ("6\\sqrt{3}", "3\\sqrt{12}", True),
        ("6\\sqrt{3}", "3\\sqrt{6}", False),
        ("x^2+2x+1", "(x+1)^2", True),
        ("x^2+2x+1", "(x-1)^2", False),
        ("x+1", "\\frac{x^2-1}{x-1}", True),
        ("2x+2y", "2(x+y)", True),
        ("2x+2y", "2(x-y)", False),
        ("\\pi r^2", "r^2\\pi", True),
        ("2\\pi", "4\\pi", False),
        ("1024", "2^{10}", True),
        ("1024", "2^{11}", False),
        ("-4", "-2^2", True),
        ("\\frac{3}{2}", "6 \\div 4", True),
        ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", True),
        ("\\frac{x^2}{2}", "\\frac{1}{2}x^2", True),
        ("3+4i", "4i+3", True),
        ("3+4i", "3-4i", False),
    ],
    # Notation outside what the built-in checker reads (it answers "parse_error", scored -1):
    # kept in the corpus so that the figures show the gap rather than hide it.
    "other_notation": [
        ("-1", "i^2", True),
        ("e", "2.71828183", True),
        ("e", "2.72", False),
        ("\\ln 2", "0.69314718", True),
        ("\\ln 2", "\\ln 3", False),
        ("2\\ln 2", "\\ln 4", True),
        ("[2, 5)", "2 \\le x < 5", True),
        ("[2, 5)", "2 < x \\le 5", False),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", False),
        (
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            True,
        ),
        ("C", "\\textbf{(C)}\\ 12", True),
        ("\\sin 30^\\circ", "\\frac{1}{2}", True),
        ("\\cos \\frac{\\pi}{3}", "0.5", True),
    ],
    # Written and graded after the checker's last change, then scored once and not used to change it:
    # a check on how far the figures above are fitted to the classes the checker was built for.
    "held_out": [
        ("\\frac{\\sqrt{6}}{3}", "\\frac{2}{\\sqrt{6}}", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(\\frac{\\pi}{2}, 3)", False),
        ("-\\frac{1}{2}", "-0.5", True),
        ("-\\frac{1}{2}", "\\frac{1}{-2}", True),
        ("4\\sqrt{2}", "\\sqrt{32}", True),
        ("4\\sqrt{2}", "5.656854", True),
        ("\\$1.50", "1.5", True),
        ("\\$1.50", "\\$1.05", False),
        ("x^2 - 4x + 4", "(x-2)^2", True),
        ("x^2 - 4x + 4", "(x+2)^2", False),
        ("\\text{(E)}", "\\textbf{(E)}", True),
        ("\\text{(E)}", "E", True),
        ("\\{-1, 3\\}", "x = -1, x = 3", True),
        ("\\{-1, 3\\}", "x = -1", False),
        ("-1, 3", "x \\in \\{-1, 3\\}", True),
        ("(-\\infty, -2) \\cup (2, \\infty)", "(-\\infty,-2)\\cup(2,\\infty)", True),
        ("(-\\infty, -2) \\cup (2, \\infty)", "x < -2 \\text{ or } x > 2", True),
        ("\\frac{1}{4}", "25\\%", True),
        ("0.2", "20\\%", True),
        ("\\frac{3\\sqrt{3}}{2}", "\\frac{3}{2}\\sqrt{3}", True),
        ("2^{10}", "1024", True),
        ("\\binom{10}{3}", "120", True),
        ("\\binom{10}{3}", "\\frac{10!}{3!7!}", True),
        ("6!", "720", True),
        ("2.5", "\\frac{5}{2}", True),
        ("2.5", "2\\frac12", True),
        ("12\\sqrt{3}", "20.78", False),
        ("12\\sqrt{3}", "20.7846097", True),
        ("\\frac{9}{4}", "9/4", True),
        ("\\frac{9}{4}", "2.25", True),
        ("\\frac{9}{4}", "9:4", True),
        ("3", "\\text{3 feet}", True),
        ("10", "10\\text{ cm}^3", True),
        ("\\sqrt{5}", "5^{1/2}", True),
        ("\\sqrt{5}", "5^{\\frac{1}{2}}", True),
        ("y = -2x + 7", "y=7-2x", True),
        ("y = -2x + 7", "2x + y = 7", True),
        ("1.5 \\times 10^{-4}", "0.00015", True),
        ("1.5 \\times 10^{-4}", "1.5e-4", True),
        ("5\\%", "0.05", True),
        ("\\frac{1}{6}", "0.1\\overline{6}", True),
        ("a = 2, b = -3", "b = -3, a = 2", True),
        ("a = 2, b = -3", "(2, -3)", True),
        ("\\text{No}", "no", True),
        ("\\log_3 81", "4", True),
        ("\\ln 8", "3\\ln 2", True),
        ("\\tan 45^\\circ", "1", True),
        ("\\cos^2 x", "1 - \\sin^2 x", True),
        ("\\frac{1}{\\sqrt{2}}", "0.7071068", True),
        ("\\frac{1}{\\sqrt{2}}", "0.7071", False),
        ("-3", "x=-3", True),
        ("\\{1, 2, 3\\}", "\\{1, 2\\} \\cup \\{3\\}", True),
        ("100", "10^2", True),
        ("\\frac{2}{3}", "\\dfrac{4}{6}", True),
        ("3\\frac{1}{3}", "\\frac{10}{3}", True),
        ("\\frac{2}{3}", "\\frac{3}{2}", False),
        ("7", "\\sqrt{49}", True),
        ("7", "\\sqrt{48}", False),
    ],
}

# Integer golds as in DAPO-Math-17k (its answers are integers by construction).
_INTEGER_STYLES = [
    ("{g}", True),
    ("${g}$", True),
    ("{g}.", True),
    ("{g}.0", True),
    ("{g} \\text{{ ways}}", True),
    ("{wrong}", False),
    ("${wrong}$", False),
    ("{g}{digit}", False),
]


def _integer_pairs(rng: random.Random, count: int) -> list[tuple[str, str, bool]]:
    pairs = []
    for k in range(count):
        g = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(10_000, 2_000_000)])
        wrong = g + rng.choice([-1, 1, 2, -10, 100]) if g > 20 else g + rng.randint(1, 5)
        style, correct = _INTEGER_STYLES[k % len(_INTEGER_STYLES)]
        digit = rng.randint(1, 9)
        pairs.append((str(g), style.format(g=g, wrong=wrong, digit=digit), correct))
    # Thousands separators both ways, and a leading zero or sign.
    pairs += [
        ("1000", "1,000", True),
        ("1234567", "1,234,567", True),
        ("1234567", "1,234,576", False),
        ("2016", "2{,}016", True),
        ("-7", "-7", True),
        ("-7", "7", False),
        ("0", "0", True),
        ("100", "10", False),
    ]
    return pairs


CLASSES: tuple[str, ...] = ("integer", *_HAND)


def build_corpus(seed: int = 0, integers: int = 160) -> list[Pair]:
    """The graded corpus: ``integers`` DAPO-style integer pairs plus every hand-written class, each
    answer in both response styles (``Answer:`` line and ``\\boxed{}``) for the hand-written ones."""
    rng = random.Random(seed)
    rows: list[Pair] = []
    for k, (gold, answer, correct) in enumerate(_integer_pairs(rng, integers)):
        rows.append(Pair("integer", gold, _respond(answer, k, styles=3), correct))
    for cls, cases in _HAND.items():
        for k, (gold, answer, correct) in enumerate(cases):
            rows.append(Pair(cls, gold, _respond(answer, k), correct))
            # The other response style for every other case keeps the corpus a few hundred pairs.
            if k % 2 == 0:
                rows.append(Pair(cls, gold, _respond(answer, k + 1), correct))
    return rows


if __name__ == "__main__":
    corpus = build_corpus()
    counts = Counter(p.cls for p in corpus)
    print(f"{len(corpus)} pairs, {sum(p.correct for p in corpus)} graded correct")
    for cls in CLASSES:
        print(f"  {cls:20} {counts[cls]}")
