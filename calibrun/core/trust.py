"""What a config may execute: Hydra instantiates every `hydra.callbacks` entry (`_target_` is any importable
callable, called with the entry's other keys) before the run starts, and configs come from presets and
`--config-dir` files as well as the command line. calibrun runs the callbacks it knows (its own and Hydra's) and
refuses any other before it is instantiated, unless the user names it in $CALIBRUN_ALLOW_CALLBACKS
(docs/reliability.md, "What a config can execute")."""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from calibrun.core.errors import CalibrunError

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
