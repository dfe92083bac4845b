"""``calculator``: arithmetic on a Python-syntax expression, evaluated by walking its ``ast``.

Why a tree walk rather than ``eval``: the model writes the expression, so nothing may reach names,
attributes, calls or imports beyond a fixed table of math functions. Why size limits: ``10**10**10``
is valid arithmetic that would hang a worker for hours and exhaust its memory, so powers,
products and shifts are checked *before* they are computed, against a bound on the result's bits.
Integer arithmetic is exact (big ints are fine up to the bound); ``/`` gives an int when the division
is exact, otherwise a float.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Any, Callable

from rlweave.agents.tools.base import Tool, ToolError, ToolSpec, register_tool

MAX_EXPRESSION_CHARS = 2000
MAX_NODES = 400
MAX_INT_BITS = 13_000  # ~3900 decimal digits: under Python's 4300-digit int->str limit

Number = int | float

_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs, "round": round, "min": min, "max": max,
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log2": math.log2, "log10": math.log10,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "floor": math.floor, "ceil": math.ceil, "factorial": math.factorial, "gcd": math.gcd,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def _bits(x: Number) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


def _check_int(x: Number) -> Number:
    """Refuses results past the integer bound, and floats that overflowed (inf) or became nan."""
    if isinstance(x, int) and _bits(x) > MAX_INT_BITS:
        raise ToolError(f"result too large (over {MAX_INT_BITS} bits)")
    if isinstance(x, float) and not math.isfinite(x):
        raise ToolError("result is not a finite number (float overflow)")
    return x


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    if isinstance(a, int) and isinstance(b, int):
        if a % b == 0:
            return a // b
        return float(Fraction(a, b))  # exact rounding even when a and b exceed float range
    return a / b


def _pow(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        if math.log2(abs(a)) * b > MAX_INT_BITS:
            raise ToolError(f"result too large: {a}**{b} has over {MAX_INT_BITS} bits")
    if a == 0 and b < 0:
        raise ToolError("division by zero (0 to a negative power)")
    out = a ** b
    if isinstance(out, complex):
        raise ToolError("result is not a real number")
    return out


def _mul(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and _bits(a) + _bits(b) > MAX_INT_BITS + 1:
        raise ToolError(f"result too large (over {MAX_INT_BITS} bits)")
    return a * b


def _factorial(n: Number) -> Number:
    if not isinstance(n, int) or n < 0:
        raise ToolError("factorial takes a non-negative integer")
    if n > 1500:  # 1500! has ~12,900 bits
        raise ToolError("factorial argument too large (max 1500)")
    return math.factorial(n)


_BINOPS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: _div, ast.Pow: _pow,
    ast.FloorDiv: lambda a, b: operator.floordiv(a, b) if b != 0 else _div(a, b),
    ast.Mod: lambda a, b: operator.mod(a, b) if b != 0 else _div(a, b),
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> Number:
    """Evaluates an arithmetic expression; raises :class:`ToolError` with a one-line reason otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long ({len(expression)} characters, max {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not a valid expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"expression too complex (over {MAX_NODES} syntax nodes)")
    try:
        return _check_int(_eval(tree.body))
    except ToolError:
        raise
    except (OverflowError, ValueError, ZeroDivisionError, TypeError) as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from None


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _check_int(_BINOPS[type(node.op)](_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))  # type: ignore[arg-type]
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        fn = _factorial if node.func.id == "factorial" else _FUNCTIONS[node.func.id]
        return _check_int(fn(*[_eval(a) for a in node.args]))
    allowed = ", ".join(sorted(_FUNCTIONS) + sorted(_CONSTANTS))
    raise ToolError(f"unsupported syntax '{ast.unparse(node)[:60]}': use numbers, + - * / // % **, parentheses and {allowed}")


def format_number(x: Number) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x)


class Calculator(Tool):
    """Evaluates arithmetic exactly where it can (see the module docstring)."""

    spec = ToolSpec(
        name="calculator",
        description="Evaluate an arithmetic expression, e.g. '(3 + 4) * 2 ** 10 / 7' or 'sqrt(2) * pi'. "
                    "Integers are exact. Supports + - * / // % **, parentheses and common math functions.",
        parameters={"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
                    "required": ["expression"], "additionalProperties": False},
    )

    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = float(timeout_s)

    async def run(self, arguments: dict[str, Any]) -> str:
        return format_number(evaluate(arguments["expression"]))


@register_tool("calculator")
def make_calculator(**options: Any) -> Tool:
    return Calculator(**options)
