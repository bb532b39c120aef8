"""`python -m calibrun`: the Hydra app. Config groups in conf/ drive calibrun.runner.main."""

import hydra
from omegaconf import DictConfig

from calibrun import runner
from calibrun.config import register

register()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig):
    return runner.main(cfg)


if __name__ == "__main__":
    main()
