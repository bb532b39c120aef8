"""What a config may execute: Hydra instantiates every `hydra.callbacks` entry (`_target_` is any importable
callable, called with the entry's other keys) before the run starts, and configs come from presets and
`--config-dir` files as well as the command line. calibrun runs the callbacks it knows (its own and Hydra's) and
refuses any other before it is instantiated, unless the user names it in $CALIBRUN_ALLOW_CALLBACKS
(docs/reliability.md, "What a config can execute")."""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from calibrun.errors import CalibrunError

ALLOW_ENV = "CALIBRUN_ALLOW_CALLBACKS"
KNOWN = frozenset({
    "calibrun.sweep.SweepCallback",
    "calibrun.analysis.search.SearchCallback",
    "hydra.experimental.callbacks.LogJobReturnCallback",
    "hydra.experimental.callbacks.PickleJobInfoCallback",
})


def allowed() -> frozenset[str] | None:
    """The targets the user allowed in $CALIBRUN_ALLOW_CALLBACKS (comma or colon separated); None: `*`, any."""
    names = {n.strip() for n in os.environ.get(ALLOW_ENV, "").replace(":", ",").split(",") if n.strip()}
    return None if "*" in names else frozenset(names)


def check_callbacks(config: DictConfig | None) -> None:
    """Refuse a `hydra.callbacks` entry whose target calibrun does not know and the user did not allow."""
    callbacks = OmegaConf.select(config, "hydra.callbacks", default=None) if config is not None else None
    if not callbacks:
        return
    extra = allowed()
    for name, params in callbacks.items():
        target = OmegaConf.select(params, "_target_", default=None) if isinstance(params, DictConfig) else None
        if target in KNOWN or (extra is None and target is not None) or (extra and target in extra):
            continue
        raise CalibrunError(f"hydra.callbacks.{name}: {target!r} is not a callback calibrun knows, and a config "
                            f"can run any code through one; to run it, allow it: {ALLOW_ENV}={target}")


def guard_callbacks() -> None:
    """Check the callbacks where Hydra instantiates them (hydra._internal.callbacks.Callbacks, for a run and a
    sweep), before any is instantiated: a refused one is one line on stderr and exit status 1."""
    try:
        from hydra._internal.callbacks import Callbacks
    except ImportError:  # another Hydra: nothing to guard with
        return
    original = Callbacks.__init__
    if getattr(original, "calibrun_guard", False):
        return

    def init(self, config=None, *args, **kwargs):
        try:
            check_callbacks(config)
        except CalibrunError as exc:
            print(f"calibrun: error: {exc}", file=sys.stderr)
            sys.exit(1)
        original(self, config, *args, **kwargs)

    init.calibrun_guard = True
    Callbacks.__init__ = init
