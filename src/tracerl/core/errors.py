"""The one error type for bad user input; the CLI turns it into one line and exit code 2."""


class InputError(Exception):
    """Bad input from the user: a file, a config value, a flag.

    The message is one line saying where (file and line when there is one) and what is wrong.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
