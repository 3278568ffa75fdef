import os
import sys

# Tests import small shared helpers (engine_models) from this folder.
sys.path.insert(0, os.path.dirname(__file__))
