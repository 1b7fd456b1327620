"""``python -m conformance``: see :mod:`conformance.run`."""

from conformance.run import main

raise SystemExit(main())
