"""calibrun's Hydra configs. This folder ships inside the installed package as `calibrun.conf`
(pyproject.toml: package-dir), read by Hydra as `pkg://calibrun.conf`."""
