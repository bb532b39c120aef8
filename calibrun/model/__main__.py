"""`python -m calibrun.model OUT.onnx`: write the lab model."""

import sys

from calibrun.lab.model import main

sys.exit(main())
