"""Names (a tensor's, a node's) written into the Hydra overrides calibrun offers (a recommendation's `change`, the
repair's overrides), so that the override, typed as it is printed, reads back as those names. Hydra's grammar
(hydra/grammar/OverrideLexer.g4): ASCII letters, digits and `_-/+.$%*@?|` stand unquoted; `\\()[]{}:=,`, space and
tab stand unquoted behind a backslash; anything else needs a quoted value, which a list element may be and a dict
key may not (such a key cannot be written). `${` starts an interpolation, quoted or not: no model's name seen holds it.
"""

from __future__ import annotations

import re

ESCAPED = frozenset("\\()[]{}:=, \t")  # Hydra's ESC rule: these stand unquoted behind a backslash
UNQUOTED = frozenset("_-/+.$%*@?|")  # Hydra's UNQUOTED_CHAR, besides ASCII letters and digits
_OTHER_TYPE = re.compile(r"[+-]?(\d[\d_]*(\.[\d_]*)?([eE][+-]?\d+)?|\.\d[\d_]*([eE][+-]?\d+)?|inf|nan)|true|false|null",
                         re.IGNORECASE)  # what Hydra reads as an int, a float, a bool or null


def escaped(name: str) -> str:
    """`name` unquoted, Hydra's escapable characters behind a backslash (a dict key's only form)."""
    return "".join(f"\\{c}" if c in ESCAPED else c for c in name)


def bare(name: str) -> bool:
    """Whether `name` can stand unquoted (escaped) and read back as this string."""
    return bool(name) and all((c.isascii() and c.isalnum()) or c in UNQUOTED or c in ESCAPED for c in name) \
        and _OTHER_TYPE.fullmatch(name) is None


def list_item(name: str) -> str:
    """`name` as an element of an override's list: unquoted where it can be (`escaped`), else single-quoted, a quote
    and the backslashes before a quote or the end doubled as Hydra un-escapes them (tf2onnx's node names hold `;`:
    basic-pitch's `model_1/cq_t2010v2_1/conv1d_25;model_1/...`)."""
    if bare(name):
        return escaped(name)
    quoted = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), name)
    return f"'{quoted}'"
