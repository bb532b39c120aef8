"""`python -m calibrun.model OUT.onnx`: write the lab model."""

import sys

from calibrun.model.lab import main

sys.exit(main())
