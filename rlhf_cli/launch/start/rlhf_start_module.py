"""`python rlhf_start_module.py MODULE ARGS...`: runs MODULE as `python -m MODULE ARGS...` would, but with the
working directory last on the import path instead of first (rlhf_cli/launch/module_start.py says why). A script's
own folder goes first on the import path: this one holds nothing else, and is taken off before anything imports."""

import os
import sys

sys.path[0:1] = []  # this script's folder
sys.path.append(os.getcwd())  # after the standard library and the installed packages: it only adds modules
module = sys.argv.pop(1)

import runpy  # noqa: E402  (after the import path is set: a runpy.py in the working directory is not this one)

runpy.run_module(module, run_name="__main__", alter_sys=True)
