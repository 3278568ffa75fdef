import sys

from sbs_widget.cli.main import main

sys.exit(main())
