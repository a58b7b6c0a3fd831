import sys

from scenarios.cli import main

sys.exit(main())
