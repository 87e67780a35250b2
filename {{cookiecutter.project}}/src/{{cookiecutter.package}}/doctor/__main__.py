import sys

from ..core.errors import run_cli
from . import main

run_cli(main, sys.argv[1:])
