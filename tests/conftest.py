"""tests/ mirrors the package (tests/wire, tests/weights, ...); the helpers beside this file
(builders, netutil, faultutil, benchload, scripted) are importable from every folder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
