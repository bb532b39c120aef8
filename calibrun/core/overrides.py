"""Names (a tensor's, a node's) written into the Hydra overrides calibrun offers (a recommendation's `change`, the
repair's overrides), so that the override, typed as it is printed, reads back as those names. Hydra's grammar
(hydra/grammar/OverrideLexer.g4): ASCII letters, digits and `_-/+.$%*@?|` stand unquoted; `\\()[]{}:=,`, space and
tab stand unquoted behind a backslash; anything else needs a quoted value, which a list element may be and a dict
key may not: there it is written as a %XX escape that calibrun decodes (`dict_key`, `key_name`). `${` starts an
interpolation, quoted or not: no model's name seen holds it.
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


def dict_key(name: str) -> str:
    """`name` as a key of an override's dict, which Hydra's grammar cannot quote: escaped where it can be (`escaped`),
    and a character it has no place for, a `%` included, as a %XX escape of its UTF-8 bytes, which `key_name` reads
    back (tf2onnx and tflite2onnx name tensors `a/b;c/d`: a recommended `quant.tensor_ranges={a/b;c/d:[...]}` could
    not be typed back)."""
    def one(c: str) -> str:
        if (c.isascii() and c.isalnum()) or (c in UNQUOTED and c != "%"):
            return c
        if c in ESCAPED:
            return "\\" + c
        return "".join(f"%{b:02X}" for b in c.encode())

    key = "".join(one(c) for c in name)
    if _OTHER_TYPE.fullmatch(name) and not re.fullmatch(r"-?[1-9]\d*|0", name):  # Hydra would read a float, a
        # bool or null, or an int whose str() is another name (1_000): its first character escaped, a string
        key = f"%{ord(name[0]):02X}{key[1:]}"
    return key


def key_name(key) -> str:
    """A tensor name from an override's dict key (`dict_key`): its %XX escapes decoded; a key Hydra read as a number
    (a tensor named 142, as older PyTorch exports name them) as its digits."""
    from urllib.parse import unquote

    text = str(key)
    return unquote(text) if "%" in text else text


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
