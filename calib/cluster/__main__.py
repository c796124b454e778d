import sys

from calib.cluster import main

sys.exit(main())
