import sys

from rlhf_cli.cli.app import main

sys.exit(main())
