"""`python -m gym_failures.cli`, the same as the `gym-failures` console script."""

from gym_failures.cli import main

raise SystemExit(main())
