"""`spec.engine.resources`: Kubernetes resource quantities, as the API server reads them.

The grammar is apimachinery's `resource.ParseQuantity`: an optional sign, a decimal number (`1`, `1.5`, `.5`,
`1.`), then nothing, a decimal SI suffix (`n u m k M G T P E`), a binary one (`Ki Mi Gi Ti Pi Ei`) or an
exponent (`e3`, `E-2`). A value the API server would not read as a positive quantity makes the StatefulSet
that carries it invalid, so the API refuses it first; the CEL rule (the quantity library's `isQuantity`) and
this module say the same, and the admission differential (e2e/test_admission_differential.py) holds them to
each other.
"""

from __future__ import annotations

import re
from decimal import Decimal

MAX_LENGTH = 64  # characters of the string form
_RE = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")
HINT = "use a positive Kubernetes quantity such as 32, 500m, 256Gi or 1.5e3"


def check(value: int | str) -> None:
    """Raises ValueError (with the fix) unless `value` is a positive quantity."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity: {HINT}")
    n = amount(value)
    if n is None:
        raise ValueError(f"{str(value)[:40]!r} is not a Kubernetes quantity: {HINT}")
    if n <= 0:
        raise ValueError(f"{value!r} is not positive: {HINT}")


_SCALE = {"": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
          "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
          **{s: Decimal(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)}}


def amount(q: object) -> Decimal | None:
    """The amount a quantity stands for (`1Ti` and `1024Gi`, `1500m` and `1.5` are equal); None when `q` is not
    one. The API server stores a quantity in its canonical spelling, so what was written is compared by this."""
    if isinstance(q, bool) or not isinstance(q, (int, str)):
        return None
    if isinstance(q, int):
        return Decimal(q)
    m = _RE.fullmatch(q) if 0 < len(q) <= MAX_LENGTH else None
    if m is None or not (m.group(2) or m.group(3)):
        return None
    sign, whole, frac, suffix = m.groups()
    number = Decimal(f"{sign}{whole or 0}.{frac or 0}")
    if suffix and suffix[0] in "eE" and len(suffix) > 1:
        return number.scaleb(int(suffix[1:]))
    return number * _SCALE[suffix or ""]


# Whole cores as digits only: the API server's quantity(x).isInteger() is false for 2000m and 2.0 (their
# parsed form keeps a negative scale) and true for 1k and 1Ki, which no one means for a router's cores; one
# plain grammar both sides state exactly is harder to get wrong than a copy of apimachinery's parser.
WHOLE_RE = "^[0-9]+$"
WHOLE_HINT = "a whole number of cores written as digits, e.g. 2"


def is_whole(value: int | str) -> bool:
    """Whether `value` is a whole number of cores written as digits (WHOLE_RE), as the CRD's rule reads it."""
    if isinstance(value, int):
        return not isinstance(value, bool)
    return re.fullmatch(WHOLE_RE, value) is not None


def cel_rules() -> list[dict[str, str]]:
    """The same for the API server (x-kubernetes-validations of the int-or-string field)."""
    return [
        {
            "rule": f"type(self) == int ? self > 0 : (size(self) <= {MAX_LENGTH} && isQuantity(self) && "
            "quantity(self).isGreaterThan(quantity('0')))",
            "message": f"must be a positive quantity of at most {MAX_LENGTH} characters: {HINT}",
        }
    ]


QUANTITY_JSON_SCHEMA = {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": cel_rules()}
