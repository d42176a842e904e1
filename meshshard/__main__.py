import sys

from meshshard.cli import main

sys.exit(main())
