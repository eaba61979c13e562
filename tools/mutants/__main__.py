import sys

from tools.mutants.run import main

sys.exit(main())
