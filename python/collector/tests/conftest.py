import os
import sys

# The examples are imported by the tests as modules.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
