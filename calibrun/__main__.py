"""`python -m calibrun` and the `calibrun` command: the Hydra app. Config groups in conf/ (shipped inside the
installed package as calibrun.conf) drive calibrun.runner.main."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import shlex
import sys
from importlib import resources
from pathlib import Path

from calibrun.core import interrupts

if __name__ == "__main__" or Path(sys.argv[0]).name == "calibrun":  # the program (python -m, or the command)
    interrupts.while_starting()  # a Ctrl-C during the imports below: one line, not a traceback

from calibrun.tracking import dispose_stores, writer  # noqa: E402

if __name__ == "__main__":  # first: MLflow's import runs in the writer while Hydra is imported here
    writer.start(sys.argv[1:])

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from calibrun import runner  # noqa: E402
from calibrun.config import register  # noqa: E402
from calibrun.core import patches  # noqa: E402
from calibrun.core.trust import check_callbacks  # noqa: E402
from calibrun.sweep import report_full_disk  # noqa: E402

register()

CONFIG_PACKAGE = "calibrun.conf"


@hydra.main(version_base=None, config_path=f"pkg://{CONFIG_PACKAGE}", config_name="config")
def _app(cfg: DictConfig):
    return runner.main(cfg)


def preset_sweep(name: str) -> list[str] | None:
    """The keys an experiment preset sweeps (its hydra.sweeper.params), or None when it sweeps nothing or there is
    no such preset (Hydra then names the missing option)."""
    import yaml

    try:
        text = resources.files(CONFIG_PACKAGE).joinpath("experiment", f"{name}.yaml").read_text()
        params = ((yaml.safe_load(text) or {}).get("hydra") or {}).get("sweeper", {}).get("params")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return list(params) if isinstance(params, dict) and params else None


def check_preset_mode(argv: list[str]) -> str | None:
    """A preset that is a sweep needs -m: the one line that says so, or None."""
    if "-m" in argv or "--multirun" in argv or writer.SHOW_FLAGS & set(argv) or any(a.startswith("hydra.mode=")
                                                                               for a in argv):
        return None
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "experiment" and value not in ("", "null"):
            axes = preset_sweep(value)
            if axes:
                return (f"experiment={value} is a sweep (over {', '.join(axes)}): add -m, as in "
                        f"python -m calibrun -m experiment={value}")
    return None


def check_keys(argv: list[str]) -> str | None:
    """An override whose key is not a calibrun setting: the one line naming it and the closest valid keys, or None.

    Hydra's own error for `batchs=3` advises `+batchs=3`, which only leads into calibrun's refusal of a key that is
    not a setting: the mistake is named here, before Hydra composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from calibrun.config import is_setting, unknown_key_message

    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception:  # noqa: BLE001 (Hydra's OverrideParseException, on several lines): named here in one
        return unreadable(parser, overrides)
    for override in parsed:
        key = override.key_or_group
        if override.package or "/" in key:  # `group@package=...`, `hydra/launcher=...`: Hydra's to judge
            continue
        if not is_setting(key):
            return unknown_key_message(key)
    return None


def _parses(parser, override: str) -> bool:
    try:
        parser.parse_overrides([override])
    except Exception:  # noqa: BLE001 (OverrideParseException)
        return False
    return True


