"""``python -m steps.tasks --check --data DIR [--task NAME] [--config FILE]``: see steps/tasks/check.py."""
import sys

from steps.tasks.check import main

sys.exit(main())
