import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # composition_helpers (pytest may run with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases
