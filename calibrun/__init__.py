"""calibrun: what did my calibration data do to my INT8 model?"""

from calibrun.core.errors import CalibrunError

__all__ = ["CalibrunError"]
