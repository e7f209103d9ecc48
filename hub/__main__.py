import sys

from hub.course_hub import main

sys.exit(main())
