import sys

from vsup.cli import main

sys.exit(main())
