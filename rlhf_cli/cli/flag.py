"""What every boolean flag shares: it takes no value, so its help shows none.

Typer 0.29 writes `<bool>` after a flag in `--help`, which reads as if the flag took a value; an empty metavar
(Typer's public `metavar=`) leaves the column blank.
"""

NO_VALUE = ""