def unreadable(parser, overrides: list[str]) -> str | None:
    """The one line for the first override Hydra's grammar cannot read: it, Hydra's reason, and for an input's key
    with a character a key cannot hold, the key to write instead (calibrun.data.inputs.spelled)."""
    from calibrun.config import is_input_key
    from calibrun.data.inputs import spelled

    for arg in overrides:
        try:
            parser.parse_overrides([arg])
        except Exception as exc:  # noqa: BLE001 (OverrideParseException)
            lines = [line.strip() for line in str(exc).splitlines() if line.strip(" ^")]  # not the caret's line
            reason = "; ".join(line for line in lines if not line.startswith(("See https://", "Error parsing")))
            key, _, value = arg.lstrip("+~").partition("=")
            if is_input_key(key):  # normalise's `++`, not the user's
                arg = arg.lstrip("+")
            hint = ""
            same = [a.lstrip("+~").partition("=")[2] for a in overrides if a.lstrip("+~").partition("=")[0] == key]
            if len(same) > 1:  # bash's brace expansion: `k={a:[0,1],b:[2,3]}` unquoted is k=a:[0 k=1] k=b:[2 k=3]
                whole = shlex.quote(f"{key}={{{','.join(same)}}}")
                hint = (f"; {key} is given {len(same)} times, as a shell's brace expansion makes of one {{...,...}} "
                        f"value: quote the override whole, as calibrun prints its recommendations: {whole}")
            elif is_input_key(key) and spelled(key) != key:
                hint = f"; an input name's characters a key cannot hold are written as _: {spelled(key)}={value}"
            elif value and "'" not in value and _parses(parser, f"{arg.partition('=')[0]}='{value}'"):
                # a path with a space or a letter outside ASCII: Hydra reads it quoted
                hint = f"; quoted, it reads: {arg.partition('=')[0]}='{value}' (on a shell, quote it all once more)"
            reason = reason or "not in Hydra's override grammar"
            return (f"cannot read the override {arg!r}: {reason} (Hydra's grammar: "
                    f"https://hydra.cc/docs/advanced/override_grammar/basic/){hint}")
    return None


def normalise(argv: list[str]) -> list[str]:
    """`+experiment=NAME` (the form before `experiment` had a default) means `experiment=NAME`: Hydra refuses to
    add a group that the defaults list already holds. `data.inputs.<name>.value=...` (an input name is no key of
    the schema) is `++data.inputs.<name>.value=...`: set, whether a yaml already set it or not."""
    from calibrun.config import is_input_key

    out = []
    for arg in argv:
        if arg.startswith("+experiment="):
            arg = arg[1:]
        elif "=" in arg and is_input_key(arg.split("=", 1)[0].lstrip("+")):
            arg = "++" + arg.lstrip("+")
        out.append(arg)
    return out


def _quick_exit() -> None:
    """At exit, after every other exit handler (registered first, so it runs last): close MLflow's pooled SQLite
    connections (the write-ahead log is checkpointed into the database as before), then freeze the garbage
    collector. The interpreter's teardown otherwise walks every object of the imported libraries (MLflow,
    SQLAlchemy, matplotlib, ...) in repeated gc passes: 3-4 s of a 30 s lab sweep here, for memory the OS takes
    back anyway. Finalizers and exit handlers still run; only the cycle collector's final passes are skipped."""
    dispose_stores()
    gc.freeze()


class _StderrWhilePiped:
    """sys.stderr that stops writing once its reader is gone (`calibrun ... 2>&1 | head -2`): a progress line or
    the last link line had raised BrokenPipeError inside the job, which failed it and its run, for output nobody
    reads. Everything else is the stream's own."""

    def __init__(self, stream):
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main() -> None:
    sys.stderr = _StderrWhilePiped(sys.stderr)
    writer.start(sys.argv[1:])  # (the `calibrun` command: the module was imported, not run)
    atexit.register(_quick_exit)
    patches.compose_once()
    sys.argv[1:] = normalise(sys.argv[1:])
    problem = check_preset_mode(sys.argv[1:]) or check_keys(sys.argv[1:])
    if problem is not None:
        print(f"calibrun: error: {problem}", file=sys.stderr)
        sys.exit(1)
    patches.compose_faster()
    patches.yaml_in_c()
    logging.raiseExceptions = False  # a handler that cannot write (a full disk) prints no traceback per record
    # joblib's loky resource tracker, a process of its own, warns of "leaked semlock objects" when an interrupted
    # sweep ends its workers: two lines after the interrupt's one, about joblib's bookkeeping (its child processes
    # read this; a user's own PYTHONWARNINGS follows, and its later filters win)
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (
        "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker", os.environ.get("PYTHONWARNINGS"))))
    patches.guard_callbacks(check_callbacks)
    patches.on_full_disk(report_full_disk)
    patches.one_line_errors()
    _app()


if __name__ == "__main__":
    main()
