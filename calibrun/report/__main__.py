"""`python -m calibrun.report SWEEP_DIR`: rebuild a sweep's report files (calibrun.report.aggregate)."""

import sys

from calibrun.report.aggregate import main

if __name__ == "__main__":
    sys.exit(main())
