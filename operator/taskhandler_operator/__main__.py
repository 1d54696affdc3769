import sys

from taskhandler_operator.cli import main

sys.exit(main())
